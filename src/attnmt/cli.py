"""The ``attnmt`` command line: train, translate, evaluate.

User mistakes (bad configuration, missing or malformed files) print one line to stderr,
``attnmt: error: ...``, and exit with status 2; no traceback.

Library: argparse (standard library), tqdm for progress bars.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from attnmt.errors import AttnmtError

log = logging.getLogger("attnmt")


def _read_input(path: str | None) -> list[str]:
    from attnmt.data.corpus import read_lines

    if path is None or path == "-":
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise AttnmtError(f"<stdin>:{line}: invalid UTF-8") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [ln.rstrip("\r") for ln in lines]
    return read_lines(path)


def _write_output(path: str | None, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(path).write_text(text, encoding="utf-8")


def cmd_train(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.train.trainer import train

    config = load_config(args.config, args.set)
    result = train(config, args.output, resume=args.resume, data_dir=args.data_dir)
    print(json.dumps(result.__dict__, indent=None))
    return 0


def _translator(args: argparse.Namespace):
    from attnmt.decode.translator import Translator

    tr = Translator.from_dir(args.model, weights=args.weights)
    if args.precision:
        tr.set_precision(args.precision)
    return tr


def cmd_translate(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tr = _translator(args)
    lines = _read_input(args.input)
    t0 = time.perf_counter()
    results = tr.translate(lines, beam_size=args.beam_size, batch_size=args.batch_size,
                           length_penalty=args.length_penalty)
    log.info("translated %d lines in %.2f s", len(lines), time.perf_counter() - t0)
    _write_output(args.output, [r.text for r in results])
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import corpus_scores

    if args.threads:
        torch.set_num_threads(args.threads)
    src, ref = read_parallel(args.src, args.ref)
    tr = _translator(args)
    t0 = time.perf_counter()
    hyps = [r.text for r in tr.translate(src, beam_size=args.beam_size, batch_size=args.batch_size,
                                          length_penalty=args.length_penalty)]
    seconds = time.perf_counter() - t0
    scores = corpus_scores(hyps, ref)
    scores.update(beam_size=args.beam_size or tr.config.decode.beam_size, decode_seconds=round(seconds, 2))
    if args.hyp_output:
        _write_output(args.hyp_output, hyps)
    if args.json:
        print(json.dumps(scores))
    else:
        print(f"BLEU = {scores['bleu']:.2f}  ({scores['bleu_signature']})")
        print(f"chrF = {scores['chrf']:.2f}  ({scores['chrf_signature']})")
        print(scores["bleu_detail"])
        print(f"{len(hyps)} sentences, beam {scores['beam_size']}, {seconds:.1f} s")
    return 0


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory written by 'attnmt train'")
    p.add_argument("--weights", help="a .safetensors file to use instead of MODEL/model.safetensors")
    p.add_argument("--beam-size", type=int, help="beam size K (1 = greedy); default from the model's config")
    p.add_argument("--batch-size", type=int, help="sentences per batch; default from the model's config")
    p.add_argument("--length-penalty", type=float, help="alpha of the GNMT length penalty (default 0.6)")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                   help="inference precision: fp32, bf16, or int8 (dynamic quantisation); default from the model's config")
    p.add_argument("--threads", type=int, help="CPU threads (default: PyTorch's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnmt", description="Transformer neural machine translation")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a YAML configuration")
    p.add_argument("config", help="YAML configuration (see configs/)")
    p.add_argument("--output", required=True, help="run directory to create (the model directory)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration value, e.g. --set model.num_encoder_layers=4")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    p.add_argument("--data-dir", help="local dataset directory (holding multi30k/); default $ATTNMT_DATA")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate raw text, one sentence a line")
    _add_decode_options(p)
    p.add_argument("--input", help="input file (plain or .gz); default stdin")
    p.add_argument("--output", help="output file; default stdout")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="BLEU and chrF (sacreBLEU) of a model on a test set")
    _add_decode_options(p)
    p.add_argument("--src", required=True, help="source file (plain or .gz)")
    p.add_argument("--ref", required=True, help="reference file (plain or .gz), line-aligned with --src")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")
    p.add_argument("--hyp-output", help="also write the translations to this file")
    p.set_defaults(func=cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from attnmt.runtime import tune_allocator

    tune_allocator()
    try:
        return args.func(args)
    except AttnmtError as e:
        print(f"attnmt: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # invalid option values reaching the library (e.g. nbest > beam)
        print(f"attnmt: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnmt: interrupted", file=sys.stderr)
        return 130
