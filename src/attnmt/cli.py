"""The ``attnmt`` command line: train, translate, evaluate, score, plot-attention, plot-training,
import (MarianMT) and export (CTranslate2, ONNX).

User mistakes (bad configuration, missing or malformed files) print one line to stderr,
``attnmt: error: ...``, and exit with status 2; no traceback.

Library: argparse (standard library), tqdm for progress bars.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

from attnmt.errors import AttnmtError

log = logging.getLogger("attnmt")

# The decoder layer whose head-averaged source attention aligned words best on the Multi30k
# German->English preset (see README, "Looking inside").
DEFAULT_ATTENTION_LAYER = 2


def _read_input(path: str | None) -> list[str]:
    from attnmt.data.corpus import decode_lines, read_lines

    if path is None or path == "-":
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
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
    import torch

    from attnmt.decode.translator import Translator

    if args.threads:
        torch.set_num_threads(args.threads)
    tr = Translator.from_dir(args.model, weights=args.weights)
    if args.precision:
        tr.set_precision(args.precision)
    if args.attention:
        tr.set_attention(args.attention)
    return tr


def _engine_translator(args: argparse.Namespace):
    """The translator of ``--engine``: native (PyTorch), ctranslate2 or onnxruntime; the latter two
    read an export directory (``attnmt export``) given as --model."""
    engine = getattr(args, "engine", "native")
    if engine == "native":
        return _translator(args)
    if args.weights or args.precision or args.attention:
        raise AttnmtError(f"--weights, --precision and --attention apply to the native engine, not {engine}")
    if engine == "ctranslate2":
        from attnmt.interop.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator(args.model, compute_type=args.compute_type, threads=args.threads or 0)
    from attnmt.interop.onnx import OnnxTranslator

    return OnnxTranslator(args.model, threads=args.threads or 0)


def cmd_import(args: argparse.Namespace) -> int:
    from attnmt.interop.marian import import_marian

    import_marian(args.source, args.output)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "ctranslate2":
        from attnmt.interop.ctranslate2 import export_ctranslate2

        export_ctranslate2(args.model, args.output, args.quantization)
    else:
        if args.quantization:
            raise AttnmtError("--quantization applies to the ctranslate2 export only")
        from attnmt.interop.onnx import export_onnx

        export_onnx(args.model, args.output)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    tr = _engine_translator(args)
    lines = _read_input(args.input)
    t0 = time.perf_counter()
    beam_size = args.beam_size or max(tr.config.decode.beam_size, args.nbest)
    results = tr.translate(lines, beam_size=beam_size, batch_size=args.batch_size,
                           length_penalty=args.length_penalty, nbest=args.nbest)
    log.info("translated %d lines in %.2f s", len(lines), time.perf_counter() - t0)
    _write_output(args.output, format_translations(results, args.format, args.scores, args.nbest))
    return 0


def format_translations(results, fmt: str, scores: bool, nbest: int) -> list[str]:
    """Output lines for ``translate``.

    text, plain: one translation a line. text with ``--scores`` or ``--nbest``: one line per
    hypothesis, ``ID ||| TRANSLATION ||| SCORE ||| LOG_PROB`` (ID = 0-based input line; SCORE =
    length-penalised; LOG_PROB = sum of token log-probabilities), with ``--scores`` a fifth field
    ``||| piece=prob piece=prob ...`` (each output subword, '</s>' last, with its probability).
    jsonl: one object per input line, {"id", "hypotheses": [{"text", "score", "log_prob",
    "tokens", "token_probs"}]}.
    """
    if fmt == "jsonl":
        return [json.dumps({"id": i, "hypotheses": [
            {"text": h.text, "score": h.score, "log_prob": h.log_prob, "tokens": h.pieces,
             "token_probs": [math.exp(lp) for lp in h.token_log_probs]} for h in r.hypotheses]},
            ensure_ascii=False) for i, r in enumerate(results)]
    if not scores and nbest == 1:
        return [r.text for r in results]
    lines = []
    for i, r in enumerate(results):
        for h in r.hypotheses:
            line = f"{i} ||| {h.text} ||| {h.score:.6f} ||| {h.log_prob:.6f}"
            if scores:
                line += " ||| " + " ".join(f"{p}={math.exp(lp):.6f}" for p, lp in zip(h.pieces, h.token_log_probs))
            lines.append(line)
    return lines


def cmd_score(args: argparse.Namespace) -> int:
    from attnmt.data.corpus import read_parallel

    src, tgt = read_parallel(args.src, args.tgt)
    tr = _translator(args)
    results = tr.score(src, tgt, batch_size=args.batch_size)
    total_lp = sum(r.log_prob for r in results)
    total_tokens = sum(len(r.token_ids) for r in results)
    corpus_ppl = math.exp(-total_lp / max(total_tokens, 1))
    if args.format == "jsonl":
        lines = [json.dumps({"id": i, "log_prob": r.log_prob, "tokens": len(r.token_ids),
                             "perplexity": math.exp(-r.log_prob / len(r.token_ids))}) for i, r in enumerate(results)]
        lines.append(json.dumps({"corpus": True, "log_prob": total_lp, "tokens": total_tokens, "perplexity": corpus_ppl}))
    else:
        lines = [f"{i}\t{r.log_prob:.6f}\t{len(r.token_ids)}\t{math.exp(-r.log_prob / len(r.token_ids)):.4f}"
                 for i, r in enumerate(results)]
        lines.append(f"corpus\t{total_lp:.6f}\t{total_tokens}\t{corpus_ppl:.4f}")
    _write_output(args.output, lines)
    return 0


def cmd_plot_attention(args: argparse.Namespace) -> int:
    from attnmt.visualize import plot_attention

    if (args.sentence is None) == (args.input is None):
        raise AttnmtError("give either a SENTENCE or --input FILE")
    sentences = [args.sentence] if args.sentence is not None else [s for s in _read_input(args.input) if s.strip()]
    tr = _translator(args)
    num_layers = tr.config.model.num_decoder_layers if args.self_attention != "encoder" else tr.config.model.num_encoder_layers
    layer = args.layer if args.layer is not None else min(DEFAULT_ATTENTION_LAYER, num_layers)
    if not 1 <= layer <= num_layers:
        raise AttnmtError(f"--layer must be between 1 and {num_layers}")
    output = Path(args.output)
    if args.input is not None:
        output.mkdir(parents=True, exist_ok=True)
    results = tr.translate(sentences, beam_size=args.beam_size, batch_size=args.batch_size)
    kind = args.self_attention or "source"
    title = {"source": "encoder-decoder attention", "encoder": "encoder self-attention",
             "decoder": "decoder self-attention"}[kind]
    for n, (sentence, src_ids, result) in enumerate(zip(sentences, tr.encode_sources(sentences), results), start=1):
        hyp = result.hypotheses[0]
        weights = tr.attention(src_ids, hyp.token_ids)[kind][layer - 1]  # (H, rows, columns)
        # (column labels, row labels, column axis name, row axis name) of each kind of attention
        x_labels, y_labels, x_name, y_name = {
            "source": (result.src_pieces, hyp.pieces, "source", "output"),
            "encoder": (result.src_pieces, result.src_pieces, "source", "source"),
            "decoder": (["<s>"] + hyp.pieces[:-1], hyp.pieces, "output prefix", "output"),
        }[kind]
        path = output / f"attention_{n:03d}.png" if args.input is not None else output
        plot_attention(weights, x_labels, y_labels, path,
                       f"{sentence}\n-> {hyp.text}\n{title}, layer {layer} of {num_layers}",
                       x_name=x_name, y_name=y_name)
        log.info("wrote %s", path)
    return 0


def cmd_plot_training(args: argparse.Namespace) -> int:
    from attnmt.visualize import plot_training

    run_dir = Path(args.run_dir)
    if not (run_dir / "train_log.jsonl").is_file():
        raise AttnmtError(f"{run_dir / 'train_log.jsonl'}: no such file; is {run_dir} a run directory?")
    output = args.output or str(run_dir / "training.png")
    plot_training(run_dir, output)
    log.info("wrote %s", output)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import corpus_scores

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
    p.add_argument("--attention", choices=["explicit", "fused"],
                   help="attention kernel: the explicit formula or PyTorch's fused one; default from the model's config")
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
    p.add_argument("--nbest", type=int, default=1, help="hypotheses per sentence (<= beam size)")
    p.add_argument("--scores", action="store_true", help="print scores and each token's probability")
    p.add_argument("--format", choices=["text", "jsonl"], default="text", help="output format")
    p.add_argument("--engine", choices=["native", "ctranslate2", "onnxruntime"], default="native",
                   help="native: PyTorch; ctranslate2 / onnxruntime: --model is a directory from 'attnmt export'")
    p.add_argument("--compute-type", default="default",
                   help="ctranslate2 engine: CTranslate2's compute type (default: the exported weights' type)")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("import", help="import another toolkit's model as an attnmt model directory")
    p.add_argument("kind", choices=["marian"], help="marian: a Hugging Face MarianMT (OPUS-MT) model")
    p.add_argument("source", help="a local MarianMT directory, or a Hub id such as Helsinki-NLP/opus-mt-de-en")
    p.add_argument("--output", required=True, help="model directory to create")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", help="export a model directory for a fast inference engine")
    p.add_argument("format", choices=["ctranslate2", "onnx"], help="CTranslate2 model, or ONNX graphs")
    p.add_argument("--model", required=True, help="model directory (from 'attnmt train' or 'attnmt import')")
    p.add_argument("--output", required=True, help="directory to create")
    p.add_argument("--quantization", choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                                               "float16", "bfloat16", "float32"],
                   help="ctranslate2: weight type (default float32)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("score", help="log-probability and perplexity of given translations (forced decoding)")
    _add_decode_options(p)
    p.add_argument("--src", required=True, help="source file")
    p.add_argument("--tgt", required=True, help="translations to score, line-aligned with --src")
    p.add_argument("--output", help="output file; default stdout")
    p.add_argument("--format", choices=["text", "jsonl"], default="text",
                   help="text: 'ID<TAB>LOG_PROB<TAB>TOKENS<TAB>PPL' per line, then a 'corpus' line")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("plot-attention", help="draw attention heatmaps of translations")
    _add_decode_options(p)
    p.add_argument("sentence", nargs="?", help="a source sentence")
    p.add_argument("--input", help="a file of source sentences (then --output is a folder)")
    p.add_argument("--output", required=True, help="PNG file, or folder with --input")
    p.add_argument("--layer", type=int, help=f"layer, 1-based (default {DEFAULT_ATTENTION_LAYER})")
    p.add_argument("--self-attention", choices=["encoder", "decoder"], help="draw self-attention instead")
    p.set_defaults(func=cmd_plot_attention)

    p = sub.add_parser("plot-training", help="draw a run's training curves")
    p.add_argument("run_dir", help="run directory (with train_log.jsonl)")
    p.add_argument("--output", help="PNG file (default RUN_DIR/training.png)")
    p.set_defaults(func=cmd_plot_training)

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
    from attnmt.memory import tune_allocator

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
