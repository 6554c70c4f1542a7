"""Atomic writes: a file (or a directory) appears whole under its name, or not at all.

:func:`atomic_write` writes to a temporary name in the destination's directory, fsyncs the file,
renames it onto the destination (atomic on one filesystem) and fsyncs the directory, so that
after a crash, a kill or a full disk the destination holds the old content or the new, never a
torn file. :func:`publish` is its last half, for a writer that fills the temporary file itself
(a download that checks the file's digest before it is kept); :func:`swap_directory` renames a
staging directory onto its destination the same way. Every file attnmt writes goes through this
module, the bottom layer, so that ``data``, ``rundir``, ``train`` and the command line write
alike; nothing else in the package renames a file into place.

Library: os, tempfile (standard library).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from attnmt.errors import write_error


def writes_in_place(path: str | Path) -> bool:
    """Whether ``path`` names an existing device, pipe or socket (``/dev/null``, ``/dev/stdout``
    on a pipe or a terminal, a FIFO), which :func:`atomic_write` writes in place: renaming a
    file onto it would replace the device node (as root) or fail (in a directory such as /dev
    that only root may write)."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        return False
    target = path.resolve()
    return not target.exists() or not target.is_file()  # /proc/self/fd/1 of a pipe resolves to 'pipe:[N]'


def fsync_dir(directory: str | Path) -> None:
    """fsync a directory, so that a rename or a new file in it survives a crash (POSIX)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str | Path, path: str | Path) -> None:
    """Give the finished temporary file ``tmp`` (in ``path``'s directory) the permissions of a
    new file, fsync it, rename it onto ``path`` and fsync the directory.

    Raises:
        OSError: a step failed (the caller names the file and removes ``tmp``).
    """
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def atomic_write(path: str | Path, write: Callable[[str], None], *,
                 failures: tuple[type[BaseException], ...] = ()) -> None:
    """Call ``write(tmp_path)`` for a temporary file in ``path``'s directory and :func:`publish`
    it onto ``path``, so that after a crash or a full disk ``path`` holds the old content or the
    new, never a torn file. The temporary file is removed if anything fails; the parent
    directory is created if needed. A symbolic link is followed (the file it names is replaced,
    the link kept); a device, pipe or socket (:func:`writes_in_place`) is written directly,
    ``write(path)``.

    Args:
        path: the destination.
        write: writes the whole content to the path it is given.
        failures: exception types, besides ``OSError`` and ``RuntimeError`` (``torch.save``'s
            failed write), by which ``write`` reports a failed write (safetensors' error).
    Raises:
        WriteError: the file cannot be written (no permission, ...; :class:`attnmt.errors.DiskFull`
            for a full disk); ``path`` is unchanged.
    """
    path = Path(path)
    caught = (OSError, RuntimeError, *failures)
    if writes_in_place(path):
        try:
            write(str(path))
        except caught as e:
            raise write_error(f"{path}: cannot write: {_reason(e)}", e) from e
        return
    if path.is_symlink():  # replace the file a link names, never the link itself
        path = path.resolve()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)
        publish(tmp, path)
    except caught as e:
        raise write_error(f"{path}: cannot write: {_reason(e)}{_free_space(path.parent)}", e) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def swap_directory(staging: str | Path, output: str | Path) -> None:
    """Rename the finished directory ``staging`` onto ``output`` (beside it): an existing
    ``output`` is first renamed aside and removed once the new one is in place, so that
    ``output`` is at every moment the old directory or the new one, whole.

    Raises:
        OSError: a rename failed (the caller names the directory).
    """
    output = Path(output)
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}.old.{os.getpid()}")
        os.replace(output, old)
    os.replace(staging, output)
    fsync_dir(output.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


def _free_space(directory: Path) -> str:
    """' (N MiB free on the disk)', a hint when a write failed; '' if unknown."""
    try:
        return f" ({shutil.disk_usage(directory).free / 2**20:.0f} MiB free on the disk)"
    except OSError:
        return ""
