"""The fast de-en preset against the default one (issue 39's fast-preset figures), in one run.

Given the default preset's model directory and the fast preset's (``configs/multi30k_de_en.yaml``
and ``configs/multi30k_de_en_fast.yaml``, trained in the same budget on the same CPU):

- decoding settings: the default model with the default preset's (``--default-beam``,
  ``--default-alpha``, early stopping); the fast model with each beam size of ``--beams`` and each
  length penalty of ``--alphas`` scored on val (``attnmt evaluate --json``, early stopping), and
  the fastest setting whose val BLEU is within ``--tolerance`` of the best kept (smaller beams
  first, then the better BLEU);
- quality: sacreBLEU BLEU and chrF on test_2016_flickr de->en of both, each with its settings;
- speed: whole ``attnmt translate`` processes on test_2016_flickr repeated ``--repeat`` times
  (3,000 lines), batches of 128, one after another (``--rounds`` alternating rounds, fastest
  kept), and the ratio default / fast (the issue asks >= 2 at test BLEU >= the default's - 0.5).

Prints one JSON object per measurement and a final one with everything. Figures go to
RESULTS.md only from an otherwise idle machine, with its CPU named.

Usage (from the repository root):
    .venv/bin/python benchmarks/fast_preset.py --default runs/de-en --fast runs/de-en-fast --data "$ATTNMT_DATA"
A check at tiny size: ``--limit 20 --repeat 1 --rounds 1 --beams 1,2 --alphas 1.0``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from distill import _evaluate, _translate  # noqa: E402  (attnmt evaluate / translate as whole processes)


def _options(alpha: float) -> tuple[str, ...]:
    return ("--length-penalty", str(alpha), "--early-stopping", "true")


def _write(data: Path, split: str, lang: str, path: Path, limit: int | None, repeat: int = 1) -> None:
    lines = gzip.decompress((data / "multi30k" / f"{split}.{lang}.gz").read_bytes()).decode().splitlines()[:limit]
    path.write_text(("\n".join(lines) + "\n") * repeat, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default", required=True, type=Path, help="the default preset's model directory")
    parser.add_argument("--fast", required=True, type=Path, help="the fast preset's model directory")
    parser.add_argument("--data", required=True, type=Path, help="the directory holding multi30k/")
    parser.add_argument("--work", type=Path, default=HERE / "work" / "fast_preset")
    parser.add_argument("--default-beam", type=int, default=5)
    parser.add_argument("--default-alpha", type=float, default=1.8)
    parser.add_argument("--beams", default="1,2,3,5", help="the fast model's beam sizes tried on val")
    parser.add_argument("--alphas", default="1.0,1.4,1.8", help="the fast model's length penalties tried on val")
    parser.add_argument("--tolerance", type=float, default=0.3, help="val BLEU a smaller beam may lose")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=int, help="only the first N sentences of val and test")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    files = {name: args.work / name for name in ("val.de", "val.en", "test.de", "test.en", "test_x.de")}
    for split, short in (("val", "val"), ("test_2016_flickr", "test")):
        for lang in ("de", "en"):
            _write(args.data, split, lang, files[f"{short}.{lang}"], args.limit)
    _write(args.data, "test_2016_flickr", "de", files["test_x.de"], args.limit, args.repeat)

    result: dict = {"val": {}, "settings": {}, "test": {}, "speed": {}}
    for beam in map(int, args.beams.split(",")):
        for alpha in map(float, args.alphas.split(",")):
            key = f"beam {beam}, alpha {alpha}"
            result["val"][key] = _evaluate(args.fast, files["val.de"], files["val.en"], beam, _options(alpha))
            print(json.dumps({f"fast val {key}": result["val"][key]}), flush=True)
    best = max(v["bleu"] for v in result["val"].values())
    # The smallest beam within the tolerance, then its best length penalty.
    beam, alpha = min(((int(k.split(",")[0].split()[1]), -v["bleu"], float(k.split()[-1]))
                       for k, v in result["val"].items() if v["bleu"] >= best - args.tolerance))[::2]
    result["settings"] = {"default": {"beam": args.default_beam, "alpha": args.default_alpha},
                          "fast": {"beam": beam, "alpha": alpha}}
    models = {"default": args.default, "fast": args.fast}
    for name, model in models.items():
        s = result["settings"][name]
        result["test"][name] = _evaluate(model, files["test.de"], files["test.en"], s["beam"], _options(s["alpha"]))
        print(json.dumps({f"{name} test": result["test"][name], "settings": s}), flush=True)
    for _ in range(args.rounds):
        for name, model in models.items():
            s = result["settings"][name]
            process_s, decode_s = _translate(model, files["test_x.de"], args.work / "out.txt", s["beam"],
                                             options=_options(s["alpha"]))
            timing = {"process_s": round(process_s, 2), "decode_s": decode_s}
            if name not in result["speed"] or timing["process_s"] < result["speed"][name]["process_s"]:
                result["speed"][name] = timing
            print(json.dumps({f"{name} speed": timing}), flush=True)
    result["default / fast process s"] = round(result["speed"]["default"]["process_s"]
                                               / result["speed"]["fast"]["process_s"], 2)
    result["fast - default test BLEU"] = round(result["test"]["fast"]["bleu"] - result["test"]["default"]["bleu"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
