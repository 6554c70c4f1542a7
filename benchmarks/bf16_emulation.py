"""bfloat16 autocast training on a CPU without bfloat16 kernels, for memory diagnostics only.

On an AVX2-only CPU PyTorch multiplies bfloat16 matrices with a generic kernel, hundreds of
times slower than float32 (RESULTS-avx2.md's machine limit), so a bf16 training run of the
benchmark setting would take days. Importing this module replaces the CPU kernels of
``aten::mm``, ``addmm``, ``bmm`` and ``baddbmm`` (through ``torch.library``) for bfloat16
inputs: they are computed in float32 by the ``out=`` variants (which keep their original
kernels) and rounded to bfloat16, so autocast runs at about float32 speed and autograd saves the
same bfloat16 tensors as on a CPU with bfloat16 kernels. It also makes
``attnmt.precision.cpu_bf16_is_fast`` answer True, so that 'bf16' is not turned into 'fp32'.

What it does not reproduce: oneDNN's own memory on a CPU with bfloat16 kernels (its weight
reorders, scratchpads and primitive cache), so its peak RSS is below a real bf16 run's (how far
below: the record at the end of RESULTS.md). So compare two revisions with it
(``benchmarks/ab_train.py --emulate-bf16``), never the 2.7 GB limit with its absolute figure;
speed figures under it mean nothing. Validation perplexity is close to real bfloat16 (float32
accumulation of bfloat16 inputs, as oneDNN does) but not bit-equal.
"""

from __future__ import annotations

import warnings

import torch

_BF16 = torch.bfloat16
_lib = torch.library.Library("aten", "IMPL")  # kept alive: dropping it would undo the override


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype == _BF16 else x


def _in_float32(op):
    """A kernel for ``op`` (mm, addmm, bmm or baddbmm: its last two arguments are the matrices
    multiplied, shapes (..., n, k) and (..., k, m)) that computes bfloat16 inputs in float32 through
    ``op(..., out=)`` and returns the result (..., n, m) in the dtype of the first matrix."""

    def kernel(*args, **kwargs):
        a, b = args[-2], args[-1]
        out = torch.empty((*a.shape[:-1], b.shape[-1]), dtype=torch.float32 if a.dtype == _BF16 else a.dtype)
        op(*map(_f32, args), **kwargs, out=out)
        return out.to(a.dtype)

    return kernel


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "overriding a previously registered kernel" is the point
    for _op in (torch.mm, torch.addmm, torch.bmm, torch.baddbmm):
        _lib.impl(_op.__name__, _in_float32(_op), "CPU")

# after the override, from whichever tree is on the path (before attnmt.precision: attnmt.runtime)
try:
    import attnmt.precision as _precision  # noqa: E402
except ModuleNotFoundError:
    import attnmt.runtime as _precision  # noqa: E402

_precision.cpu_bf16_is_fast = lambda: True
