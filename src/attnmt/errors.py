"""The errors attnmt raises for what is not a bug in attnmt; the CLI prints each as one line, no traceback.

Two kinds, told apart by the exit status, which :func:`exit_status` decides for every command
(``attnmt.cli.main`` prints the one line and returns it):

* :class:`AttnmtError`: the user's input, configuration or files are wrong (exit status 2): the
  message names the file or option and the problem.
* :class:`EnvironmentFailure`: the machine or a library failed on input attnmt accepted (exit
  status 1): a worker process killed, a C++ compiler that does not work under ``torch.compile``,
  an engine library (CTranslate2, ONNX Runtime, the ONNX exporter, gensim) that raised, a full
  disk. The message names what failed and what to do. Each place where attnmt hands work to a
  library or another process raises it through :func:`library_call`; a network that refuses or
  drops a download is one too (:class:`NetworkFailure`); so are memory exhaustion
  (``MemoryError``, ``torch.OutOfMemoryError``) and an ``OSError`` of the disk
  (:data:`ENVIRONMENT_ERRNOS`), wherever they happen.

A stop signal is a third outcome (``attnmt.signals.Interrupted``: 128 + the signal's number, 130
after Ctrl-C). A bug in attnmt itself is none of these: it keeps Python's traceback, so the
places that user input reaches raise a class of this module (:class:`OptionError` where the code
checks an option's value), never a bare ``ValueError``.
"""

from __future__ import annotations

import errno
import json
from contextlib import contextmanager
from typing import Iterator

from attnmt.signals import Interrupted


class AttnmtError(Exception):
    """Base class for errors caused by input, configuration or files, not by a bug."""


class ConfigError(AttnmtError):
    """An invalid or unreadable configuration."""


class DataError(AttnmtError):
    """Unreadable or inconsistent corpus files (names the file and line)."""


class CheckpointError(AttnmtError):
    """A missing, incomplete or incompatible model or checkpoint directory."""


class WriteError(AttnmtError):
    """A file cannot be written (no permission, missing directory); names the file."""


class TrainingError(AttnmtError):
    """Training cannot go on (e.g. too many non-finite updates in a row); the run is resumable."""


class OptionError(AttnmtError, ValueError):
    """An option's or a setting's value that the code refuses (nbest above the beam size, an
    unknown precision, a layer the model lacks), wherever it was given: on the command line, in a
    configuration, in a request. A ``ValueError`` too, so that pydantic's validators and the
    server's 400 answers take it as one."""


class EnvironmentFailure(Exception):
    """The environment failed, not the input and not attnmt (module docstring): the message
    names what failed and what to do. Not an :class:`AttnmtError`, so that code which answers a
    user's mistake (a server's 400) does not take it for one."""


class DiskFull(WriteError, EnvironmentFailure):
    """A write failed for want of space (``ENOSPC``, ``EDQUOT``) or by an I/O error of the device
    (``EIO``): a :class:`WriteError` that the CLI reports as a failure of the environment."""


class NetworkFailure(EnvironmentFailure):
    """A server that cannot be reached, refuses the connection, drops it or sends nothing in time:
    the network or the server, not the user's input."""


ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})  # the disk, not the user's choice of path


def write_error(message: str, error: BaseException) -> WriteError:
    """The error to raise for a failed write, ``message`` naming the file: :class:`DiskFull`
    where ``error`` is an ``OSError`` with an errno of :data:`ENVIRONMENT_ERRNOS`, else
    :class:`WriteError`."""
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS:
        return DiskFull(f"{message}; free some space (or fix the disk) and run the command again")
    return WriteError(message)


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type's name where it has none."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


@contextmanager
def library_call(what: str, hint: str, errors: type[BaseException] | tuple[type[BaseException], ...] = Exception
                 ) -> Iterator[None]:
    """A boundary where attnmt hands work to a library or another process: an exception of
    ``errors`` raised inside becomes an :class:`EnvironmentFailure`, ``"{what} failed: {first
    line of the library's message}; {hint}"``. attnmt's own errors (:class:`AttnmtError`,
    :class:`EnvironmentFailure`), ``MemoryError`` and stop signals pass unchanged.

    Args:
        what: the library and the work, e.g. ``"CTranslate2 (translate_batch)"``.
        hint: what the user can do, e.g. ``"translate with --engine native"``.
        errors: the exception types the library raises for a failure; others pass unchanged.
    Raises:
        EnvironmentFailure: the library raised one of ``errors``.
    """
    try:
        yield
    except (AttnmtError, EnvironmentFailure, MemoryError):
        raise
    except errors as e:
        raise EnvironmentFailure(f"{what} failed: {first_line(e)}; {hint}") from e


# The exit status of each kind of failure (module docstring); the first class an error is an
# instance of decides, so DiskFull (a WriteError and an EnvironmentFailure) exits 1.
EXIT_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (EnvironmentFailure, 1),
    (MemoryError, 1),
    (AttnmtError, 2),
    # bytes that are not UTF-8, text that is not JSON: a file of the user's that a library read
    # without naming it (the places attnmt reads a file name it; these are a net below them)
    (UnicodeDecodeError, 2),
    (json.JSONDecodeError, 2),
)
USER_ERROR, ENVIRONMENT_FAILURE = 2, 1


def exit_status(error: BaseException) -> int | None:
    """The exit status for ``error``: 1 for a failure of the environment (:class:`EnvironmentFailure`,
    ``MemoryError``, ``torch.OutOfMemoryError``, an ``OSError`` whose errno is in
    :data:`ENVIRONMENT_ERRNOS`), 2 for the user's input (:class:`AttnmtError`; bytes that are not
    UTF-8 or text that is not JSON; any other ``OSError``: a path that does not exist or may not
    be read), 128 + N for stop signal N
    (``attnmt.signals.Interrupted``'s ``exit_code``) and 130 for ``KeyboardInterrupt``; None for
    anything else, a bug, which keeps its traceback."""
    if isinstance(error, Interrupted):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return 130
    for kind, status in EXIT_STATUS:
        if isinstance(error, kind):
            return status
    if type(error).__name__ == "OutOfMemoryError":  # torch's, a RuntimeError: a GPU's memory
        return ENVIRONMENT_FAILURE
    if isinstance(error, OSError):
        return ENVIRONMENT_FAILURE if error.errno in ENVIRONMENT_ERRNOS else USER_ERROR
    return None
