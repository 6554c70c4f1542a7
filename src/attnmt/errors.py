"""The errors attnmt raises for what is not a bug in attnmt; the CLI prints each as one line, no traceback.

Two kinds, told apart by the exit status (``attnmt.cli.main``):

* :class:`AttnmtError`: the user's input, configuration or files are wrong (exit status 2): the
  message names the file or option and the problem.
* :class:`EnvironmentFailure`: the machine or a library failed on input attnmt accepted (exit
  status 1): a worker process killed, a C++ compiler that does not work under ``torch.compile``,
  an engine library (CTranslate2, ONNX Runtime, the ONNX exporter, gensim) that raised, a full
  disk. The message names what failed and what to do. Each place where attnmt hands work to a
  library or another process raises it through :func:`library_call`; memory exhaustion
  (``MemoryError``) is mapped in the CLI itself, wherever it happens.

A bug in attnmt itself is neither: it keeps Python's traceback.
"""

from __future__ import annotations

import errno
from contextlib import contextmanager
from typing import Iterator


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


class EnvironmentFailure(Exception):
    """The environment failed, not the input and not attnmt (module docstring): the message
    names what failed and what to do. Not an :class:`AttnmtError`, so that code which answers a
    user's mistake (a server's 400) does not take it for one."""


class DiskFull(WriteError, EnvironmentFailure):
    """A write failed for want of space (``ENOSPC``, ``EDQUOT``) or by an I/O error of the device
    (``EIO``): a :class:`WriteError` that the CLI reports as a failure of the environment."""


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
