"""A distilled student against its teacher (issue 42's figures), in one run on one machine.

Given the teacher's model directory and the student's (``attnmt distill``), and optionally a
student of the same architecture trained on the original targets (``--baseline``):

- quality: sacreBLEU BLEU and chrF on test_2016_flickr de->en, the teacher with its own decode
  settings (beam 5), each student greedy and with beam 5 (``attnmt evaluate --json``);
- speed: whole ``attnmt translate`` processes on test_2016_flickr repeated ``--repeat`` times
  (3,000 lines), one after another (``--rounds`` alternating rounds, fastest kept): the
  teacher with beam 5 and the student greedy, natively and with the CTranslate2 engine on
  their int8 exports, the latter also with two batches at once (``--inter-threads 2 --threads
  1``: CTranslate2 with two replicas of one thread each); the ratio teacher beam 5 / student
  greedy under CTranslate2 int8 (the issue asks >= 4) for both thread settings, and the BLEU of
  each CTranslate2 row's output (its first pass over test2016);
- size: ``model.safetensors``, the CTranslate2 int8 ``model.bin``, and the int8 web export
  (``attnmt export web --quantization int8``): every file the page downloads, raw and
  gzip-compressed (what a static host that compresses sends).

Prints a Markdown table and one JSON object. Figures go to RESULTS.md only from an otherwise idle
machine, with its CPU named.

Usage (from the repository root):
    .venv/bin/python benchmarks/distill.py --teacher runs/de-en --student runs/de-en-student \\
        --data "$ATTNMT_DATA" [--baseline runs/de-en-student-original]
A check at tiny size: ``--limit 20 --repeat 1 --rounds 1``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

import sacrebleu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engines import _run  # noqa: E402  (wall seconds and output of a whole process; a failure ends the run)


def _attnmt(*args: str) -> tuple[float, str]:
    return _run([sys.executable, "-m", "attnmt", *args])


def _evaluate(model: Path, src: Path, ref: Path, beam: int, options: tuple[str, ...] = ()) -> dict:
    """BLEU and chrF of ``attnmt evaluate`` with beam size ``beam`` (``options``: more of its flags)."""
    _, out = _attnmt("evaluate", "--model", str(model), "--src", str(src), "--ref", str(ref), "--beam-size",
                     str(beam), "--json", *options)
    scores = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2)}


def _translate(model: Path, src: Path, out: Path, beam: int, engine: str = "native",
               options: tuple[str, ...] = ()) -> tuple[float, float]:
    """(process seconds, decode seconds) of one ``attnmt translate`` in batches of 128
    (``options``: more of its flags)."""
    cmd = ["translate", "--model", str(model), "--input", str(src), "--output", str(out), "--beam-size", str(beam),
           "--batch-size", "128", *options]
    if engine != "native":
        cmd += ["--engine", engine]
    process_s, log = _attnmt(*cmd)
    decode_s = float(re.search(r"translated \d+ lines in ([\d.]+) s", log).group(1))
    return process_s, decode_s


def _site_bytes(site: Path) -> tuple[int, int]:
    """Raw and gzip-compressed bytes of every file of an exported web page."""
    files = [p for p in site.rglob("*") if p.is_file()]
    return (sum(p.stat().st_size for p in files),
            sum(len(gzip.compress(p.read_bytes(), compresslevel=6)) for p in files))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, type=Path)
    parser.add_argument("--student", required=True, type=Path)
    parser.add_argument("--baseline", type=Path, help="the student's architecture trained on the original targets")
    parser.add_argument("--data", required=True, type=Path, help="the directory holding multi30k/")
    parser.add_argument("--work", type=Path, default=HERE / "work" / "distill")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    src, ref = (args.work / "test.de", args.work / "test.en")
    for path, lang in ((src, "de"), (ref, "en")):
        lines = gzip.decompress((args.data / "multi30k" / f"test_2016_flickr.{lang}.gz").read_bytes()).decode()
        path.write_text("\n".join(lines.splitlines()[:args.limit]) + "\n", encoding="utf-8")
    repeated = args.work / "test_x.de"
    repeated.write_text(src.read_text(encoding="utf-8") * args.repeat, encoding="utf-8")

    models = {"teacher": args.teacher, "student": args.student, **({"baseline": args.baseline} if args.baseline else {})}
    result: dict = {"quality": {}, "speed": {}, "size": {}}
    for name, model in models.items():
        for beam in ((5,) if name == "teacher" else (1, 5)):
            result["quality"][f"{name} beam {beam}"] = _evaluate(model, src, ref, beam)
            print(json.dumps({f"{name} beam {beam}": result["quality"][f"{name} beam {beam}"]}), flush=True)

    exports = {}
    for name in ("teacher", "student"):
        exports[name] = args.work / f"{name}-ct2-int8"
        _attnmt("export", "ctranslate2", "--model", str(models[name]), "--output", str(exports[name]),
                "--quantization", "int8")
        result["size"][f"{name} model.safetensors MiB"] = round((models[name] / "model.safetensors").stat().st_size / 2**20, 2)
        result["size"][f"{name} CTranslate2 int8 MiB"] = round((exports[name] / "model.bin").stat().st_size / 2**20, 2)
    site = args.work / "student-web-int8"
    _attnmt("export", "web", "--model", str(args.student), "--output", str(site), "--quantization", "int8")
    raw, packed = _site_bytes(site)
    result["size"]["student web int8 download MiB"] = round(raw / 2**20, 2)
    result["size"]["student web int8 download gzip MiB"] = round(packed / 2**20, 2)

    two = ("--inter-threads", "2", "--threads", "1")
    rows = [("teacher", "native", 5, models["teacher"], ()), ("student", "native", 1, models["student"], ()),
            ("teacher", "ctranslate2", 5, exports["teacher"], ()), ("student", "ctranslate2", 1, exports["student"], ()),
            ("teacher", "ctranslate2", 5, exports["teacher"], two), ("student", "ctranslate2", 1, exports["student"], two)]
    references = ref.read_text(encoding="utf-8").splitlines()
    for _ in range(args.rounds):
        for name, engine, beam, model, options in rows:
            key = (f"{name} {engine}{' int8' if engine != 'native' else ''} beam {beam}"
                   f"{', 2 batches at once' if options else ''}")
            out = args.work / "out.txt"
            process_s, decode_s = _translate(model, repeated, out, beam, engine, options)
            best = result["speed"].get(key)
            if best is None or process_s < best["process_s"]:
                result["speed"][key] = {"process_s": round(process_s, 2), "decode_s": round(decode_s, 2)}
            if engine != "native":
                hyps = out.read_text(encoding="utf-8").splitlines()[:len(references)]
                result["speed"][key]["bleu"] = round(sacrebleu.corpus_bleu(hyps, [references]).score, 2)
            print(json.dumps({key: result["speed"][key]}), flush=True)
    speed = result["speed"]
    result["ratio teacher beam 5 / student greedy, CTranslate2 int8 (process)"] = round(
        speed["teacher ctranslate2 int8 beam 5"]["process_s"] / speed["student ctranslate2 int8 beam 1"]["process_s"], 2)
    result["ratio teacher beam 5 / student greedy, CTranslate2 int8, 2 batches at once (process)"] = round(
        speed["teacher ctranslate2 int8 beam 5, 2 batches at once"]["process_s"]
        / speed["student ctranslate2 int8 beam 1, 2 batches at once"]["process_s"], 2)
    result["ratio teacher beam 5 / student greedy, native (process)"] = round(
        speed["teacher native beam 5"]["process_s"] / speed["student native beam 1"]["process_s"], 2)

    print("| what | value |\n| --- | --- |")
    for key, value in result["quality"].items():
        print(f"| {key}: BLEU / chrF | {value['bleu']:.2f} / {value['chrf']:.2f} |")
    for key, value in result["speed"].items():
        bleu = f" (BLEU {value['bleu']:.2f})" if "bleu" in value else ""
        print(f"| {key}: process / decode s | {value['process_s']:.2f} / {value['decode_s']:.2f}{bleu} |")
    for key, value in result["size"].items():
        print(f"| {key} | {value} |")
    for key, value in result.items():
        if key.startswith("ratio"):
            print(f"| {key} | {value} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
