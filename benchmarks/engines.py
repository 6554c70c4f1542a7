"""attnmt's inference engines side by side on test_2016_flickr de->en (beam 5), in one run.

Rows, each a fresh process on the same machine, alternating over ``--rounds`` (fastest round kept):

- ``attnmt native fp32``: ``attnmt translate`` (PyTorch).
- ``attnmt --engine ctranslate2 (float32)``: the float32 export, searched to match the native
  engine (``attnmt.interop.ctranslate2_engine.CTranslate2Engine``).
- ``attnmt --engine onnxruntime (fp32)``: the ONNX export under attnmt's own search.
- ``attnmt --engine ctranslate2 (int8)``: ``attnmt translate --engine ctranslate2`` on the int8
  export of the same model (``attnmt export ctranslate2 --quantization int8``: 7-bit weights).
- ``... (int8, 8-bit weights)``: the same on the export with CTranslate2's own quantizer
  (``--int8-weight-bits 8``), to show what the 7-bit weights change.
- ``CTranslate2 itself (int8)``: the 7-bit export run by ``ct2_translate.py`` (CTranslate2's
  Python API and SentencePiece only): the time CTranslate2 itself needs for this model.
- with ``--onmt-ct2 DIR``: a CTranslate2 model converted from OpenNMT-py (the suite's
  ``benchmarks/work/suite/ct2-*``), run by ``ct2_translate.py`` with its ``--onmt-compute-type``.

Decode seconds are raw text in to raw text out, measured inside each process (attnmt's
``translated N lines in S s`` log line; ct2_translate.py's ``decode_seconds``); process seconds
include start-up and loading. BLEU is sacreBLEU's against the references; the agreement column is
the share of lines identical to the native output. Output pieces (the hypotheses re-encoded with
each model's SentencePiece model, EOS included) and milliseconds per 1000 of them make models that
emit outputs of other lengths comparable (a beam search's time follows the tokens it emits). Prints a Markdown table and one JSON object.

Usage (from the repository root, with a model directory trained on Multi30k de-en):
    .venv/bin/python benchmarks/engines.py --model runs/de-en --data "$ATTNMT_DATA"
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _plain(src: Path, dst: Path, limit: int | None) -> Path:
    """An uncompressed copy of a .gz file (ct2_translate.py reads plain text), its first
    ``limit`` lines if given."""
    with gzip.open(src, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[:limit]
    dst.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return dst


def _run(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0, p.stdout + p.stderr


def _attnmt(args, engine: str, model: Path, out: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "attnmt", "translate", "--model", str(model), "--input", str(args.src),
           "--output", str(out), "--beam-size", "5", "--batch-size", "128", "--threads", str(args.threads)]
    if engine != "native":
        cmd += ["--engine", engine]
    process_s, log = _run(cmd)
    decode_s = float(re.search(r"translated \d+ lines in ([\d.]+) s", log).group(1))
    return decode_s, process_s


def _ct2_itself(args, ct2_dir: Path, spm: Path, compute_type: str, out: Path) -> tuple[float, float]:
    process_s, log = _run([args.ct2_python, str(HERE / "ct2_translate.py"), "--model", str(ct2_dir), "--spm", str(spm),
                           "--input", str(args.src), "--output", str(out), "--compute-type", compute_type,
                           "--beam-size", "5", "--batch-size", "128", "--threads", str(args.threads)])
    return json.loads(log.strip().splitlines()[-1])["decode_seconds"], process_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="attnmt model directory (Multi30k de-en)")
    ap.add_argument("--data", type=Path, required=True, help="directory holding multi30k/")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "engines")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, help="translate only the first N test sentences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ct2-python", default=sys.executable, help="python with ctranslate2 and sentencepiece")
    ap.add_argument("--onmt-ct2", type=Path, help="a CTranslate2 model converted from OpenNMT-py (optional)")
    ap.add_argument("--onmt-spm", type=Path, help="its SentencePiece model")
    ap.add_argument("--onmt-compute-type", default="int8")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.src = _plain(args.data / "multi30k" / "test_2016_flickr.de.gz", args.work / "test.de", args.limit)
    ref = _plain(args.data / "multi30k" / "test_2016_flickr.en.gz", args.work / "test.en", args.limit)
    exports = {bits: args.work / f"ct2-int8-{bits}bit" for bits in (7, 8)}
    for bits, ct2_dir in exports.items():
        if not (ct2_dir / "model.bin").is_file():
            _run([sys.executable, "-m", "attnmt", "export", "ctranslate2", "--model", str(args.model), "--output",
                  str(ct2_dir), "--quantization", "int8", "--int8-weight-bits", str(bits)])
    ct2_fp32, onnx_dir = args.work / "ct2-float32", args.work / "onnx"
    if not (ct2_fp32 / "model.bin").is_file():
        _run([sys.executable, "-m", "attnmt", "export", "ctranslate2", "--model", str(args.model), "--output",
              str(ct2_fp32)])
    if not (onnx_dir / "decoder_step.onnx").is_file():
        _run([sys.executable, "-m", "attnmt", "export", "onnx", "--model", str(args.model), "--output", str(onnx_dir)])
    ct2_dir = exports[7]
    spm = ct2_dir / "spm.model"
    # each row: how to run it (into a hypothesis file), and the SentencePiece model of its outputs
    rows = {"attnmt native fp32": (lambda o: _attnmt(args, "native", args.model, o), spm),
            "attnmt --engine ctranslate2 (float32)": (lambda o: _attnmt(args, "ctranslate2", ct2_fp32, o), spm),
            "attnmt --engine onnxruntime (fp32)": (lambda o: _attnmt(args, "onnxruntime", onnx_dir, o), spm),
            "attnmt --engine ctranslate2 (int8)": (lambda o: _attnmt(args, "ctranslate2", ct2_dir, o), spm),
            "attnmt --engine ctranslate2 (int8, 8-bit weights)": (
                lambda o: _attnmt(args, "ctranslate2", exports[8], o), spm),
            "CTranslate2 itself (int8), same model": (lambda o: _ct2_itself(args, ct2_dir, spm, "int8", o), spm),
            "CTranslate2 itself (float32), same model": (
                lambda o: _ct2_itself(args, ct2_fp32, spm, "float32", o), spm)}
    if args.onmt_ct2:
        rows[f"CTranslate2 ({args.onmt_compute_type}), OpenNMT-py model"] = (lambda o: _ct2_itself(
            args, args.onmt_ct2, args.onmt_spm, args.onmt_compute_type, o), args.onmt_spm)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(rows[name][0](args.work / f"{len(times[name])}-{names.index(name)}.hyp"))
    import sentencepiece
    from sacrebleu.metrics import BLEU

    refs = ref.read_text(encoding="utf-8").splitlines()
    native = (args.work / "0-0.hyp").read_text(encoding="utf-8").splitlines()
    result = []
    print("| system | decode s (rounds) | process s | output pieces | ms / 1000 pieces | BLEU | lines = native |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, name in enumerate(names):
        hyps = (args.work / f"0-{i}.hyp").read_text(encoding="utf-8").splitlines()
        sp = sentencepiece.SentencePieceProcessor(model_file=str(rows[name][1]))
        pieces = sum(len(p) + 1 for p in sp.encode(hyps))  # + EOS: one decoding step per piece
        best = min(times[name])
        score = BLEU().corpus_score(hyps, [refs]).score
        same = sum(a == b for a, b in zip(hyps, native)) / len(native)
        rounds = ", ".join(f"{d:.2f}" for d, _ in times[name])
        print(f"| {name} | {best[0]:.2f} ({rounds}) | {best[1]:.1f} | {pieces} | {1e6 * best[0] / pieces:.1f} | "
              f"{score:.2f} | {same:.1%} |")
        result.append({"system": name, "decode_s": best[0], "process_s": best[1], "output_pieces": pieces,
                       "bleu": score, "same_as_native": same})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
