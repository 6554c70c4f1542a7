"""The numeric precision a job runs at: float32, bfloat16 autocast, float16 autocast with loss
scaling (CUDA training), or int8 translation.

bfloat16 is fast on CPU only where oneDNN has bfloat16 kernels: x86 CPUs with AVX-512 (natively
with AVX-512 BF16 or AMX) and Arm CPUs with the BF16 extension. Elsewhere, e.g. on AVX2-only
CPUs, PyTorch falls back to a generic kernel that is slower than float32 by two orders of
magnitude (benchmarks/RESULTS.md), so :func:`effective_precision` turns a 'bf16' request into
'fp32' there and logs a warning once.

On a GPU (:func:`training_precision`): 'bf16' autocast where the GPU has bfloat16 (NVIDIA
Ampere and later), 'fp16' autocast with ``torch.amp.GradScaler`` (Micikevicius et al., 2018,
"Mixed precision training": the loss is scaled up before the backward pass so that small
gradients do not underflow in float16, the gradients unscaled before clipping, and an update
with an inf/NaN gradient skipped while the scale is lowered). On MPS training runs in float32.

Library: torch (``torch.autocast``, ``torch.amp.GradScaler``; oneDNN's capability probe).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from attnmt.errors import OptionError
from attnmt.names import canonical_name

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
    precision = canonical_name(precision)
    if precision not in PRECISIONS:
        raise OptionError(f"unknown precision {precision!r}; use {', '.join(PRECISIONS)}")
    if precision != "bf16" or cpu_bf16_is_fast():
        return precision
    if what not in _warned:
        _warned.add(what)
        log.warning("precision bf16 asked for, but this CPU (%s) has no fast bfloat16 matmul kernels, where "
                    "bf16 runs far slower than float32: %s in fp32 instead",
                    torch.backends.cpu.get_cpu_capability(), what)
    return "fp32"


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bfloat16 autocast (``torch.autocast``) when ``precision == 'bf16'``, float16 autocast
    when 'fp16', else a no-op context.

    Under it, matmuls and linear layers run in the low precision while reductions such as
    softmax and layer normalisation stay in float32 (PyTorch's autocast op lists).
    """
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast(device_type=device_type, dtype=torch.float16)
    return contextlib.nullcontext()


TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")


def training_precision(precision: str, device_type: str) -> str:
    """The precision training runs at on a device of type ``device_type`` (module docstring).

    cpu: 'bf16' as :func:`effective_precision` decides; 'fp16' becomes 'fp32' (no fast float16
    matmuls on CPUs). cuda: 'bf16' where the GPU supports it, else 'fp16'; 'fp16' as asked.
    mps and others: 'fp32'. Every change is logged as a warning.

    Raises:
        ValueError: a precision outside 'fp32', 'bf16', 'fp16'.
    """
    precision = canonical_name(precision)
    if precision not in TRAINING_PRECISIONS:
        raise OptionError(f"unknown training precision {precision!r}; use {', '.join(TRAINING_PRECISIONS)}")
    chosen = precision
    if device_type == "cpu":
        chosen = "fp32" if precision == "fp16" else effective_precision(precision, "training")
    elif device_type == "cuda":
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            chosen = "fp16"
    else:
        chosen = "fp32"
    if chosen != precision and not (device_type == "cpu" and precision == "bf16"):  # that one warned above
        log.warning("precision %s asked for; training on %s runs %s instead", precision, device_type, chosen)
    return chosen


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler:
    """The loss scaler of a training run: active for 'fp16' only; for every other precision a
    disabled ``GradScaler``, whose ``scale`` returns the loss unchanged, ``unscale_`` does
    nothing and ``step`` is the optimizer's own step, so one code path serves all precisions."""
    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")
