"""What the commands share: argparse types (every number has a range, shown in its help), the
checks that inputs can be read and outputs written before any work starts, standard input and
output, and the option groups, each declared once here and added by every command that takes it.

Library: argparse (standard library).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attnmt import ranges
from attnmt.errors import AttnmtError, WriteError, write_error
from attnmt.names import canonical_name
from attnmt.ranges import C_INT_MAX, Range


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
    from attnmt.atomic import writes_in_place

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


def read_input(path: str | None) -> list[str]:
    """The lines of ``path`` (plain or .gz), or of standard input where it is None or '-'.

    Raises:
        AttnmtError: standard input is closed. DataError: an unreadable or undecodable file.
    """
    from attnmt.data.text import decode_lines, read_lines

    if path is None or path == "-":
        check_input_file(path, "--input")
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(path)


def write_output(path: str | None, lines: list[str]) -> None:
    """Write ``lines`` (each ended by a newline) to ``path`` atomically, or to standard output
    where it is None or '-'.

    Raises:
        WriteError: standard output refused the text (``DiskFull`` where the disk is full;
            ``attnmt.errors.write_error``).
    """
    write_document(path, "".join(line + "\n" for line in lines))


def write_document(path: str | None, data: str | bytes) -> None:
    """Write ``data`` as it is (text as UTF-8, its line breaks unchanged; bytes such as a docx)
    to ``path`` atomically, or to standard output where it is None or '-'.

    Raises:
        WriteError: the file or standard output refused the data (``DiskFull`` where the disk is
            full; ``attnmt.errors.write_error``).
    """
    from attnmt.atomic import atomic_write

    if path is None or path == "-":
        try:
            if isinstance(data, bytes):
                sys.stdout.buffer.write(data)
            else:
                sys.stdout.write(data)
            sys.stdout.flush()
        except OSError as e:  # > /dev/full, a closed pipe
            raise write_error(f"standard output: cannot write: {e.strerror or e}", e) from None
    elif isinstance(data, bytes):
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    else:
        atomic_write(path, lambda tmp: Path(tmp).write_text(data, encoding="utf-8", newline=""))


def add_set_option(p: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable, ``args.set``): a key of the command's YAML configuration."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration key, e.g. --set train.max_steps=2000")


def add_data_dir_option(p: argparse.ArgumentParser) -> None:
    """``--data-dir``: where the datasets are read from (``args.data_dir``, None: $ATTNMT_DATA)."""
    p.add_argument("--data-dir", help="local dataset directory (holding multi30k/); default $ATTNMT_DATA")


def add_device_option(p: argparse.ArgumentParser) -> None:
    """``--device`` (``args.device``, None: the configuration's)."""
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps; default from the configuration (train.device "
                   "to train, the model's decode.device to translate)")


def add_thread_options(p: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--inter-threads``: the CPU threads of a translator."""
    p.add_argument("--threads", type=in_range(ranges.THREADS), help="CPU threads per batch "
                   f"{range_help(ranges.THREADS)} (default: PyTorch's; with "
                   "--inter-threads N, the cores shared out among the N)")
    p.add_argument("--inter-threads", type=in_range(ranges.THREADS), default=1, metavar="N",
                   help=f"batches translated at the same time {range_help(ranges.THREADS)}, each with --threads "
                   "threads (default 1); on a small "
                   "CPU, --inter-threads 2 --threads 1 translates a file faster than --threads 2")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The model a command loads and how: ``--model``, ``--weights``, ``--precision``,
    ``--attention``, the thread options and ``--device``."""
    p.add_argument("--model", required=True, help="model directory written by 'attnmt train'")
    p.add_argument("--weights", help="a .safetensors file to use instead of MODEL/model.safetensors")
    p.add_argument("--precision", type=canonical_name, choices=["auto", "fp32", "bf16", "int8"],
                   help="inference precision: fp32, bf16, int8 (dynamic quantisation), or auto (fp32 or bf16, "
                        "whichever searches the model faster on this CPU, timed once per CPU model and cached); "
                        "default from the model's config")
    p.add_argument("--attention", type=canonical_name, choices=["explicit", "fused"],
                   help="attention kernel: the explicit formula or PyTorch's fused one; default from the model's "
                        "config")
    add_thread_options(p)
    add_device_option(p)


def add_search_options(p: argparse.ArgumentParser) -> None:
    """``--beam-size``, ``--batch-size`` and ``--length-penalty`` (None: the model's decode section)."""
    p.add_argument("--beam-size", type=in_range(ranges.BEAM_SIZE), help="beam size K (1 = greedy) "
                   f"{range_help(ranges.BEAM_SIZE)}; default from the model's config")
    p.add_argument("--batch-size", type=in_range(ranges.BATCH_SIZE), help="sentences per batch "
                   f"{range_help(ranges.BATCH_SIZE)}; default from the model's config")
    p.add_argument("--length-penalty", type=in_range(ranges.LENGTH_PENALTY),
                   help=f"length penalty alpha {range_help(ranges.LENGTH_PENALTY)}; default from the model's config")


def add_decoding_options(p: argparse.ArgumentParser) -> None:
    """The options of a command that translates with a model: the model options, the search
    options and ``--tgt-lang``."""
    add_model_options(p)
    add_search_options(p)
    p.add_argument("--tgt-lang", metavar="LANG", help="the language to translate into: required by a multilingual "
                   "model (one of its tokenizer.target_languages); a bilingual model's own target or nothing")


def add_stopping_options(p: argparse.ArgumentParser) -> None:
    """Beam search's stopping rule: ``--early-stopping`` and ``--patience`` (None: the model's
    decode section; ``attnmt.cli.translators.apply_stopping_options``)."""
    p.add_argument("--early-stopping", type=true_false, metavar="{true,false}",
                   help="beam search's stopping rule: true stops a sentence once beam size x patience hypotheses have "
                        "finished (CTranslate2's rule), false once no open hypothesis can win (exact); default from "
                        "the model's config (decode.early_stopping)")
    p.add_argument("--patience", type=in_range(ranges.PATIENCE), metavar="P",
                   help="with early stopping: wait for round(beam size x P) finished hypotheses, P from 1 to "
                        f"{ranges.number_text(ranges.PATIENCE.high)} (default 1)")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine`` and ``--compute-type`` (``attnmt.cli.translators.engine_translator``)."""
    p.add_argument("--engine", type=canonical_name, choices=["native", "ctranslate2", "onnxruntime"], default="native",
                   help="native: PyTorch; ctranslate2 / onnxruntime: --model is a directory from 'attnmt export' "
                        "(docs/engines.md says when to pick which)")
    p.add_argument("--compute-type", type=canonical_name, default="default",
                   help="ctranslate2 engine: CTranslate2's compute type (default: the exported weights' type)")


def add_testset_options(p: argparse.ArgumentParser, read: str) -> None:
    """``--testset``, ``--src-lang`` and ``--data-dir``: a named test set, ``read`` saying which
    of its sides the command reads."""
    p.add_argument("--testset", metavar="DATASET:SPLIT",
                   help=f"a named test set, e.g. multi30k:test_2016_flickr: {read} of the model's direction, from "
                        "--data-dir or $ATTNMT_DATA, else downloaded once and checked (SHA-256)")
    p.add_argument("--src-lang", metavar="LANG", help="the source language of --testset, for a model that reads "
                   "several (its target language: --tgt-lang); of a document, for its sentence splitter")
    add_data_dir_option(p)
