"""Train and test the presets in ``configs/``, one after the other: the rows of
the presets table in benchmarks/RESULTS.md.

For each preset: ``attnmt train configs/NAME.yaml --output RUNS/NAME`` (resumed with ``--resume``
where a run was interrupted, skipped where it is done), then ``attnmt evaluate`` on
test_2016_flickr of the preset's direction (sacreBLEU cased, detokenized; BLEU on word tokens
too for word-level presets) with the preset's own decoding settings, and for word-level presets
``attnmt score`` for the test perplexity (per target word, EOS included, as the word-level
tutorial reports it). ``prenorm_frozen_de_en`` first trains its word vectors (``attnmt
train-vectors``, gensim FastText on the training corpus) where ``vectors/`` lacks them.

Appends one JSON line per preset to ``RUNS/results.jsonl`` and prints a Markdown row per preset
(preset, direction, machine, minutes, BLEU, chrF). Run presets one at a time on an
otherwise idle machine: the budgets are wall-clock minutes.

Usage (from the repository root):
    .venv/bin/python benchmarks/presets.py --presets tutorial_word_de_en,multi30k_en_de
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from setting import cpu_fields, cpu_name  # benchmarks/setting.py (this script's folder is on sys.path)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALL = ("multi30k_de_en", "multi30k_en_de", "multi30k_en_fr", "tutorial_word_de_en", "prenorm_frozen_de_en",
       "spm_base_fr_en", "paper_base_de_en")


def machine() -> str:
    """CPU model (name, family and model number), core count and whether it has bfloat16 kernels."""
    fields = cpu_fields()
    flags = fields.get("flags", "").split()
    simd = "AVX-512 BF16" if "avx512_bf16" in flags or "amx_bf16" in flags else "AVX2 only" if "avx2" in flags \
        else "no AVX2"
    return f"{os.cpu_count()}-core {cpu_name(fields)}, {simd}"


def attnmt(*args: str, capture: bool = False) -> str:
    cmd = [sys.executable, "-m", "attnmt", "-q", *args]
    print("$ attnmt " + " ".join(args), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): attnmt {' '.join(args)}")
    return p.stdout or ""


def records(run: Path) -> list[dict]:
    log = run / "train_log.jsonl"
    return [json.loads(ln) for ln in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def run_preset(name: str, runs: Path, data: Path) -> dict:
    """Train (or resume) and test one preset; its record."""
    from attnmt.config import load_config

    config = load_config(ROOT / "configs" / f"{name}.yaml")
    src, tgt = config.data.pair.split("-")
    mc = config.model
    for side, path in (("src", mc.src_vectors), ("tgt", mc.tgt_vectors)):
        if path and not (ROOT / path).exists():
            attnmt("train-vectors", f"configs/{name}.yaml", "--side", side, "--output", path, "--data-dir", str(data))
    run = runs / name
    done = any(r["kind"] == "done" for r in records(run))
    if not done:
        resume = ["--resume"] if (run / "checkpoints" / "last.pt").exists() else []
        attnmt("train", f"configs/{name}.yaml", "--output", str(run), "--data-dir", str(data), *resume)
    final = next(r for r in reversed(records(run)) if r["kind"] == "done")
    test = data / "multi30k" / "test_2016_flickr"
    t0 = time.perf_counter()
    scores = json.loads(attnmt("evaluate", "--model", str(run), "--src", f"{test}.{src}.gz", "--ref",
                               f"{test}.{tgt}.gz", "--json", "--hyp-output", str(run / "test_2016_flickr.hyp"),
                               capture=True))
    rec = {"preset": name, "direction": f"{src}->{tgt}", "machine": machine(), "minutes": final["minutes"],
           "updates": final["steps"], "epochs": final["epochs_done"], "stop_reason": final["stop_reason"],
           "precision": final.get("precision"), "best_valid_bleu": final["best_valid_bleu"],
           "best_valid_ppl": final["best_valid_ppl"], "bleu": scores["bleu"], "chrf": scores["chrf"],
           "bleu_signature": scores["bleu_signature"], "evaluate_s": round(time.perf_counter() - t0, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if "bleu_tokenized" in scores:
        rec["bleu_tokenized"] = scores["bleu_tokenized"]
        corpus = json.loads(attnmt("score", "--model", str(run), "--src", f"{test}.{src}.gz", "--tgt",
                                   f"{test}.{tgt}.gz", "--format", "jsonl", capture=True).splitlines()[-1])
        rec["test_ppl"] = corpus["perplexity"]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=",".join(ALL), help="comma-separated preset names (configs/NAME.yaml)")
    ap.add_argument("--data-dir", type=Path, default=os.environ.get("ATTNMT_DATA"),
                    help="directory holding multi30k/ (default $ATTNMT_DATA)")
    ap.add_argument("--runs", type=Path, default=HERE / "work" / "presets")
    args = ap.parse_args()
    if args.data_dir is None:
        ap.error("name the directory holding multi30k/ with --data-dir or ATTNMT_DATA")
    args.runs.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.presets.split(","):
        rec = run_preset(name, args.runs.resolve(), args.data_dir.resolve())
        with open(args.runs / "results.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        extra = f"; word tokens {rec['bleu_tokenized']:.2f}, test ppl {rec['test_ppl']:.2f}" if "test_ppl" in rec else ""
        rows.append(f"| `{name}` | {rec['direction']} | {rec['machine']} | {rec['minutes']:.1f} | {rec['bleu']:.2f} | "
                    f"{rec['chrf']:.2f}{extra} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
