"""Process-level settings that make PyTorch on CPU fast: the allocator and threads.

glibc's malloc serves large blocks (the logits of a training step are ~100 MB) with mmap and
returns them to the kernel on free, so every step pays page faults to zero fresh memory again;
on the 2-core machine of our benchmarks that was a third of a training step. ``tune_allocator``
asks glibc (through ``mallopt``) to serve all blocks from its heap and keep freed memory, which
is what jemalloc/tcmalloc users get by preloading those allocators. It is called by the CLI at
the start of a command, never at import time, and is a no-op where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_allocator() -> bool:
    """Keep freed memory in the glibc heap (no mmap for large blocks, no trimming).

    Returns:
        True if glibc accepted the settings, False if not applicable (non-Linux, musl, ...).
    """
    global _done
    if _done:
        return True
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
