"""translate: attnmt's inference engines, its stopping rules, and CTranslate2 called directly.

Every row translates test_2016_flickr de->en (``--repeat`` copies of it) as a whole process, one
after another, in ``--rounds`` alternating rounds (each row's fastest kept): process and decode
seconds (attnmt's own "translated N lines in S s"; ``ct2_translate.py``'s ``decode_seconds``),
output pieces and milliseconds per 1,000 of them (a beam search's time follows the pieces it
emits), BLEU on the first ``--bleu-lines`` lines, and the share of lines identical to native.

``--part engines``: native float32; ``--engine ctranslate2`` on the float32 export and the int8
exports with 7-bit and 8-bit weights; ``--engine onnxruntime``; CTranslate2 itself
(``ct2_translate.py``: its Python API and SentencePiece only) on the same exports; with
``--onmt-ct2`` an OpenNMT-py model converted to CTranslate2.

``--part stopping``: native under exact and early stopping (each rule's length penalty from
``--alpha-exact``/``--alpha-early`` or the best on val of ``--tune``), the engines and CTranslate2
direct under early stopping, CTranslate2 given attnmt's per-batch length limit; ``--parallel``
times each early row again with two batches at once of one thread each (``--inter-threads``);
``--base-src DIR`` adds native early stopping run from another checkout's ``src``.

``--part documents``: paragraphs with ``--split-sentences``, HTML with inline tags, a document's
speed against the same sentences as lines (``documents.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import harness as h

PARTS = {"engines": ["--part", "engines"], "stopping": ["--part", "stopping"], "documents": ["--part", "documents"]}
SMOKE = {"model": h.smoke_model, "limit": 8, "rounds": 1, "repeat": 1, "bleu_lines": 8, "parallel": True,
         "tune": "0.6,1.0"}
MODELS = ("model", "onmt_ct2")
SECTIONS = {"engines": "Inference engines", "stopping": "Stopping rules and CTranslate2's speed",
            "documents": "Documents"}


def add_arguments(p) -> None:
    p.add_argument("--part", choices=("engines", "stopping", "documents"), default="stopping")
    p.add_argument("--model", type=Path, help="an attnmt model trained on Multi30k de-en (--smoke: a tiny one)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; each row's fastest is kept")
    p.add_argument("--repeat", type=int, help="copies of test2016 translated (engines 1, stopping 3)")
    p.add_argument("--limit", type=int, help="only the first N test and val sentences")
    p.add_argument("--bleu-lines", type=int, default=1000, help="BLEU on the first N output lines")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--alpha-exact", type=float, help="length penalty under exact stopping (default: the model's)")
    p.add_argument("--alpha-early", type=float, help="length penalty under early stopping (default: the model's)")
    p.add_argument("--tune", help="comma-separated alphas: each rule's by val BLEU first")
    p.add_argument("--parallel", action="store_true", help="also each early row as two batches at once of 1 thread")
    p.add_argument("--base-src", type=Path, help="stopping: the src/ of another checkout, native early stopping")
    p.add_argument("--ct2-python", default=sys.executable, help="python with ctranslate2 and sentencepiece")
    p.add_argument("--onmt-ct2", type=Path, help="a CTranslate2 model converted from OpenNMT-py (engines)")
    p.add_argument("--onmt-spm", type=Path, help="its SentencePiece model")
    p.add_argument("--onmt-compute-type", default="int8")


def threads(args, parallel: bool) -> dict:
    """Thread options: ``--threads`` threads on one batch, or that many batches of one thread each."""
    return {"threads": 1, "inter_threads": args.threads} if parallel else {"threads": args.threads}


def export(args, kind: str, bits: int = 7) -> Path:
    """The model's export (ctranslate2 float32/int8 or onnx) in the work folder, made once per weights file."""
    out = args.out / f"{(args.model / 'model.safetensors').stat().st_mtime_ns}-{kind}{f'-{bits}bit' * (kind == 'int8')}"
    if not out.exists():
        fmt = "onnx" if kind == "onnx" else "ctranslate2"
        extra = ["--quantization", "int8", "--int8-weight-bits", str(bits)] if kind == "int8" else []
        h.run(h.attnmt("export", fmt, "--model", args.model, "--output", out, *extra))
    return out


def native(args, model: Path, engine: str | None, early: bool | None, parallel: bool = False,
           src: Path | None = None):
    """A row of ``attnmt translate`` (``early`` None: the model's rule and penalty; ``src``: another checkout's)."""
    rule = {} if early is None else {"early_stopping": "true" if early else "false",
                                     "length_penalty": args.alpha[early]}

    def row(out: Path) -> dict:
        return h.translate(model, args.src, out, env={"PYTHONPATH": str(src.resolve())} if src else None,
                           beam=args.beam, batch=args.batch_size, engine=engine, device="cpu", **rule,
                           **threads(args, parallel))
    return row


def direct(args, ct2: Path, spm: Path, compute_type: str, parallel: bool = False, limits: bool = True):
    """A row of ``ct2_translate.py``; ``limits``: attnmt's per-batch length limit and early rule's penalty."""
    def row(out: Path) -> dict:
        cmd = [args.ct2_python, str(h.HERE / "ct2_translate.py"), "--model", str(ct2), "--spm", str(spm),
               "--input", str(args.src), "--output", str(out), "--compute-type", compute_type,
               "--beam-size", str(args.beam), "--batch-size", str(args.batch_size)]
        for name, value in threads(args, parallel).items():
            cmd += [f"--{name.replace('_', '-')}", str(value)]
        if limits:
            cmd += ["--length-penalty", str(args.alpha[True]), "--max-length", str(args.max_length),
                    "--max-input-length", str(args.max_length), "--max-len-a", str(args.max_len_a),
                    "--max-len-b", str(args.max_len_b)]
        p = h.run(cmd)
        return {"seconds": p.seconds, "decode_seconds": json.loads(p.output.strip().splitlines()[-1])["decode_seconds"],
                "output": out}
    return row


def tune(args, alphas: list[float]) -> dict:
    """Each stopping rule's length penalty with the best val BLEU."""
    val = {side: h.write_lines(args.out / f"val.{side}", h.read_lines(h.corpus(args, "val", side), args.limit))
           for side in ("de", "en")}
    best = {}
    for early in (False, True):
        scores = {}
        for alpha in alphas:
            scores[alpha] = h.evaluate(args.model, val["de"], val["en"], "--beam-size", args.beam, "--length-penalty",
                                       alpha, "--device", "cpu", "--threads", args.threads, "--early-stopping",
                                       "true" if early else "false")["bleu"]
        best[early] = max(scores, key=lambda a: (scores[a], -a))
        print(f"val BLEU, {'early' if early else 'exact'}: {scores}", flush=True)
    return best


def rows(args) -> dict:
    """The part's rows: name -> (runner, SentencePiece model of its output)."""
    spm = export(args, "int8") / "spm.model"
    if args.part == "engines":
        table = {"attnmt native fp32": native(args, args.model, None, None),
                 "attnmt --engine ctranslate2 (float32)": native(args, export(args, "float32"), "ctranslate2", None),
                 "attnmt --engine onnxruntime (fp32)": native(args, export(args, "onnx"), "onnxruntime", None),
                 "attnmt --engine ctranslate2 (int8)": native(args, export(args, "int8"), "ctranslate2", None),
                 "attnmt --engine ctranslate2 (int8, 8-bit weights)":
                     native(args, export(args, "int8", 8), "ctranslate2", None),
                 "CTranslate2 itself (int8)": direct(args, export(args, "int8"), spm, "int8", limits=False),
                 "CTranslate2 itself (float32)": direct(args, export(args, "float32"), spm, "float32", limits=False)}
        table = {name: (run, spm) for name, run in table.items()}
        if args.onmt_ct2:
            table[f"CTranslate2 ({args.onmt_compute_type}), OpenNMT-py model"] = (
                direct(args, args.onmt_ct2, args.onmt_spm, args.onmt_compute_type, limits=False), args.onmt_spm)
        return table
    table = {"native fp32, exact": lambda p: native(args, args.model, None, False, p),
             "native fp32, early": lambda p: native(args, args.model, None, True, p),
             "CTranslate2 engine float32, early": lambda p: native(args, export(args, "float32"), "ctranslate2", True, p),
             "CTranslate2 engine int8, early": lambda p: native(args, export(args, "int8"), "ctranslate2", True, p),
             "ONNX Runtime engine, early": lambda p: native(args, export(args, "onnx"), "onnxruntime", True, p),
             "CTranslate2 direct float32": lambda p: direct(args, export(args, "float32"), spm, "float32", p),
             "CTranslate2 direct int8": lambda p: direct(args, export(args, "int8"), spm, "int8", p)}
    if args.base_src:
        table["native fp32, early, --base-src"] = lambda p: native(args, args.model, None, True, p, args.base_src)
    out = {name: (make(False), spm) for name, make in table.items()}
    if args.parallel:
        out.update({f"{name}, 2 batches at once": (make(True), spm) for name, make in table.items() if "exact" not in name})
    return out


def run(args) -> None:
    from attnmt.rundir import read_config

    h.model_dir(args.model)
    args.out = args.work / args.suite / args.part
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "documents":  # benchmarks/documents.py
        import documents

        documents.run(args)
        return
    repeat = args.repeat or (1 if args.part == "engines" else 3)
    lines = h.read_lines(h.corpus(args, "test_2016_flickr", "de"), args.limit)
    args.src = h.write_lines(args.out / "test.de", lines * repeat)
    refs = h.read_lines(h.corpus(args, "test_2016_flickr", "en"), args.limit)[:args.bleu_lines]
    config = read_config(args.model)
    args.max_length, args.max_len_a, args.max_len_b = (config.model.max_positions - 1, config.decode.max_len_a,
                                                       config.decode.max_len_b)
    tuned = tune(args, [float(a) for a in args.tune.split(",")]) if args.tune else {}
    default = config.decode.length_penalty
    args.alpha = {False: args.alpha_exact if args.alpha_exact is not None else tuned.get(False, default),
                  True: args.alpha_early if args.alpha_early is not None else tuned.get(True, default)}
    table = rows(args)
    best = h.alternate({name: (lambda i=i, r=r: r[0](args.out / f"{i}.hyp"))
                        for i, (name, r) in enumerate(table.items())}, args.rounds)
    import sentencepiece

    early = best.get("native fp32, early")  # the stopping part's engines are compared with native under their rule
    first, ref = early and h.read_lines(early["output"]), h.write_lines(args.out / "ref.en", refs)
    for name, res in best.items():
        hyps = h.read_lines(res["output"])
        first = first or hyps
        pieces = sum(len(p) + 1 for p in sentencepiece.SentencePieceProcessor(model_file=str(table[name][1])).encode(hyps))
        figures = {"process s": (round(res["seconds"], 2), "s"), "decode s": (round(res["decode_seconds"], 2), "s"),
                   "ms per 1000 output pieces": (round(1e6 * res["decode_seconds"] / pieces, 1), "ms"),
                   "BLEU": (round(h.bleu(res["output"], ref)["bleu"], 2), "BLEU"),
                   "lines identical to native": (round(sum(a == b for a, b in zip(hyps, first)) / len(hyps), 3), "share")}
        for column, (value, unit) in figures.items():
            h.record(args, SECTIONS[args.part], name, column, value, unit, lines=len(lines) * repeat, beam=args.beam,
                     alpha=args.alpha[True], threads=args.threads)
