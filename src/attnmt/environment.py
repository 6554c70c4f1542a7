"""The environment variables attnmt reads, each read here and checked as the command line checks
its own options.

A number from the environment goes through the same :class:`attnmt.ranges.Range` as a number
from the parser, so that ``ATTNMT_DOWNLOAD_TIMEOUT=1e300`` or ``WORLD_SIZE=nan`` ends in one line
naming the variable (a :class:`attnmt.errors.ConfigError`, exit status 2) rather than in a
library's OverflowError. :data:`VARIABLES` lists every variable with what it holds; no other
module reads ``os.environ`` (a test walks the source for reads).

A variable set to the empty string (or to spaces) counts as unset, as the shell's ``VAR= cmd``
is commonly meant.

Library: ``os.environ``; the checks are :mod:`attnmt.ranges`'.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnmt import ranges
from attnmt.errors import ConfigError
from attnmt.ranges import C_INT_MAX, Range


@dataclass(frozen=True)
class Variable:
    """An environment variable attnmt reads: ``kind`` is 'number' (then ``range``), 'path',
    'url', 'command' or 'host' (a host name or address, read with :func:`raw`); ``meaning`` is what it sets, for the error messages and the docs."""

    name: str
    kind: str
    meaning: str
    range: Range | None = None


DOWNLOAD_TIMEOUT = Variable("ATTNMT_DOWNLOAD_TIMEOUT", "number", "seconds a downloaded file may take",
                            ranges.DOWNLOAD_SECONDS)
MULTI30K_URL = Variable("ATTNMT_MULTI30K_URL", "url", "the base URL of a Multi30k mirror")
DATA = Variable("ATTNMT_DATA", "path", "a local directory of registered datasets")
XDG_CACHE_HOME = Variable("XDG_CACHE_HOME", "path", "the cache directory (downloads and the precision cache go to "
                          "its attnmt/)")
PRECISION_CACHE = Variable("ATTNMT_PRECISION_CACHE", "path", "the file of precision auto's timings per CPU model")
CXX = Variable("CXX", "command", "the C++ compiler torch.compile builds CPU kernels with")
# torchrun's (torch.distributed.run) description of this process's place in the job
RANK = Variable("RANK", "number", "this process's rank in a torchrun job", Range(0, C_INT_MAX - 1, integer=True))
WORLD_SIZE = Variable("WORLD_SIZE", "number", "the processes of a torchrun job", Range(1, C_INT_MAX, integer=True))
LOCAL_RANK = Variable("LOCAL_RANK", "number", "this process's rank on its machine in a torchrun job",
                      Range(0, C_INT_MAX - 1, integer=True))
MASTER_ADDR = Variable("MASTER_ADDR", "host", "the address of a torchrun job's rendezvous host")
MASTER_PORT = Variable("MASTER_PORT", "number", "the port of a torchrun job's rendezvous host",
                       Range(1, 65535, integer=True))
MAX_RESTARTS = Variable("TORCHELASTIC_MAX_RESTARTS", "number", "torchrun's --max-restarts",
                        Range(0, C_INT_MAX, integer=True))
RESTART_COUNT = Variable("TORCHELASTIC_RESTART_COUNT", "number", "the restarts torchrun has made of this job",
                         Range(0, C_INT_MAX, integer=True))

VARIABLES: dict[str, Variable] = {v.name: v for v in (DOWNLOAD_TIMEOUT, MULTI30K_URL, DATA, XDG_CACHE_HOME,
                                                       PRECISION_CACHE, CXX, RANK, WORLD_SIZE, LOCAL_RANK,
                                                       MASTER_ADDR, MASTER_PORT, MAX_RESTARTS, RESTART_COUNT)}


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def raw(variable: Variable, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's text without surrounding spaces, None where unset or empty."""
    text = _environ(environ).get(variable.name, "").strip()
    return text or None


def number(variable: Variable, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The variable read as a number of its range (an int for a whole-number range), ``default``
    where unset.

    Raises:
        ConfigError: not a number, or outside the range: '{NAME}={text!r} is out of range: use ...'.
    """
    assert variable.range is not None, variable.name
    text = raw(variable, environ)
    if text is None:
        return default
    value: float | int | None
    try:
        value = int(text, 10) if variable.range.integer else float(text)
    except ValueError:
        value = None
    if value is None or not variable.range.contains(value):
        problem = "is not a number" if value is None else "is out of range"
        raise ConfigError(f"{variable.name}={text!r} ({variable.meaning}) {problem}: use {variable.range.describe()}")
    return value


def path(variable: Variable, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable read as a path (``~`` expanded), None where unset or empty."""
    text = raw(variable, environ)
    return None if text is None else os.path.expanduser(text)


def cache_home(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache directory: ``$XDG_CACHE_HOME`` where it is an absolute path, else ``~/.cache``.
    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG Base Directory Specification says (it would
    put the cache under whatever folder a command runs in)."""
    text = path(XDG_CACHE_HOME, environ)
    return Path(text) if text and os.path.isabs(text) else Path(os.path.expanduser("~")) / ".cache"


def url(variable: Variable, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable read as a base URL (http, https or file), None where unset or empty.

    Raises:
        ConfigError: not such a URL.
    """
    text = raw(variable, environ)
    if text is None:
        return None
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # 'http://[::1': an unclosed bracket
        parts = urllib.parse.urlsplit("")
    if parts.scheme.lower() not in ("http", "https", "file") or (parts.scheme.lower() != "file" and not parts.netloc):
        raise ConfigError(f"{variable.name}={text!r} ({variable.meaning}) is not a URL: use http://, https:// or "
                          f"file:// and a host, e.g. https://example.org/multi30k/")
    return text


def command(variable: Variable, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable read as a command name or path, None where unset or empty."""
    return raw(variable, environ)
