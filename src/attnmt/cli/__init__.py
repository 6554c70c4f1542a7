"""The ``attnmt`` command line: download, prepare, train, train-vectors, translate, evaluate, score,
plot-attention, plot-training, plot-positions, serve, import (MarianMT) and export (CTranslate2, ONNX, a
web page).

User mistakes (bad options, bad configuration, missing, malformed or unwritable files) print one
line to stderr, ``attnmt: error: ...``, and exit with status 2; no traceback (``-v`` adds it, as a
debug message). Options are checked by their argparse types (every number has a range, shown in
its help: counts from 1, finite numbers within the bounds of ``attnmt.ranges`` that the
configuration's keys share) and outputs are checked to be writable before any work starts. A
failure of the environment (``attnmt.errors.EnvironmentFailure``: a worker process killed, a
library that raised, a full disk, a network that refuses a download; and memory exhaustion) prints
``attnmt: error: environment: ...`` and exits with status 1; a stop signal exits with 128 + its
number. ``attnmt.errors.exit_status`` decides each status, in one place.
Programming errors (bugs) are not caught: they end with Python's traceback.

The commands live by family: ``training`` (train, prepare, train-vectors, distill), ``data``
(download), ``translating`` (translate, score, evaluate), ``interop`` (import, export),
``plots`` (plot-attention, plot-positions, plot-training) and ``serving`` (serve); each module
has an ``add_*_parser(sub)`` per command and its ``cmd_*`` functions. ``options`` holds the
argparse types, the checks of inputs and outputs and the option groups the commands share.

Library: argparse (standard library), tqdm for progress bars.
"""

from __future__ import annotations

import argparse
import logging
import sys

from attnmt import torchrun
from attnmt.cli import data, interop, plots, serving, training, translating
from attnmt.errors import ENVIRONMENT_FAILURE, AttnmtError, EnvironmentFailure, exit_status
from attnmt.oneline import one_line
from attnmt.signals import Interrupted

log = logging.getLogger("attnmt")
OUT_OF_MEMORY = ("out of memory: use smaller batches (train.batch_tokens, --batch-size), fewer --workers or a "
                 "smaller model, or free memory, and run the command again")

# Each command's parser, in the order of `attnmt --help`.
COMMANDS = (
    training.add_train_parser,
    training.add_prepare_parser,
    training.add_train_vectors_parser,
    training.add_distill_parser,
    data.add_download_parser,
    translating.add_translate_parser,
    interop.add_import_parser,
    interop.add_export_parser,
    translating.add_score_parser,
    plots.add_plot_attention_parser,
    plots.add_plot_positions_parser,
    plots.add_plot_training_parser,
    serving.add_serve_parser,
    translating.add_evaluate_parser,
)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``attnmt translate: error: ...``, exit 2), no usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``attnmt`` and its subcommands (:data:`COMMANDS`); each subcommand's
    ``func`` default is its ``cmd_*`` function."""
    parser = _Parser(prog="attnmt", description="Transformer neural machine translation")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def _log_level(args: argparse.Namespace) -> int:
    """``-v``: debug; ``-q``: warnings; else info. Under torchrun a rank other than 0 logs
    warnings and errors only (rank 0 alone logs progress)."""
    if args.verbose:
        level = logging.DEBUG
    elif args.quiet:
        level = logging.WARNING
    else:
        level = logging.INFO
    if not torchrun.is_main_process():
        level = max(level, logging.WARNING)
    return level


def main(argv: list[str] | None = None) -> int:
    """Run ``attnmt`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status: 0,
    2 for a user's mistake, 1 for a failure of the environment, 128 + N after stop signal N,
    130 after Ctrl-C (module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=_log_level(args), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    from attnmt.memory import tune_allocator

    tune_allocator()
    try:
        return args.func(args)
    except BaseException as e:  # noqa: BLE001 -- exit_status decides; a bug (None) is raised again
        status = exit_status(e)
        if status is None:
            raise
        log.debug("the traceback", exc_info=True)
        print(f"attnmt: {_message(e, status)}", file=sys.stderr)
        return status


def _message(error: BaseException, status: int) -> str:
    """The one line for ``error`` ending with exit ``status`` (:func:`attnmt.errors.exit_status`):
    'error: ...' for the user's input, 'error: environment: ...' for a failure of the machine, a
    library or the network, the stop's own words for a signal."""
    if isinstance(error, Interrupted):
        return one_line(str(error))
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        detail = "" if isinstance(error, MemoryError) else f" ({one_line(str(error))[:200]})"
        return f"error: environment: {OUT_OF_MEMORY}{detail}"
    if isinstance(error, OSError) and not isinstance(error, (AttnmtError, EnvironmentFailure)):
        text = f"{str(error.filename) + ': ' if error.filename else ''}{error.strerror or error}"
    else:
        text = one_line(str(error))
    return f"error: environment: {text}" if status == ENVIRONMENT_FAILURE else f"error: {text}"
