"""Inverted dropout (Srivastava et al., 2014) with a cheaper random source on CPU.

On CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, which on our
2-core benchmark machine cost ~11 ms per million elements: a quarter of a bfloat16 training
step of the 6M-parameter model. Here the mask comes from uniform 15-bit integers compared with
a threshold, which gives the same Bernoulli mask (drop probability quantised to 1/32768):

- the integers are drawn as 64-bit words (``random_`` on int64, 63 random bits each) and read
  as four 16-bit lanes with the sign bit cleared, so one generator call serves four elements:
  a million mask elements took 1.8 ms instead of 4.5 ms with one int16 draw per element and
  13.5 ms with ``bernoulli_`` (AVX2 EPYC, 2 threads, 2026-11-23);
- the result is ``x * scale`` with the dropped positions filled in place, so the boolean mask
  is never converted to a float tensor and autograd keeps only the mask (1 byte per element).

In training (``benchmarks/ab_train.py --updates 100 --rounds 3``, float32, AVX2 EPYC, together
with the fused Adam step) these two lowered peak RSS from 1.38-1.56 to 1.28-1.29 GiB; the speed
was the same within the machine's noise (2,150-2,366 against 2,242-2,378 target tokens/s).

On other devices ``F.dropout`` is used as is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 32768  # each 16-bit lane, sign bit cleared, is uniform on [0, 32767]
_LANES = 4  # 16-bit lanes per int64 draw


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """A boolean tensor of ``shape`` that is True (drop) with probability round(p * 32768) / 32768,
    independently per element, drawn from PyTorch's default CPU generator (so ``torch.manual_seed``
    makes it reproducible)."""
    numel = math.prod(shape)
    words = torch.empty((numel + _LANES - 1) // _LANES, dtype=torch.int64).random_()
    lanes = words.view(torch.int16)[:numel].bitwise_and_(_LEVELS - 1)
    return (lanes < round(p * _LEVELS)).view(shape)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

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
    threshold = round(p * _LEVELS)
    return (x * (_LEVELS / (_LEVELS - threshold))).masked_fill_(dropout_mask(x.shape, p), 0.0)


class Dropout(nn.Module):
    """Module form of :func:`dropout`."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
