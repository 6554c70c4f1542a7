"""Inverted dropout (Srivastava et al., 2014) with a cheaper random source on CPU.

On CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, which on our
2-core benchmark machine cost ~11 ms per million elements: a quarter of a bfloat16 training
step of the 6M-parameter model. Here the mask comes from uniform 15-bit integers compared with
a threshold, which gives the same Bernoulli mask (drop probability quantised to 1/32768):

- the integers are drawn as 64-bit words (``random_`` on int64, 63 random bits each) and read
  as four 16-bit lanes with the sign bit cleared, so one generator call serves four elements:
  a million mask elements took 1.8 ms instead of 4.5 ms with one int16 draw per element and
  13.5 ms with ``bernoulli_`` (AVX2 EPYC, 2 threads, 2026-11-23);
- the mask is made by integer arithmetic and applied as a float multiply, without bool
  tensors: on CPU, comparisons to bool and ``masked_fill`` with a bool mask are several times
  slower than float arithmetic. Each 15-bit lane minus (threshold - 1), clamped to [0, 1], is 1
  (keep) or 0 (drop); the output is x times that times 1 / (1 - p); the backward pass multiplies
  the gradient the same way, from the mask kept as int8 (1 byte per element, as a bool mask).
  Forward and backward of a (4096, 512) float32 tensor took 7.5 ms against 11.3 ms with a bool
  mask and ``masked_fill_`` (AVX2 EPYC, 2 threads, 2026-11-23). In training, together with the
  float attention mask of ``attnmt.model.attention`` and the loss's single exp pass
  (``attnmt.train.losses``), ``benchmarks/ab_train.py --base 233ecdd --updates 100 --rounds 3``
  (float32) gave 2,000 / 2,023 / 2,235 against 1,864 / 2,066 / 1,846 target tokens/s at the same
  peak RSS (1.27-1.32 against 1.30-1.31 GiB).

Earlier, with the bool mask (``benchmarks/ab_train.py --updates 100 --rounds 3``, float32, AVX2
EPYC, together with the fused Adam step), the 64-bit draws lowered peak RSS from 1.38-1.56 to
1.28-1.29 GiB at the same speed within the machine's noise.

On other devices ``F.dropout`` is used as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 32768  # each 16-bit lane, sign bit cleared, is uniform on [0, 32767]
_LANES = 4  # 16-bit lanes per int64 draw


def _lanes(numel: int) -> torch.Tensor:
    """(numel,) int16 uniform on [0, 32767]: four lanes of each 64-bit draw, sign bit cleared."""
    words = torch.empty((numel + _LANES - 1) // _LANES, dtype=torch.int64).random_()
    return words.view(torch.int16)[:numel].bitwise_and_(_LEVELS - 1)


class _CpuDropout(torch.autograd.Function):
    """Forward: x * keep / (1 - p), keep an int8 0/1 mask that is 0 (drop) where a 15-bit lane
    is below ``threshold`` = round(p * 32768); backward: the gradient times the same."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, threshold: int) -> torch.Tensor:
        # lane >= threshold (keep) gives lane - (threshold - 1) >= 1, lane < threshold gives <= 0.
        keep = _lanes(x.numel()).sub_(threshold - 1).clamp_(0, 1).to(torch.int8).view(x.shape)  # 0/1
        ctx.scale = _LEVELS / (_LEVELS - threshold)
        ctx.save_for_backward(keep)
        return (x * keep).mul_(ctx.scale)  # int8 * float gives x's dtype

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

    On CPU the drop probability is round(p * 32768) / 32768, independently per element, and the
    draws come from PyTorch's default CPU generator (``torch.manual_seed`` makes them reproducible).

    Args:
        x: any shape and float dtype.
        p: drop probability in [0, 1).
    Returns:
        A tensor like ``x``; ``x`` itself when not training or p == 0.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return _CpuDropout.apply(x, round(p * _LEVELS))


class Dropout(nn.Module):
    """Module form of :func:`dropout`."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
