"""Process memory on CPU: allocator settings for fast training, and the peak resident set size.

glibc's malloc serves large blocks with ``mmap`` and returns them to the kernel when they are
freed, so a training step that allocates the same large activations every time pays page
faults to zero fresh memory again and again. :func:`tune_allocator` asks glibc (``mallopt``)
to serve blocks up to 32 MiB from its heap, to keep freed memory instead of trimming it, and
to use one arena for all threads (fewer half-empty heaps). This is what users of jemalloc or
tcmalloc get by preloading those allocators. The cost is some heap fragmentation: batches of
many different shapes leave holes, so the peak resident memory is above what is in use at once.

oneDNN, the library behind PyTorch's bfloat16 matmuls on CPU, caches up to 1024 compiled
primitives by default, one per distinct shape, each with its own buffers; token batches and
beam search produce a new shape almost every step, so the cache grows by gigabytes over a long
run without making it faster. :func:`tune_allocator` caps it at 16 primitives through the
``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` environment variable, which oneDNN reads at its first use
(a value already in the environment wins).

Figures for both settings are in benchmarks/RESULTS.md.

Library: ctypes (glibc's ``mallopt``), resource.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 * 2**20  # blocks below this come from the heap
TRIM_THRESHOLD_BYTES = 2**30  # free memory at the top of the heap kept before trimming
ONEDNN_CACHE_CAPACITY = "16"  # compiled oneDNN primitives kept (oneDNN's default: 1024)
_tuned = False


def tune_allocator() -> bool:
    """Keep freed memory in the glibc heap and cap oneDNN's primitive cache (module docstring).

    Call it at the start of a command, before the first tensor operation; the CLI does. Never
    called at import time.

    Returns:
        True if glibc accepted the settings, False where they do not apply (not Linux, or a C
        library without ``mallopt``).
    """
    global _tuned
    if _tuned:
        return True
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = _libc()
        ok = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
              and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
              and libc.mallopt(_M_ARENA_MAX, 1) == 1)
    except (OSError, AttributeError):
        return False
    _tuned = ok
    log.debug("glibc allocator tuned: %s", ok)
    return ok


def _libc() -> ctypes.CDLL:
    """glibc by its soname, else where ``ctypes.util.find_library`` finds the C library (it runs
    ldconfig or a compiler in a subprocess, tens of milliseconds of every command's start).

    Raises:
        OSError: no C library can be loaded."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"))


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, in MiB (2**20 bytes); None where the platform
    has no ``resource`` module (Windows). Linux reports ``ru_maxrss`` in KiB, macOS in bytes."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
