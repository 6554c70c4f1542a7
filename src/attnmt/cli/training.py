"""The commands that make a model or its inputs from a YAML configuration: ``train``,
``prepare`` (token shards), ``train-vectors`` (fastText word vectors) and ``distill`` (a
student trained on a teacher's translations).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
from pathlib import Path

from attnmt import ranges, torchrun
from attnmt.cli.options import (add_data_dir_option, add_device_option, add_engine_options, add_search_options,
                                add_set_option, add_stopping_options, add_thread_options, check_output_dir,
                                check_output_file, in_range, positive_int, range_help)
from attnmt.cli.translators import engine_translator, with_stopping_options
from attnmt.errors import AttnmtError, CheckpointError, EnvironmentFailure, TrainingError
from attnmt.names import canonical_name
from attnmt.oneline import json_line, one_line
from attnmt.ranges import C_INT_MAX, Range
from attnmt.signals import StopSignals

log = logging.getLogger("attnmt")

# train-vectors: fastText's passes over the corpus and its minimum word count
VECTOR_EPOCHS = Range(1, 1000, integer=True)
MIN_COUNT = Range(1, C_INT_MAX, integer=True)


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` and ``--device`` as configuration overrides (``--device D`` is ``--set train.device=D``)."""
    return args.set + ([f"train.device={args.device}"] if args.device else [])


def _signal_exit(interrupted_by: str | None) -> int:
    """The exit status of a finished or stopped command: 0, or after a stop signal the
    conventional 128 + its number."""
    if interrupted_by:
        return 128 + signal.Signals[interrupted_by].value
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.train.loop import train
    from attnmt.train.peers import PeerLost
    from attnmt.train.setup import RunExistsError
    from attnmt.train.stop import NonFiniteError

    config = load_config(args.config, _overrides(args))
    is_main = torchrun.is_main_process()  # under torchrun, rank 0 alone writes and prints
    if is_main:
        check_output_dir(args.output, "--output")
    resume = args.resume or (args.auto_resume and is_main and Path(args.output).is_dir())
    try:
        result = train(config, args.output, resume=resume, data_dir=args.data_dir,
                       allow_data_change=args.allow_data_change)
    except RunExistsError as e:
        raise CheckpointError(f"{e}; pass --resume or --auto-resume to continue it or choose another --output"
                              ) from None
    except PeerLost as e:
        raise EnvironmentFailure(f"{e}; continue with --auto-resume or --resume") from None
    except NonFiniteError as e:
        raise TrainingError(f"{e}: lower the learning rate (train.lr or train.lr_factor) or set train.clip_norm, "
                            "then --resume") from None
    if is_main:
        print(json_line(result.__dict__))
    if result.interrupted_by and is_main:
        log.warning("%s: interrupted by %s; continue with --resume or --auto-resume", args.output,
                    result.interrupted_by)
    return _signal_exit(result.interrupted_by)


def cmd_distill(args: argparse.Namespace) -> int:
    from attnmt.config import load_config
    from attnmt.distill import distill, teacher_record
    from attnmt.languages import bilingual_languages, target_language

    config = load_config(args.config, _overrides(args))
    check_output_dir(args.output, "--output")
    from attnmt.device import resolve_device

    resolve_device(config.train.device)  # the student's device: refused now, not after the teacher has translated
    teacher = with_stopping_options(engine_translator(args), args)
    decode = teacher.config.decode.model_copy(update={k: v for k, v in (
        ("beam_size", args.beam_size), ("length_penalty", args.length_penalty), ("batch_size", args.batch_size))
        if v is not None})
    teacher.config.decode = decode
    tgt_lang = bilingual_languages(config)[1]  # the student's target: the teacher must translate into it
    target_language(teacher.config, tgt_lang)  # before anything is written
    teacher.translate([], tgt_lang=tgt_lang)  # no line: refuses what the teacher's engine lacks, writing nothing

    def translate(lines: list[str]) -> list[str]:
        return [one_line(r.text) for r in teacher.translate(lines, tgt_lang=tgt_lang)]

    record = teacher_record(args.model, args.engine, decode.model_dump(mode="json"), tgt_lang)
    with StopSignals(raising=True):  # finished chunks stay for a rerun; the one in progress is dropped
        result = distill(config, args.output, translate, record, mix_original=args.mix_original,
                         data_dir=args.data_dir)
    print(json_line(result.__dict__))
    return _signal_exit(result.interrupted_by)


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
    print(json_line({"output": args.output, "lines": train.lines, "pairs": train.pairs, "dropped": train.dropped,
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
    from attnmt.atomic import atomic_write

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


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model from a YAML configuration")
    p.add_argument("config", help="YAML configuration (see configs/)")
    p.add_argument("--output", required=True, help="run directory to create (the model directory)")
    add_set_option(p)
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    again.add_argument("--auto-resume", action="store_true",
                       help="continue the run in --output from its last checkpoint if --output exists (with every "
                            "check of --resume), else start it: one command line for the first start, a rerun and "
                            "torchrun's --max-restarts (rank 0's --output decides)")
    add_data_dir_option(p)
    add_device_option(p)
    p.add_argument("--allow-data-change", action="store_true",
                   help="with --resume or --auto-resume: go on although the training data, corpus weights or "
                        "batching settings changed since the checkpoint (otherwise refused)")
    p.set_defaults(func=cmd_train)


def add_prepare_parser(sub) -> None:
    p = sub.add_parser("prepare", help="encode and filter a configuration's corpora once into token "
                                       "shards (then train with data.prepared: DIR)")
    p.add_argument("config", help="YAML configuration (its data and tokenizer sections)")
    p.add_argument("--output", required=True, help="directory to create")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                   help=f"encoding processes (1 to {C_INT_MAX}, at most the CPU count used; default: the CPU count)")
    p.add_argument("--tokenizers-from", metavar="MODEL_DIR",
                   help="use this model directory's tokenizers instead of training new ones (default: the "
                        "configuration's train.init_from, if any)")
    add_set_option(p)
    add_data_dir_option(p)
    p.set_defaults(func=cmd_prepare)


def add_train_vectors_parser(sub) -> None:
    p = sub.add_parser("train-vectors", help="train fastText word vectors (.vec) on a configuration's training "
                       "side, tokenized as its word-level tokenizer does (gensim)")
    p.add_argument("config", help="YAML configuration (its data and tokenizer sections are used)")
    p.add_argument("--side", type=canonical_name, choices=["src", "tgt"], required=True, help="which side of the training corpus")
    p.add_argument("--output", required=True, help=".vec file to write")
    p.add_argument("--dim", type=in_range(ranges.WIDTH), help=f"vector size {range_help(ranges.WIDTH)} (default: "
                   "the configuration's model.d_model)")
    p.add_argument("--epochs", type=in_range(VECTOR_EPOCHS), default=5,
                   help=f"training epochs over the corpus {range_help(VECTOR_EPOCHS)} (default 5)")
    p.add_argument("--min-count", type=in_range(MIN_COUNT), default=1,
                   help=f"ignore words seen fewer times {range_help(MIN_COUNT)} (default 1)")
    add_set_option(p)
    add_data_dir_option(p)
    p.set_defaults(func=cmd_train_vectors)


def add_distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="sequence-level knowledge distillation: translate a student configuration's "
                       "training source with a teacher, then train the student on the translations")
    p.add_argument("config", help="the student's YAML configuration (its model, training and data)")
    p.add_argument("--teacher", dest="model", required=True, metavar="TEACHER_DIR",
                   help="the teacher: a model directory (trained, fine-tuned or imported), or an 'attnmt export' "
                        "directory with --engine ctranslate2/onnxruntime")
    p.add_argument("--output", required=True, help="the student's run directory (distill/ holds the translations); "
                   "run the same command again to resume")
    add_search_options(p)
    p.add_argument("--mix-original", type=in_range(Range(0.0, ranges.CORPUS_WEIGHT.high)), default=0.0, metavar="W",
                   help="also train on the original targets with weight W in data.train, 0 to "
                        f"{ranges.number_text(ranges.CORPUS_WEIGHT.high)} (default 0: distilled only)")
    add_thread_options(p)
    add_device_option(p)
    add_data_dir_option(p)
    add_set_option(p)
    p.set_defaults(weights=None, precision=None, attention=None)
    add_stopping_options(p)
    add_engine_options(p)
    p.set_defaults(func=cmd_distill)
