"""Process-level settings that make PyTorch on CPU fast: the allocator and threads.

glibc's malloc serves large blocks (the logits of a training step are ~100 MB) with mmap and
returns them to the kernel on free, so every step pays page faults to zero fresh memory again;
on the 2-core machine of our benchmarks that was a third of a training step. ``tune_allocator``
asks glibc (through ``mallopt``) to serve all blocks from its heap and keep freed memory, which
is what jemalloc/tcmalloc users get by preloading those allocators. It is called by the CLI at
the start of a command, never at import time, and is a no-op where glibc is absent.

oneDNN (the library behind PyTorch's bfloat16 matmuls on CPU) caches up to 1024 compiled
primitives by default, one per distinct shape, each with its own buffers; token batches and
beam search produce a new shape almost every step, so the cache grew a bf16 training run by
~1 GB (3.25 GB peak RSS instead of 2.3 GB for the benchmark configuration) and a 56-minute run
to 6.6 GB, without making it faster. ``tune_allocator`` caps it at 16 primitives through
``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, which oneDNN reads at its first use (an explicit setting in
the environment wins).

Known cost of keeping freed memory: the glibc heap fragments when every batch has a new shape.
After 100 bf16 updates of the benchmark configuration its heap spanned 2.3 GiB of which 0.46
GiB was in use (``mallinfo2``; ``malloc_trim(0)`` would bring the process from 2.4 to 0.7 GiB,
and repeating 10 batch shapes instead kept it at 1.5 GiB), so peak RSS creeps up over the first
few hundred updates (2.4 GiB at 100, 2.9 GiB at 300). Trimming every few updates gives the
pages back only for them to be faulted in again, the cost this module exists to avoid.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_ONEDNN_CACHE_CAPACITY = "16"  # compiled oneDNN primitives kept (default 1024)
_done = False


def tune_allocator() -> bool:
    """Keep freed memory in the glibc heap (no mmap for large blocks, no trimming) and cap
    oneDNN's primitive cache (see the module docstring). Call it before the first tensor op.

    Returns:
        True if glibc accepted the settings, False if not applicable (non-Linux, musl, ...).
    """
    global _done
    if _done:
        return True
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", _ONEDNN_CACHE_CAPACITY)
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**30) == 1
    except (OSError, AttributeError):
        return False
    _done = ok
    log.debug("glibc allocator tuned: %s", ok)
    return ok


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, in MiB (None where the platform has no
    ``resource`` module, e.g. Windows). Linux reports ``ru_maxrss`` in KiB, macOS in bytes."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
