"""The ``attnmt`` command line: download, prepare, train, train-vectors, translate, evaluate, score,
plot-attention, plot-training, plot-positions, serve, import (MarianMT) and export (CTranslate2, ONNX, a
web page).

User mistakes (bad options, bad configuration, missing, malformed or unwritable files) print one
line to stderr, ``attnmt: error: ...``, and exit with status 2; no traceback (``-v`` adds it, as a
debug message). Options are checked by their argparse types (every number has a range, shown in
its help: counts from 1, finite numbers within the bounds of ``attnmt.ranges`` that the
configuration's keys share) and outputs are checked to be writable before any work starts. A
failure of the environment (``attnmt.errors.EnvironmentFailure``: a worker process killed, a
library that raised, a full disk; and memory exhaustion) prints one line the same way and exits
with status 1.
Programming errors (bugs) are not caught: they end with Python's traceback.

Library: argparse (standard library), tqdm for progress bars.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

from attnmt import ranges
from attnmt.config import DEFAULT_ALIGNMENT_LAYER, DEFAULT_ATTENTION_LAYER
from attnmt.errors import (ENVIRONMENT_ERRNOS, AttnmtError, CheckpointError, EnvironmentFailure, TrainingError,
                           WriteError, write_error)
from attnmt.oneline import json_line as _json_line
from attnmt.oneline import one_line as _one_line
from attnmt.ranges import C_INT_MAX, Range
from attnmt.signals import Interrupted, StopSignals

log = logging.getLogger("attnmt")
OUT_OF_MEMORY = ("out of memory: use smaller batches (train.batch_tokens, --batch-size), fewer --workers or a "
                 "smaller model, or free memory, and run the command again")



# the port of `attnmt serve` (0, any free port, is not one: the server would say where it listens)
PORT = Range(1, 65535, integer=True)
# train-vectors: fastText's passes over the corpus and its minimum word count
VECTOR_EPOCHS = Range(1, 1000, integer=True)
MIN_COUNT = Range(1, C_INT_MAX, integer=True)


def positive_int(text: str) -> int:
    """argparse type: an integer from 1 to ``C_INT_MAX`` (the largest count the engines'
    libraries take: thread counts, beam sizes, batch sizes; the high end of
    ``attnmt.ranges.BEAM_SIZE``, ``BATCH_SIZE`` and ``THREADS``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    if value > C_INT_MAX:
        raise argparse.ArgumentTypeError(f"{text} is out of range: at most {C_INT_MAX}")
    return value


def true_false(text: str) -> bool:
    """argparse type: 'true' or 'false' (any case)."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return text.lower() == "true"


def in_range(r: Range):
    """An argparse type: a number of the range ``r`` (:class:`attnmt.ranges.Range`), else
    argparse's one-line error 'argument --OPTION: VALUE is out of range: use ...'."""

    def parse(text: str) -> int | float:
        try:
            value = int(text) if r.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if r.integer else 'a number'}") from None
        if not r.contains(value):
            raise argparse.ArgumentTypeError(f"{value!r} is out of range: use {r.describe()}")
        return value

    parse.__name__ = "integer" if r.integer else "number"
    return parse


def range_help(r: Range) -> str:
    """The range of an option for its help: '(1 to 65535)'."""
    return f"({ranges.number_text(r.low)} to {ranges.number_text(r.high)})"


def check_output_file(path: str | None, option: str) -> None:
    """Before any work: ``path`` (None or '-' for stdout) can be created or replaced.

    Raises:
        WriteError: its directory is missing or not writable, or ``path`` is a directory.
    """
    from attnmt.rundir import writes_in_place

    if path is None or path == "-":
        check_stdout(f"redirect it, or give {option} FILE")
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise WriteError(f"{option} {path}: is a directory, expected a file")
    if writes_in_place(p):  # a device or pipe (/dev/null, /dev/stdout): written in place, not renamed onto
        if not os.access(p, os.W_OK):
            raise WriteError(f"{option} {path}: not writable")
        return
    if not parent.is_dir():
        raise WriteError(f"{option} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise WriteError(f"{option} {path}: directory {parent} is not writable")


def check_stdout(hint: str) -> None:
    """Before any work: standard output is open (``>&-`` leaves Python without ``sys.stdout``).

    Raises:
        WriteError: it is closed (the message ends with ``hint``, what to do instead).
    """
    if sys.stdout is None:
        raise WriteError(f"standard output is closed: {hint}")


def check_input_file(path: str | None, option: str) -> None:
    """Before any work: standard input, where ``path`` is None or '-', is open (``<&-`` and
    ``0<&-`` leave Python without ``sys.stdin``).

    Raises:
        AttnmtError: it is closed.
    """
    if (path is None or path == "-") and sys.stdin is None:
        raise AttnmtError(f"standard input is closed: give {option} FILE, or pipe the text in")


def check_output_dir(path: str, option: str) -> None:
    """Before any work: ``path`` is a directory, or can be created in a writable one.

    Raises:
        WriteError: ``path`` is a file, or its nearest existing ancestor is not a writable directory.
    """
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise WriteError(f"{option} {path}: exists and is not a directory")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise WriteError(f"{option} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WriteError(f"{option} {path}: {existing} is not writable")


def _read_input(path: str | None) -> list[str]:
    from attnmt.data.text import decode_lines, read_lines

    if path is None or path == "-":
        check_input_file(path, "--input")
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(path)


def _write_output(path: str | None, lines: list[str]) -> None:
    from attnmt.rundir import atomic_write

    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as e:  # > /dev/full, a closed pipe
            raise write_error(f"standard output: cannot write: {e.strerror or e}", e) from None
    else:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def cmd_train(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.train.loop import train
    from attnmt.train.setup import RunExistsError
    from attnmt.train.stop import NonFiniteError

    overrides = args.set + ([f"train.device={args.device}"] if args.device else [])
    config = load_config(args.config, overrides)
    is_main = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 alone writes and prints
    if is_main:
        check_output_dir(args.output, "--output")
    try:
        result = train(config, args.output, resume=args.resume, data_dir=args.data_dir,
                       allow_data_change=args.allow_data_change)
    except RunExistsError as e:
        raise CheckpointError(f"{e}; pass --resume to continue it or choose another --output") from None
    except NonFiniteError as e:
        raise TrainingError(f"{e}: lower the learning rate (train.lr or train.lr_factor) or set train.clip_norm, "
                            "then --resume") from None
    if is_main:
        print(_json_line(result.__dict__))
    if result.interrupted_by and is_main:
        log.warning("%s: interrupted by %s; continue with --resume", args.output, result.interrupted_by)
    if result.interrupted_by:  # a stop signal: the conventional exit status 128 + its number
        return 128 + signal.Signals[result.interrupted_by].value
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.distill import distill, teacher_record
    from attnmt.languages import bilingual_languages, target_language

    config = load_config(args.config, args.set + ([f"train.device={args.device}"] if args.device else []))
    check_output_dir(args.output, "--output")
    teacher = _with_stopping_rule(_engine_translator(args), args)
    decode = teacher.config.decode.model_copy(update={k: v for k, v in (
        ("beam_size", args.beam_size), ("length_penalty", args.length_penalty), ("batch_size", args.batch_size))
        if v is not None})
    teacher.config.decode = decode
    tgt_lang = bilingual_languages(config)[1]  # the student's target: the teacher must translate into it
    target_language(teacher.config, tgt_lang)  # before anything is written
    teacher.translate([], tgt_lang=tgt_lang)  # no line: refuses what the teacher's engine lacks, writing nothing

    def translate(lines: list[str]) -> list[str]:
        return [_one_line(r.text) for r in teacher.translate(lines, tgt_lang=tgt_lang)]

    record = teacher_record(args.model, args.engine, decode.model_dump(mode="json"), tgt_lang)
    with StopSignals(raising=True):  # finished chunks stay for a rerun; the one in progress is dropped
        result = distill(config, args.output, translate, record, mix_original=args.mix_original,
                         data_dir=args.data_dir)
    print(_json_line(result.__dict__))
    if result.interrupted_by:
        return 128 + signal.Signals[result.interrupted_by].value
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.data.prepare import prepare  # no PyTorch: preparing needs none, and its memory is the workers'

    config = load_config(args.config, args.set)
    if config.data is None:
        raise AttnmtError(f"{args.config}: no data section: nothing to prepare")
    check_output_dir(args.output, "--output")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.workers > cpus:  # encoding is CPU-bound: more processes only cost their start and memory
        log.warning("--workers %d: this machine has %d CPUs; using %d encoding processes", args.workers, cpus, cpus)
        args.workers = cpus
    source = args.tokenizers_from or config.train.init_from  # a fine-tuning config: its starting model's
    tokenizers = None
    if source:
        from attnmt.rundir import read_tokenizers

        tokenizers = read_tokenizers(source)
    with StopSignals(raising=True):  # a signal ends it at once: prepare() writes into a staging directory
        manifest = prepare(config, args.output, tokenizers, workers=args.workers, data_dir=args.data_dir,
                           progress=True)
    size = sum(f.stat().st_size for f in Path(args.output).iterdir())
    train = manifest.train
    valid_pairs = None
    if manifest.valid is not None:
        valid_pairs = manifest.valid.pairs
    print(_json_line({"output": args.output, "lines": train.lines, "pairs": train.pairs, "dropped": train.dropped,
                      "valid_pairs": valid_pairs, "seconds": manifest.seconds,
                      "pairs_per_second": round(train.lines / max(manifest.seconds, 1e-9)),
                      "megabytes": round(size / 1e6, 1), "fingerprint": manifest.fingerprint}))
    return 0


def cmd_train_vectors(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.data.sources import training_corpora
    from attnmt.data.text import iter_pairs
    from attnmt.data.tokenizers import WordTokenizer
    from attnmt.data.vectors import train_fasttext, write_vec
    from attnmt.rundir import atomic_write

    config = load_config(args.config, args.set)
    check_output_file(args.output, "--output")
    side = 0 if args.side == "src" else 1
    lines = [pair[side] for c in training_corpora(config, args.data_dir)
             for pair in itertools.islice(iter_pairs(c.src, c.tgt), c.max_pairs)]
    tc = config.tokenizer
    lang = config.languages()[0 if args.side == "src" else 1]
    if lang is None:
        raise AttnmtError("no language for the tokenizer: set data.pair or tokenizer.src_lang/tgt_lang")
    sentences = WordTokenizer([], lang, tc.lowercase, tc.token_filter).tokenize(lines)
    dim = args.dim or config.model.d_model
    log.info("training %d-dimensional fastText vectors on %d %s sentences", dim, len(sentences), lang)
    vectors = train_fasttext(sentences, dim=dim, epochs=args.epochs, min_count=args.min_count, seed=config.train.seed)
    atomic_write(args.output, lambda tmp: write_vec(tmp, vectors))
    log.info("wrote %d vectors to %s", len(vectors), args.output)
    return 0


def _translator(args: argparse.Namespace):
    """The native engine's translator (``attnmt.interop.engines.open_translator``)."""
    from attnmt.interop.engines import open_translator

    return open_translator(args.model, "native", args.device, threads=args.threads or 0, weights=args.weights,
                           precision=args.precision, attention=args.attention,
                           inter_threads=getattr(args, "inter_threads", 1))


def _engine_translator(args: argparse.Namespace):
    """The translator of ``--engine``: native (PyTorch), ctranslate2 or onnxruntime; the latter two
    read an export directory (``attnmt export``) given as --model. ``--device`` (default: the
    model's decode.device) applies to every engine."""
    from attnmt.interop.engines import check_load_options, open_translator

    engine = getattr(args, "engine", "native")
    check_load_options(engine, {"weights": args.weights, "precision": args.precision, "attention": args.attention,
                                "compute_type": getattr(args, "compute_type", "default")})
    if engine == "native":
        return _translator(args)

    return open_translator(args.model, engine, args.device, threads=args.threads or 0, compute_type=args.compute_type,
                           inter_threads=getattr(args, "inter_threads", 1))


def _stopping_rule(decode, args: argparse.Namespace):
    """``decode`` (a ``DecodeConfig``) under ``--early-stopping`` / ``--patience``
    (``attnmt.search.options.stopping_rule``).

    Raises:
        ValueError: a patience other than 1 without early stopping (one line, exit 2).
    """
    from attnmt.search.options import SearchOptions, stopping_rule

    early_stopping, patience = stopping_rule(decode, args.early_stopping, args.patience)
    decode = decode.model_copy(update={"early_stopping": early_stopping, "patience": patience})
    SearchOptions.from_config(decode)  # checks the pair
    return decode


def _with_stopping_rule(tr, args: argparse.Namespace):
    """The translator ``tr`` searching under the command line's stopping rule (:func:`_stopping_rule`)."""
    tr.config.decode = _stopping_rule(tr.config.decode, args)
    return tr


def cmd_import(args: argparse.Namespace) -> int:
    from attnmt.interop.marian import import_marian

    check_output_dir(args.output, "--output")
    import_marian(args.source, args.output)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    check_output_dir(args.output, "--output")
    if args.format == "web":
        if args.quantization not in (None, "int8", "float32") or args.int8_weight_bits != 7:
            raise AttnmtError("web export: --quantization is int8 or float32; --int8-weight-bits applies to the "
                              "ctranslate2 export only")
        from attnmt.interop.web import export_web

        export_web(args.model, args.output, args.quantization)
    elif args.format == "ctranslate2":
        from attnmt.interop.ctranslate2 import export_ctranslate2

        export_ctranslate2(args.model, args.output, args.quantization, args.int8_weight_bits)
    else:
        if args.quantization or args.int8_weight_bits != 7:
            raise AttnmtError("--quantization and --int8-weight-bits apply to the ctranslate2 export only")
        from attnmt.interop.onnx import export_onnx

        export_onnx(args.model, args.output)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from attnmt.decode.output import format_translations

    check_output_file(args.output, "--output")
    if args.testset is not None and args.input is not None:
        raise AttnmtError("give --testset or --input, not both")
    testset = _testset_paths(args)  # a named test set's files, fetched once where not given locally
    source = str(testset[0]) if testset else args.input
    check_input_file(source, "--input")
    tr = _with_stopping_rule(_engine_translator(args), args)
    lines = _read_input(source)
    if not lines:
        log.warning("%s: no input lines; nothing to translate", source or "standard input")
    constraints = _read_constraints(args.constraints, len(lines), tr) if args.constraints else None
    t0 = time.perf_counter()
    beam_size = args.beam_size or max(tr.config.decode.beam_size, args.nbest)
    results = tr.translate(lines, beam_size=beam_size, batch_size=args.batch_size,
                           length_penalty=args.length_penalty, nbest=args.nbest, constraints=constraints,
                           alignments=args.alignments, alignment_layer=args.alignment_layer,
                           return_token_log_probs=args.scores or args.format == "jsonl", tgt_lang=args.tgt_lang)
    log.info("translated %d lines in %.2f s", len(lines), time.perf_counter() - t0)
    _write_output(args.output, format_translations(results, args.format, args.scores, args.nbest,
                                                   tr.confidence if args.format == "jsonl" else None))
    return 0


def _read_constraints(path: str, count: int, tr) -> list[list[str]]:
    """``--constraints``: one line per input line, the phrases separated by tabs (empty: none),
    each one the translator ``tr`` can spell (``Translator.check_constraints``).

    Raises:
        DataError: an unreadable file. AttnmtError: a line count other than ``count``, or a
            phrase with no target token or an unknown one (FILE:LINE).
    """
    from attnmt.data.text import read_lines
    from attnmt.decode.translator import ConstraintError

    lines = read_lines(path)
    if len(lines) != count:
        raise AttnmtError(f"{path}: {len(lines)} lines of constraints for {count} input lines "
                          "(one line of tab-separated phrases per input line; an empty line for none)")
    constraints = [[p.strip() for p in line.split("\t") if p.strip()] for line in lines]
    try:
        tr.check_constraints(constraints)
    except ConstraintError as e:
        raise AttnmtError(f"{path}:{e.line}: constraint {e.phrase!r} {e.reason}") from None
    return constraints


def cmd_score(args: argparse.Namespace) -> int:
    from attnmt.data.text import read_parallel

    check_output_file(args.output, "--output")
    src, tgt = read_parallel(args.src, args.tgt)
    tr = _engine_translator(args)
    results = tr.score(src, tgt, batch_size=args.batch_size, tgt_lang=args.tgt_lang)
    total_lp = sum(r.log_prob for r in results)
    total_tokens = sum(len(r.token_ids) for r in results)
    corpus_ppl = _perplexity(total_lp, total_tokens)
    if args.format == "jsonl":
        lines = [_json_line({"id": i, "log_prob": r.log_prob, "tokens": len(r.token_ids),
                             "perplexity": _perplexity(r.log_prob, len(r.token_ids)),
                             "words": (conf := tr.confidence(r))[0], "word_probs": conf[1]})
                 for i, r in enumerate(results)]
        lines.append(_json_line({"corpus": True, "log_prob": total_lp, "tokens": total_tokens,
                                 "perplexity": corpus_ppl}))
    else:
        lines = [f"{i}\t{r.log_prob:.6f}\t{len(r.token_ids)}\t{_perplexity(r.log_prob, len(r.token_ids)):.4f}"
                 for i, r in enumerate(results)]
        lines.append(f"corpus\t{total_lp:.6f}\t{total_tokens}\t{corpus_ppl:.4f}")
    _write_output(args.output, lines)
    return 0


def _perplexity(log_prob: float, tokens: int) -> float:
    """exp(-log_prob / tokens); inf where that overflows (and nan for a nan log_prob)."""
    try:
        return math.exp(-log_prob / max(tokens, 1))
    except OverflowError:
        return float("inf")


def cmd_plot_attention(args: argparse.Namespace) -> int:
    from attnmt.visualize import plot_attention

    if (args.sentence is None) == (args.input is None):
        raise AttnmtError("give either a SENTENCE or --input FILE")
    if args.input is not None:
        check_output_dir(args.output, "--output")
    else:
        check_output_file(args.output, "--output")
    sentences = [args.sentence] if args.sentence is not None else [s for s in _read_input(args.input) if s.strip()]
    tr = _translator(args)
    num_layers = tr.config.model.num_decoder_layers if args.self_attention != "encoder" else tr.config.model.num_encoder_layers
    layer = args.layer if args.layer is not None else min(DEFAULT_ATTENTION_LAYER, num_layers)
    if not 1 <= layer <= num_layers:
        raise AttnmtError(f"--layer must be between 1 and {num_layers}")
    output = Path(args.output)
    results = tr.translate(sentences, beam_size=args.beam_size, batch_size=args.batch_size, tgt_lang=args.tgt_lang)
    if args.input is not None:  # after every check of the input: a refused command makes no folder
        output.mkdir(parents=True, exist_ok=True)
    kind = args.self_attention or "source"
    title = {"source": "encoder-decoder attention", "encoder": "encoder self-attention",
             "decoder": "decoder self-attention"}[kind]
    for n, (sentence, src_ids, result) in enumerate(zip(sentences, tr.encode_sources(sentences, args.tgt_lang), results), start=1):
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


def cmd_plot_positions(args: argparse.Namespace) -> int:
    from attnmt.model.positional import sinusoidal_table
    from attnmt.visualize import plot_positions, positional_tables

    check_output_file(args.output, "--output")
    if args.model is not None:
        if args.layout is not None:
            raise AttnmtError("--layout applies without --model only (a model's layout is its own)")
        tables, title = positional_tables(args.model, args.max_len)
    else:
        args.layout = args.layout or "interleaved"
        if args.d_model % 2:
            raise AttnmtError(f"--d-model must be even (sines and cosines in pairs), not {args.d_model}")
        tables = [(f"sinusoidal, {args.layout} layout", sinusoidal_table(args.max_len, args.d_model, args.layout))]
        title = f"sinusoidal positional encoding, d_model {args.d_model}"
    plot_positions(tables, args.output, title)
    log.info("wrote %s", args.output)
    return 0


def cmd_plot_training(args: argparse.Namespace) -> int:
    from attnmt.visualize import plot_training

    run_dir = Path(args.run_dir)
    if not (run_dir / "train_log.jsonl").is_file():
        raise AttnmtError(f"{run_dir / 'train_log.jsonl'}: no such file; is {run_dir} a run directory?")
    output = args.output or str(run_dir / "training.png")
    check_output_file(output, "--output")
    plot_training(run_dir, output)
    log.info("wrote %s", output)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from attnmt.data.text import read_parallel
    from attnmt.data.tokenizers import WordTokenizer
    from attnmt.evaluate import corpus_scores, tokenized_bleu

    if args.hyp_output is not None:
        check_output_file(args.hyp_output, "--hyp-output")
    check_stdout("redirect it (the scores are printed)")
    if (args.testset is None) == (args.src is None and args.ref is None):
        raise AttnmtError("give --testset (a named test set such as multi30k:test_2016_flickr) or --src and --ref")
    if args.testset is None and (args.src is None or args.ref is None):
        raise AttnmtError("give both --src and --ref (or --testset)")
    src_path, ref_path = _testset_paths(args) or (args.src, args.ref)
    src, ref = read_parallel(src_path, ref_path)
    if not src:
        raise AttnmtError(f"{src_path}: no sentences to evaluate")
    tr = _with_stopping_rule(_engine_translator(args), args)
    t0 = time.perf_counter()
    translations = tr.translate(src, beam_size=args.beam_size, batch_size=args.batch_size,
                                length_penalty=args.length_penalty, return_token_log_probs=False,
                                tgt_lang=args.tgt_lang)
    seconds = time.perf_counter() - t0
    hyps = [t.text for t in translations]
    scores = corpus_scores(hyps, ref)
    if isinstance(tr.tgt_tokenizer, WordTokenizer):  # also the word-level tutorials' BLEU
        tokens = [[p for p in t.hypotheses[0].pieces if p != "</s>"] for t in translations]
        word = tokenized_bleu(tokens, tr.tgt_tokenizer.tokenize(ref))
        scores.update(bleu_tokenized=word["bleu"], bleu_tokenized_signature=word["bleu_signature"])
    scores.update(beam_size=args.beam_size or tr.config.decode.beam_size, early_stopping=tr.config.decode.early_stopping,
                  patience=tr.config.decode.patience, decode_seconds=round(seconds, 2))
    if args.hyp_output:
        _write_output(args.hyp_output, hyps)
    if args.json:
        print(_json_line(scores))
    else:
        print(f"BLEU = {scores['bleu']:.2f}  ({scores['bleu_signature']})")
        print(f"chrF = {scores['chrf']:.2f}  ({scores['chrf_signature']})")
        print(scores["bleu_detail"])
        if "bleu_tokenized" in scores:
            print(f"BLEU on word tokens = {scores['bleu_tokenized']:.2f}  ({scores['bleu_tokenized_signature']}; "
                  "the model's tokens against the references tokenized as trained)")
        print(f"{len(hyps)} sentences, beam {scores['beam_size']}, {seconds:.1f} s")
    return 0


def _testset_paths(args: argparse.Namespace):
    """(source, reference) files of ``--testset`` in the model's direction (``--src-lang`` and
    ``--tgt-lang`` where the model has several languages; ``attnmt.data.testsets``), or None
    without ``--testset``."""
    if args.testset is None:
        if args.src_lang is not None:
            raise AttnmtError("--src-lang picks the source side of --testset: give --testset")
        return None
    from attnmt.data.testsets import direction, parse_testset, resolve_testset
    from attnmt.languages import served_languages
    from attnmt.rundir import model_languages, read_config

    parse_testset(args.testset)  # a misspelt set: refused before the model is read
    sources, targets = served_languages(read_config(args.model))
    own_src, own_tgt = model_languages(args.model)  # an imported OPUS-MT model: the pair its name carries
    if not sources and own_src:
        sources = [own_src]
    if not targets and own_tgt:
        targets = [own_tgt]
    src_lang, tgt_lang = direction(sources, targets, args.src_lang, args.tgt_lang)
    return resolve_testset(args.testset, src_lang, tgt_lang, args.data_dir)


def cmd_download(args: argparse.Namespace) -> int:
    from attnmt.data.download import download_dataset

    pairs = [p.strip() for p in args.pairs.split(",")] if args.pairs else None
    folder, files = download_dataset(args.dataset, pairs, args.data_dir)
    print(f"{len(files)} files of {args.dataset}, SHA-256 checked, in {folder}")
    if args.data_dir is not None:
        print(f"read them there with: export ATTNMT_DATA={Path(args.data_dir).resolve()}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from attnmt.serve.app import create_app
    except ImportError as e:
        raise AttnmtError(f"attnmt serve needs FastAPI, uvicorn and prometheus-client ({e.name} is missing): "
                          "pip install 'attnmt[serve]'") from None
    from pydantic import ValidationError

    from attnmt.rundir import model_languages, read_config
    from attnmt.serve.settings import ServeSettings

    languages = model_languages(args.model)  # a missing or broken model directory: a one-line error first
    _check_engine_files(args)
    _stopping_rule(read_config(args.model).decode, args)  # a bad --patience: refused before the server starts
    try:
        settings = ServeSettings(**dict(_setting(item) for item in args.set))
    except ValidationError as e:
        first = e.errors()[0]
        raise AttnmtError(f"--set {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    app = create_app(lambda: _with_stopping_rule(_engine_translator(args), args), settings,
                     name=Path(args.model).resolve().name, languages=languages)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info",
                timeout_keep_alive=settings.keep_alive_s)
    return 0


def _check_engine_files(args: argparse.Namespace) -> None:
    """Before ``serve`` starts: the files its engine will load are there (native: config.yaml,
    the tokenizers and weights it still describes, ``rundir.check_model_dir``; ctranslate2 and
    onnxruntime: the export's model files), so that a mistake ends in one line now rather than in
    a server answering every request with 500.

    Raises:
        AttnmtError: a file missing or not matching config.yaml.
    """
    from attnmt import rundir

    engine = getattr(args, "engine", "native")
    if engine == "native":
        rundir.check_model_dir(args.model, args.weights)
        return
    export = {"ctranslate2": ("ctranslate2", ["model.bin"]), "onnxruntime": ("onnx", ["encoder.onnx",
                                                                                    "decoder_step.onnx"])}
    kind, names = export[engine]
    for name in names:
        if not (Path(args.model) / name).is_file():
            raise AttnmtError(f"{Path(args.model) / name}: missing; --engine {engine} serves a directory written by "
                              f"'attnmt export {kind}'")


def _setting(item: str) -> tuple[str, str]:
    name, eq, value = item.partition("=")
    if not eq or not name:
        raise AttnmtError(f"--set {item!r}: expected NAME=VALUE")
    return name.strip(), value.strip()


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    _add_model_options(p)
    p.add_argument("--beam-size", type=in_range(ranges.BEAM_SIZE), help="beam size K (1 = greedy) "
                   f"{range_help(ranges.BEAM_SIZE)}; default from the model's config")
    p.add_argument("--batch-size", type=in_range(ranges.BATCH_SIZE), help="sentences per batch "
                   f"{range_help(ranges.BATCH_SIZE)}; default from the model's config")
    p.add_argument("--length-penalty", type=in_range(ranges.LENGTH_PENALTY),
                   help=f"length penalty alpha {range_help(ranges.LENGTH_PENALTY)}; default from the model's config")
    p.add_argument("--tgt-lang", metavar="LANG", help="the language to translate into: required by a multilingual "
                   "model (one of its tokenizer.target_languages); a bilingual model's own target or nothing")


def _add_stopping_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--early-stopping", type=true_false, metavar="{true,false}",
                   help="beam search's stopping rule: true stops a sentence once beam size x patience hypotheses have "
                        "finished (CTranslate2's rule), false once no open hypothesis can win (exact); default from "
                        "the model's config (decode.early_stopping)")
    p.add_argument("--patience", type=in_range(ranges.PATIENCE), metavar="P",
                   help="with early stopping: wait for round(beam size x P) finished hypotheses, P from 1 to "
                        f"{ranges.number_text(ranges.PATIENCE.high)} (default 1)")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["native", "ctranslate2", "onnxruntime"], default="native",
                   help="native: PyTorch; ctranslate2 / onnxruntime: --model is a directory from 'attnmt export' "
                        "(docs/engines.md says when to pick which)")
    p.add_argument("--compute-type", default="default",
                   help="ctranslate2 engine: CTranslate2's compute type (default: the exported weights' type)")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory written by 'attnmt train'")
    p.add_argument("--weights", help="a .safetensors file to use instead of MODEL/model.safetensors")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                   help="inference precision: fp32, bf16, or int8 (dynamic quantisation); default from the model's config")
    p.add_argument("--attention", choices=["explicit", "fused"],
                   help="attention kernel: the explicit formula or PyTorch's fused one; default from the model's config")
    p.add_argument("--threads", type=in_range(ranges.THREADS), help="CPU threads per batch "
                   f"{range_help(ranges.THREADS)} (default: PyTorch's; with "
                   "--inter-threads N, the cores shared out among the N)")
    p.add_argument("--inter-threads", type=in_range(ranges.THREADS), default=1, metavar="N",
                   help=f"batches translated at the same time {range_help(ranges.THREADS)}, each with --threads "
                   "threads (default 1); on a small "
                   "CPU, --inter-threads 2 --threads 1 translates a file faster than --threads 2")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps; default from the model's config (decode.device)")


def _add_testset_options(p: argparse.ArgumentParser, read: str) -> None:
    p.add_argument("--testset", metavar="DATASET:SPLIT",
                   help=f"a named test set, e.g. multi30k:test_2016_flickr: {read} of the model's direction, from "
                        "--data-dir or $ATTNMT_DATA, else downloaded once and checked (SHA-256)")
    p.add_argument("--src-lang", metavar="LANG", help="the source language of --testset, for a model that reads "
                   "several (its target language: --tgt-lang)")
    p.add_argument("--data-dir", help="local dataset directory (holding multi30k/) for --testset; default "
                   "$ATTNMT_DATA")


def _add_evaluate_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="BLEU and chrF (sacreBLEU) of a model on a test set")
    _add_decode_options(p)
    p.add_argument("--src", help="source file (plain or .gz); or --testset")
    p.add_argument("--ref", help="reference file (plain or .gz), line-aligned with --src")
    _add_testset_options(p, "the source and reference")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")
    p.add_argument("--hyp-output", help="also write the translations to this file")
    _add_stopping_options(p)
    _add_engine_options(p)
    p.set_defaults(func=cmd_evaluate)


def _add_download_parser(sub) -> None:
    p = sub.add_parser("download", help="fetch every file of a registered dataset's pairs (train, val, test sets), "
                       "checked against their SHA-256, for an offline machine")
    p.add_argument("dataset", help="a registered dataset: multi30k")
    p.add_argument("--pairs", metavar="PAIR,...", help="language pairs, e.g. de-en,fr-en (default: all of them)")
    p.add_argument("--data-dir", metavar="DIR", help="write into DIR/DATASET/ (read it with ATTNMT_DATA=DIR); "
                   "default: the cache, ~/.cache/attnmt/DATASET/")
    p.set_defaults(func=cmd_download)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``attnmt translate: error: ...``, exit 2), no usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="sequence-level knowledge distillation: translate a student configuration's "
                       "training source with a teacher, then train the student on the translations")
    p.add_argument("config", help="the student's YAML configuration (its model, training and data)")
    p.add_argument("--teacher", dest="model", required=True, metavar="TEACHER_DIR",
                   help="the teacher: a model directory (trained, fine-tuned or imported), or an 'attnmt export' "
                        "directory with --engine ctranslate2/onnxruntime")
    p.add_argument("--output", required=True, help="the student's run directory (distill/ holds the translations); "
                   "run the same command again to resume")
    p.add_argument("--beam-size", type=in_range(ranges.BEAM_SIZE),
                   help=f"the teacher's beam size {range_help(ranges.BEAM_SIZE)} (default: its config's)")
    p.add_argument("--batch-size", type=in_range(ranges.BATCH_SIZE),
                   help=f"sentences per teacher batch {range_help(ranges.BATCH_SIZE)} (default: its config's)")
    p.add_argument("--length-penalty", type=in_range(ranges.LENGTH_PENALTY),
                   help=f"the teacher's length penalty {range_help(ranges.LENGTH_PENALTY)} (default: its config's)")
    p.add_argument("--mix-original", type=in_range(Range(0.0, ranges.CORPUS_WEIGHT.high)), default=0.0, metavar="W",
                   help="also train on the original targets with weight W in data.train, 0 to "
                        f"{ranges.number_text(ranges.CORPUS_WEIGHT.high)} (default 0: distilled only)")
    p.add_argument("--threads", type=in_range(ranges.THREADS),
                   help=f"CPU threads of the teacher per batch {range_help(ranges.THREADS)} (default: PyTorch's)")
    p.add_argument("--inter-threads", type=in_range(ranges.THREADS), default=1, metavar="N",
                   help=f"teacher batches translated at the same time {range_help(ranges.THREADS)}, each with "
                        "--threads threads (default 1)")
    p.add_argument("--device", help="device of the teacher and the student (default: each config's)")
    p.add_argument("--data-dir", help="directory holding the dataset (default: $ATTNMT_DATA)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the student's configuration, e.g. --set train.max_steps=2000")
    p.set_defaults(weights=None, precision=None, attention=None)
    _add_stopping_options(p)
    _add_engine_options(p)
    p.set_defaults(func=cmd_distill)


def _add_train_vectors_parser(sub) -> None:
    p = sub.add_parser("train-vectors", help="train fastText word vectors (.vec) on a configuration's training "
                       "side, tokenized as its word-level tokenizer does (gensim)")
    p.add_argument("config", help="YAML configuration (its data and tokenizer sections are used)")
    p.add_argument("--side", choices=["src", "tgt"], required=True, help="which side of the training corpus")
    p.add_argument("--output", required=True, help=".vec file to write")
    p.add_argument("--dim", type=in_range(ranges.WIDTH), help=f"vector size {range_help(ranges.WIDTH)} (default: "
                   "the configuration's model.d_model)")
    p.add_argument("--epochs", type=in_range(VECTOR_EPOCHS), default=5,
                   help=f"training epochs over the corpus {range_help(VECTOR_EPOCHS)} (default 5)")
    p.add_argument("--min-count", type=in_range(MIN_COUNT), default=1,
                   help=f"ignore words seen fewer times {range_help(MIN_COUNT)} (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a configuration value")
    p.add_argument("--data-dir", help="local dataset directory (holding multi30k/); default $ATTNMT_DATA")
    p.set_defaults(func=cmd_train_vectors)


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="an HTTP translation API with dynamic batching, and a page showing attention")
    _add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=in_range(PORT), default=8000, help=f"port {range_help(PORT)} (default 8000)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a server limit, e.g. --set max_wait_ms=10 (docs/serving.md)")
    _add_stopping_options(p)
    _add_engine_options(p)
    p.set_defaults(func=cmd_serve)


def _add_score_parser(sub) -> None:
    p = sub.add_parser("score", help="log-probability and perplexity of given translations (forced decoding)")
    _add_decode_options(p)
    p.add_argument("--src", required=True, help="source file")
    p.add_argument("--tgt", required=True, help="translations to score, line-aligned with --src")
    p.add_argument("--output", help="output file; default stdout")
    p.add_argument("--format", choices=["text", "jsonl"], default="text",
                   help="text: 'ID<TAB>LOG_PROB<TAB>TOKENS<TAB>PPL' per line, then a 'corpus' line")
    _add_engine_options(p)
    p.set_defaults(func=cmd_score)


def _add_interop_parsers(sub) -> None:
    p = sub.add_parser("import", help="import another toolkit's model as an attnmt model directory")
    p.add_argument("kind", choices=["marian"], help="marian: a Hugging Face MarianMT (OPUS-MT) model")
    p.add_argument("source", help="a local MarianMT directory, or a Hub id such as Helsinki-NLP/opus-mt-de-en")
    p.add_argument("--output", required=True, help="model directory to create")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", help="export a model directory for a fast inference engine")
    p.add_argument("format", choices=["ctranslate2", "onnx", "web"],
                   help="CTranslate2 model, ONNX graphs, or a static web page translating in the browser")
    p.add_argument("--model", required=True, help="model directory (from 'attnmt train' or 'attnmt import')")
    p.add_argument("--output", required=True, help="directory to create")
    p.add_argument("--quantization", choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                                               "float16", "bfloat16", "float32"],
                   help="ctranslate2: weight type (default float32); web: int8 or float32 (default float32)")
    p.add_argument("--int8-weight-bits", type=int, choices=[7, 8], default=7,
                   help="ctranslate2, int8 / int8_float32: 7 avoids the 16-bit saturation of int8 kernels on CPUs "
                        "without VNNI; 8 is CTranslate2's own quantizer (default 7)")
    p.set_defaults(func=cmd_export)


def _add_plot_curve_parsers(sub) -> None:
    """plot-positions and plot-training (which draw no translation)."""
    p = sub.add_parser("plot-positions", help="draw positional encodings: the sinusoids of section 3.5 as a "
                       "heatmap and curves, or a model's (learned) tables")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help="a model directory: its positional encodings (learned: its trained tables)")
    source.add_argument("--d-model", type=in_range(ranges.WIDTH), default=512,
                        help=f"without --model: the sinusoids for this d_model {range_help(ranges.WIDTH)} "
                        "(default 512)")
    p.add_argument("--layout", choices=["interleaved", "halves"],
                   help="without --model: sines and cosines interleaved (the paper; default) or in halves")
    p.add_argument("--max-len", type=in_range(ranges.POSITIONS), default=100,
                   help=f"positions drawn {range_help(ranges.POSITIONS)} (default 100)")
    p.add_argument("--output", required=True, help="PNG file")
    p.set_defaults(func=cmd_plot_positions)

    p = sub.add_parser("plot-training", help="draw a run's training curves")
    p.add_argument("run_dir", help="run directory (with train_log.jsonl)")
    p.add_argument("--output", help="PNG file (default RUN_DIR/training.png)")
    p.set_defaults(func=cmd_plot_training)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnmt", description="Transformer neural machine translation")
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
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (same as --set train.device=...)")
    p.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: go on although the training data, corpus weights or batching settings "
                        "changed since the checkpoint (otherwise refused)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("prepare", help="encode and filter a configuration's corpora once into token "
                                       "shards (then train with data.prepared: DIR)")
    p.add_argument("config", help="YAML configuration (its data and tokenizer sections)")
    p.add_argument("--output", required=True, help="directory to create")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                   help=f"encoding processes (1 to {C_INT_MAX}, at most the CPU count used; default: the CPU count)")
    p.add_argument("--tokenizers-from", metavar="MODEL_DIR",
                   help="use this model directory's tokenizers instead of training new ones (default: the "
                        "configuration's train.init_from, if any)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration value, e.g. --set data.filter.dedup=true")
    p.add_argument("--data-dir", help="local dataset directory (holding multi30k/); default $ATTNMT_DATA")
    p.set_defaults(func=cmd_prepare)

    _add_train_vectors_parser(sub)

    _add_distill_parser(sub)

    _add_download_parser(sub)

    p = sub.add_parser("translate", help="translate raw text, one sentence a line")
    _add_decode_options(p)
    p.add_argument("--input", help="input file (plain or .gz); default stdin")
    _add_testset_options(p, "the source")
    p.add_argument("--output", help="output file; default stdout")
    p.add_argument("--nbest", type=positive_int, default=1, help="hypotheses per sentence (1 to the beam size)")
    p.add_argument("--scores", action="store_true", help="print scores and each token's probability")
    p.add_argument("--format", choices=["text", "jsonl"], default="text", help="output format")
    p.add_argument("--constraints", metavar="FILE",
                   help="terms each translation must contain: one line per input line, phrases separated by tabs, "
                        "an empty line for none (lexically constrained beam search)")
    p.add_argument("--alignments", action="store_true",
                   help="add each translation's word alignment: Moses 'i-j' pairs, source-target, 0-based words")
    p.add_argument("--alignment-layer", type=positive_int,
                   help=f"decoder layer of the alignments, 1 to the model's layers (default {DEFAULT_ALIGNMENT_LAYER})")
    _add_stopping_options(p)
    _add_engine_options(p)
    p.set_defaults(func=cmd_translate)

    _add_interop_parsers(sub)

    _add_score_parser(sub)

    p = sub.add_parser("plot-attention", help="draw attention heatmaps of translations")
    _add_decode_options(p)
    p.add_argument("sentence", nargs="?", help="a source sentence")
    p.add_argument("--input", help="a file of source sentences (then --output is a folder)")
    p.add_argument("--output", required=True, help="PNG file, or folder with --input")
    p.add_argument("--layer", type=positive_int,
                   help=f"layer, 1 to the model's layers (default {DEFAULT_ATTENTION_LAYER})")
    p.add_argument("--self-attention", choices=["encoder", "decoder"], help="draw self-attention instead")
    p.set_defaults(func=cmd_plot_attention)

    _add_plot_curve_parsers(sub)

    _add_serve_parser(sub)

    _add_evaluate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone logs progress
        level = max(level, logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from attnmt.memory import tune_allocator

    tune_allocator()
    try:
        return args.func(args)
    except Interrupted as e:  # a stop signal during staged work: nothing half-written is left
        log.debug("the stop's traceback", exc_info=True)
        print(f"attnmt: {_one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except EnvironmentFailure as e:  # the machine or a library failed (before AttnmtError: DiskFull is both)
        log.debug("the failure's traceback", exc_info=True)
        print(f"attnmt: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except (AttnmtError, ValueError) as e:  # ValueError: option values the library refuses (nbest > beam)
        log.debug("the error's traceback", exc_info=True)
        print(f"attnmt: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # the system refused a read or write not caught where it happened
        log.debug("the error's traceback", exc_info=True)
        print(f"attnmt: error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1 if e.errno in ENVIRONMENT_ERRNOS else 2
    except MemoryError:
        log.debug("the failure's traceback", exc_info=True)
        print(f"attnmt: error: {OUT_OF_MEMORY}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # torch.OutOfMemoryError (a GPU's memory) is a RuntimeError
        if type(e).__name__ != "OutOfMemoryError":
            raise
        log.debug("the failure's traceback", exc_info=True)
        print(f"attnmt: error: {OUT_OF_MEMORY} ({_one_line(str(e))[:200]})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("attnmt: interrupted", file=sys.stderr)
        return 130
