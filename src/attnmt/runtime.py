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
pages back only for them to be faulted in again, the cost this module exists to avoid. Two
things limit it: training never holds the (N, V) logits (``attnmt.train.losses``), and
``tune_allocator`` keeps glibc to one arena (``M_ARENA_MAX`` 1), so that all threads share
one heap instead of fragmenting one each: on the bf16 machine 150 bf16 updates peaked at 2583
MiB instead of 2890 at the same speed; in float32 on an AVX2 machine it changed neither (peak
1.45 and 1.43 vs 1.44 and 1.46 GiB; 2,787 and 2,810 vs 2,712 and 2,622 target tokens/s,
``benchmarks/ab_train.py --updates 150``).

Most of that fragmentation happens within one update, so trimming does not help: in float32 on
the AVX2 machine (100 updates of the benchmark configuration, 2026-11-23) at most 0.68 GiB was
in use at once (``mallinfo2`` sampled every 2 ms) while the heap spanned 1.0-1.1 GiB, already
from update 25. ``malloc_trim(0)`` after every update made training ~30% slower (1,777-2,146
against 2,680-3,075 target tokens/s) and lowered the peak only from 1.33 to 1.29 GiB; mmap for
blocks from 4 MiB (``M_MMAP_THRESHOLD``) and PyTorch's transparent huge pages
(``THP_MEM_ALLOC_ENABLE=1``), alone or together, were within 0.06 GiB of the peak and no faster.

bfloat16 is fast only where oneDNN has kernels for it: CPUs with AVX-512 BF16 or AMX (native;
4.2x the float32 matmul rate on our benchmark machine) or plain AVX-512 (emulated; not measured
by us). Elsewhere PyTorch falls back to a slow generic kernel: on an AVX2-only AMD EPYC a
2048x2048 bfloat16 matmul ran at 0.3 GFLOP/s against 166 GFLOP/s in float32, so a bf16 training
run would be hundreds of times slower. ``effective_precision`` turns a 'bf16' request into 'fp32'
there, with a warning.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_ONEDNN_CACHE_CAPACITY = "16"  # compiled oneDNN primitives kept (default 1024)
_done = False


def tune_allocator() -> bool:
    """Keep freed memory in the glibc heap (no mmap below 32 MiB, no trimming, one arena) and
    cap oneDNN's primitive cache (see the module docstring). Call it before the first tensor op.

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
        ok = (libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**30) == 1
              and libc.mallopt(_M_ARENA_MAX, 1) == 1)
    except (OSError, AttributeError):
        return False
    _done = ok
    log.debug("glibc allocator tuned: %s", ok)
    return ok


@functools.cache
def cpu_bf16_is_fast() -> bool:
    """Whether this CPU has oneDNN bfloat16 matmul kernels (x86 with AVX-512, or Arm with BF16
    instructions), as reported by PyTorch's ``torch.ops.mkldnn._is_mkldnn_bf16_supported``;
    where that private probe is missing, whether ``torch.backends.cpu.get_cpu_capability()``
    names AVX-512."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


_warned: set[str] = set()


def effective_precision(precision: str, what: str = "training") -> str:
    """The precision to run at: ``precision`` itself, except 'bf16' on a CPU without fast
    bfloat16 kernels (``cpu_bf16_is_fast``), which becomes 'fp32' with a warning logged once
    per ``what`` ('training', 'translation'): there bf16 is slower than float32, not faster.

    Args:
        precision: 'fp32', 'bf16' or 'int8' (returned unchanged unless 'bf16').
        what: the job, for the warning's text.
    """
    if precision != "bf16" or cpu_bf16_is_fast():
        return precision
    import torch

    if what not in _warned:
        _warned.add(what)
        log.warning("precision bf16 asked for, but this CPU (%s) has no fast bfloat16 matmul kernels, where "
                    "bf16 runs far slower than float32: %s in fp32 instead",
                    torch.backends.cpu.get_cpu_capability(), what)
    return "fp32"


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, in MiB (None where the platform has no
    ``resource`` module, e.g. Windows). Linux reports ``ru_maxrss`` in KiB, macOS in bytes."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
