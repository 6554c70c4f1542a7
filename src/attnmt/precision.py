"""The numeric precision a job runs at: float32, bfloat16 autocast, or int8 translation.

bfloat16 is fast on CPU only where oneDNN has bfloat16 kernels: x86 CPUs with AVX-512 (natively
with AVX-512 BF16 or AMX) and Arm CPUs with the BF16 extension. Elsewhere, e.g. on AVX2-only
CPUs, PyTorch falls back to a generic kernel that is slower than float32 by two orders of
magnitude (benchmarks/RESULTS.md), so :func:`effective_precision` turns a 'bf16' request into
'fp32' there and logs a warning once.

Library: torch (``torch.autocast``; oneDNN's capability probe).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")


@functools.cache
def cpu_bf16_is_fast() -> bool:
    """Whether this CPU has oneDNN bfloat16 matmul kernels.

    Asks PyTorch's ``torch.ops.mkldnn._is_mkldnn_bf16_supported``; where that private probe is
    missing, whether ``torch.backends.cpu.get_cpu_capability()`` names AVX-512.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


_warned: set[str] = set()


def effective_precision(precision: str, what: str = "training") -> str:
    """The precision to run at: ``precision`` itself, except 'bf16' on a CPU without fast
    bfloat16 kernels (:func:`cpu_bf16_is_fast`), which becomes 'fp32' with a warning logged
    once per ``what``.

    Args:
        precision: 'fp32', 'bf16' or 'int8' (returned unchanged unless 'bf16').
        what: the job ('training', 'translation'), for the warning's text.
    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use {', '.join(PRECISIONS)}")
    if precision != "bf16" or cpu_bf16_is_fast():
        return precision
    if what not in _warned:
        _warned.add(what)
        log.warning("precision bf16 asked for, but this CPU (%s) has no fast bfloat16 matmul kernels, where "
                    "bf16 runs far slower than float32: %s in fp32 instead",
                    torch.backends.cpu.get_cpu_capability(), what)
    return "fp32"


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bfloat16 autocast (``torch.autocast``) when ``precision == 'bf16'``, else a no-op context.

    Under it, matmuls and linear layers run in bfloat16 while reductions such as softmax and
    layer normalisation stay in float32 (PyTorch's autocast op lists).
    """
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
