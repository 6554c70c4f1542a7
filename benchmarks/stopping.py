"""Beam search's stopping rules and CTranslate2's speed (issue 39's done-when figures), in one run.

On test_2016_flickr de->en repeated ``--repeat`` times (3,000 lines by default), beam 5, batches
of 128 sentences, every row is a whole process, run one after another on the same machine
(``--rounds`` alternating rounds, fastest kept):

- ``native fp32, exact`` / ``native fp32, early``: ``attnmt translate`` with ``--early-stopping
  false`` / ``true``, each with its length penalty (``--alpha-exact``, ``--alpha-early``, or the
  best on val found by ``--tune``).
- ``ctranslate2 engine float32 / int8, early``: ``attnmt translate --engine ctranslate2
  --early-stopping true`` on the float32 and int8 (7-bit) exports of the same model (with
  ``--exact-engines`` also the exact rule's rows).
- ``onnxruntime engine, early``: ``attnmt translate --engine onnxruntime --early-stopping true``.
- ``CTranslate2 direct float32 / int8``: ``ct2_translate.py``, a plain Python script calling
  ``ctranslate2.Translator.translate_batch`` (and SentencePiece) on the same exports, same beam,
  batch size and alpha (CTranslate2's own length penalty, log P / |Y|^alpha, patience 1), in
  batches sorted by length with attnmt's limit per batch (``max_decoding_length`` = max_len_a x
  the longest source + max_len_b), capped at the model's max_positions - 1 tokens.
- with ``--parallel``, each early-stopping row again with ``--threads`` batches at once of one
  thread each (``attnmt translate --inter-threads``; ``ct2_translate.py --inter-threads``:
  CTranslate2's ``inter_threads``, every batch submitted asynchronously), named "..., batches at
  once".

BLEU is sacreBLEU on the first ``--bleu-lines`` lines (test2016 once) against the references.
The table gives process and decode seconds, BLEU, and the ratios the issue asks for: native
exact / native early (>= 1.5), native early fp32 / CTranslate2 direct float32 (<= 1.0), the
CTranslate2 engine int8 / CTranslate2 direct int8 (<= 1.15). ``--tune 0.6,1.0,1.4`` first picks
each rule's length penalty by BLEU on val (``attnmt evaluate --json``, beam 5). Prints a
Markdown table and one JSON object. Measurements go to RESULTS.md only from an otherwise idle
machine, with its CPU named.

Usage (from the repository root, with a model directory trained on Multi30k de-en):
    .venv/bin/python benchmarks/stopping.py --model runs/de-en --data "$ATTNMT_DATA" --tune 0.6,1.0,1.4,1.8
A check at tiny size: ``--limit 20 --repeat 3 --bleu-lines 20 --tune 0.6,1.0`` (``--limit`` cuts
test and val).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engines import _run  # noqa: E402  (wall seconds and output of a whole process; a failure ends the run)


def _lines(path: Path, limit: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()[:limit]




def _threads(args, parallel: bool) -> list[str]:
    """The thread flags of a row: ``--threads`` threads on one batch, or (``parallel``) that many
    batches at once of one thread each."""
    return ["--inter-threads", str(args.threads), "--threads", "1"] if parallel else ["--threads", str(args.threads)]


def _attnmt(args, model: Path, engine: str, early: bool, alpha: float, out: Path,
            parallel: bool = False) -> tuple[float, float]:
    """(process seconds, decode seconds) of one ``attnmt translate``; ``parallel``: ``--threads``
    batches at once of one thread each (``--inter-threads``)."""
    cmd = [sys.executable, "-m", "attnmt", "translate", "--model", str(model), "--input", str(args.src),
           "--output", str(out), "--beam-size", str(args.beam), "--batch-size", str(args.batch_size),
           *_threads(args, parallel), "--length-penalty", str(alpha),
           "--early-stopping", "true" if early else "false", "--device", "cpu"]
    if engine != "native":
        cmd += ["--engine", engine]
    process_s, log = _run(cmd)
    return process_s, float(re.search(r"translated \d+ lines in ([\d.]+) s", log).group(1))


def _ct2_direct(args, export: Path, compute_type: str, alpha: float, out: Path,
                parallel: bool = False) -> tuple[float, float]:
    """(process seconds, decode seconds) of ct2_translate.py on an attnmt export."""
    process_s, log = _run([args.ct2_python, str(HERE / "ct2_translate.py"), "--model", str(export),
                           "--spm", str(export / "spm.model"), "--input", str(args.src), "--output", str(out),
                           "--compute-type", compute_type, "--beam-size", str(args.beam),
                           "--batch-size", str(args.batch_size), "--length-penalty", str(alpha),
                           "--max-length", str(args.max_length), "--max-input-length", str(args.max_length),
                           *_threads(args, parallel), "--max-len-a", str(args.max_len_a),
                           "--max-len-b", str(args.max_len_b)])
    return process_s, json.loads(log.strip().splitlines()[-1])["decode_seconds"]


def _tune(args, alphas: list[float]) -> dict[bool, float]:
    """Each rule's length penalty with the best val BLEU (beam ``--beam``; the whole val set, or
    its first ``--limit`` lines)."""
    val = {}
    for side in ("de", "en"):
        val[side] = args.work / f"val.{side}"
        val[side].write_text("".join(line + "\n" for line in _lines(args.data / "multi30k" / f"val.{side}.gz",
                                                                      args.limit)), encoding="utf-8")
    best: dict[bool, float] = {}
    for early in (False, True):
        scores = {}
        for alpha in alphas:
            _, log = _run([sys.executable, "-m", "attnmt", "evaluate", "--model", str(args.model),
                           "--src", str(val["de"]), "--ref", str(val["en"]), "--json",
                           "--beam-size", str(args.beam), "--length-penalty", str(alpha), "--device", "cpu",
                           "--threads", str(args.threads), "--early-stopping", "true" if early else "false"])
            scores[alpha] = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])["bleu"]
        best[early] = max(scores, key=lambda a: (scores[a], -a))
        print(f"val BLEU, {'early' if early else 'exact'} stopping: "
              + ", ".join(f"alpha {a}: {s:.2f}" for a, s in scores.items()), flush=True)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="attnmt model directory (Multi30k de-en)")
    ap.add_argument("--data", type=Path, required=True, help="directory holding multi30k/")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "stopping")
    ap.add_argument("--repeat", type=int, default=3, help="copies of test2016 translated (default 3)")
    ap.add_argument("--limit", type=int, help="only the first N test and val sentences (a check at tiny size)")
    ap.add_argument("--bleu-lines", type=int, default=1000, help="BLEU on the first N output lines")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds; each row's fastest is kept")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--alpha-exact", type=float, help="length penalty under exact stopping (default: the model's)")
    ap.add_argument("--alpha-early", type=float, help="length penalty under early stopping (default: the model's)")
    ap.add_argument("--tune", help="comma-separated alphas: pick each rule's by val BLEU first")
    ap.add_argument("--exact-engines", action="store_true", help="also the CTranslate2 engine under exact stopping")
    ap.add_argument("--parallel", action="store_true", help="also every early-stopping row with --threads batches at "
                    "once of one thread each (attnmt --inter-threads; CTranslate2 inter_threads, batches submitted "
                    "asynchronously)")
    ap.add_argument("--ct2-python", default=sys.executable, help="python with ctranslate2 and sentencepiece")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent / "src"))
    from attnmt.rundir import read_config

    args.work.mkdir(parents=True, exist_ok=True)
    test = args.data / "multi30k"
    src_lines = _lines(test / "test_2016_flickr.de.gz", args.limit)
    refs = _lines(test / "test_2016_flickr.en.gz", args.limit)[:args.bleu_lines]
    args.src = args.work / "test.de"
    args.src.write_text("".join(line + "\n" for line in src_lines * args.repeat), encoding="utf-8")
    config = read_config(args.model)
    default_alpha, args.max_length = config.decode.length_penalty, config.model.max_positions - 1  # attnmt's cap
    args.max_len_a, args.max_len_b = config.decode.max_len_a, config.decode.max_len_b  # its per-batch limit
    tuned = _tune(args, [float(a) for a in args.tune.split(",")]) if args.tune else {}
    alpha = {False: args.alpha_exact if args.alpha_exact is not None else tuned.get(False, default_alpha),
             True: args.alpha_early if args.alpha_early is not None else tuned.get(True, default_alpha)}
    exports = {"float32": args.work / "ct2-float32", "int8": args.work / "ct2-int8", "onnx": args.work / "onnx"}
    for kind, out in exports.items():
        if not out.exists():
            extra = ["--quantization", "int8"] if kind == "int8" else []
            _run([sys.executable, "-m", "attnmt", "export", "onnx" if kind == "onnx" else "ctranslate2",
                  "--model", str(args.model), "--output", str(out), *extra])
    def engine(model: Path, name: str, early: bool):  # a row: (output path, parallel) -> seconds
        return lambda o, parallel=False: _attnmt(args, model, name, early, alpha[early], o, parallel)

    def direct(kind: str):
        return lambda o, parallel=False: _ct2_direct(args, exports[kind], kind, alpha[True], o, parallel)

    rows = {"native fp32, exact": engine(args.model, "native", False),
            "native fp32, early": engine(args.model, "native", True),
            "ctranslate2 engine float32, early": engine(exports["float32"], "ctranslate2", True),
            "ctranslate2 engine int8, early": engine(exports["int8"], "ctranslate2", True),
            "onnxruntime engine, early": engine(exports["onnx"], "onnxruntime", True),
            "CTranslate2 direct float32": direct("float32"),
            "CTranslate2 direct int8": direct("int8")}
    if args.exact_engines:
        rows["ctranslate2 engine int8, exact"] = engine(exports["int8"], "ctranslate2", False)
    if args.parallel:
        for name in [n for n in rows if "exact" not in n]:
            rows[f"{name}, batches at once"] = lambda o, run=rows[name]: run(o, parallel=True)
    names = list(rows)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(rows[name](args.work / f"{names.index(name)}.hyp"))
            print(f"[stopping] {name}: process {times[name][-1][0]:.2f} s, decode {times[name][-1][1]:.2f} s",
                  flush=True)
    from sacrebleu.metrics import BLEU

    result = {}
    print(f"\n{len(src_lines) * args.repeat} lines, beam {args.beam}, batch {args.batch_size}, {args.threads} threads; "
          f"alpha exact {alpha[False]}, early {alpha[True]}; BLEU on the first {len(refs)} lines\n")
    print("| system | process s | decode s | BLEU |\n| --- | ---: | ---: | ---: |")
    for i, name in enumerate(names):
        hyps = (args.work / f"{i}.hyp").read_text(encoding="utf-8").splitlines()[:len(refs)]
        process_s, decode_s = min(times[name])
        score = BLEU().corpus_score(hyps, [refs]).score
        result[name] = {"process_s": round(process_s, 2), "decode_s": round(decode_s, 2), "bleu": round(score, 2)}
        print(f"| {name} | {process_s:.2f} | {decode_s:.2f} | {score:.2f} |")
    p = {name: r["process_s"] for name, r in result.items()}
    ratios = {"native exact / native early (>= 1.5)": p["native fp32, exact"] / p["native fp32, early"],
              "native early fp32 / CTranslate2 direct float32 (<= 1.0)":
                  p["native fp32, early"] / p["CTranslate2 direct float32"],
              "ctranslate2 engine int8 / CTranslate2 direct int8 (<= 1.15)":
                  p["ctranslate2 engine int8, early"] / p["CTranslate2 direct int8"],
              "BLEU early - exact (>= -0.3)": result["native fp32, early"]["bleu"] - result["native fp32, exact"]["bleu"]}
    print("\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in ratios.items()))
    print(json.dumps({"alpha": {"exact": alpha[False], "early": alpha[True]}, "rows": result,
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
