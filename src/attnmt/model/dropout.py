"""Inverted dropout (Srivastava et al., 2014; paper section 5.4), with a cheaper mask on CPU.

Dropout zeroes each element with probability p and scales the others by 1 / (1 - p), so that
the expected value is unchanged and nothing needs rescaling at inference.

Speed switch ``INT8_MASK_ON_CPU`` (on): on CPU, ``torch.nn.functional.dropout`` draws its mask
with ``bernoulli_``, which costs a noticeable share of a small model's training step, and
keeps a bool mask. Instead the mask is made here from uniform 15-bit integers compared with a
threshold, which is the same Bernoulli draw with p rounded to a multiple of 1/32768:

- the integers come from 64-bit words (``randint`` over all int64 values) read as four 16-bit
  lanes with the sign bit cleared, so one generator call serves four elements (under
  torch.compile, which cannot view int64 as int16, the same lanes are cut by shifts);
- the comparison is integer arithmetic without bool tensors (each lane minus (threshold - 1),
  clamped to [0, 1], is 1 = keep or 0 = drop), the mask is kept as int8 (one byte per element)
  and applied as a multiplication, in the forward and the backward pass.

Timings are in benchmarks/RESULTS.md. The draws come from PyTorch's default CPU generator, so
``torch.manual_seed`` makes them reproducible; they differ from ``F.dropout``'s draws. Other
devices use ``F.dropout``.

Shapes: any; dtypes: any float dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INT8_MASK_ON_CPU = True  # speed switch (module docstring); False: F.dropout everywhere
_LEVELS = 32768  # each 16-bit lane, sign bit cleared, is uniform on [0, 32767]
_LANES = 4  # 16-bit lanes per int64 draw


def dropout(x: torch.Tensor, p: float, training: bool, time_shared: bool = False) -> torch.Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest by 1 / (1 - p).

    Args:
        x: any shape and float dtype.
        p: drop probability in [0, 1); with the CPU mask it is rounded to a multiple of 1/32768.
        training: dropout is applied only in training.
        time_shared: for x of shape (B, T, D), one mask of shape (B, 1, D) for all T time
            steps (TensorFlow's ``noise_shape=[B, 1, D]``; Gal and Ghahramani, 2016).
    Returns:
        A tensor like ``x``; ``x`` itself when not training or p == 0.
    """
    if not training or p == 0.0:
        return x
    if time_shared:
        # The plain way: drop a (B, 1, D) tensor of ones and broadcast it over time.
        ones = x.new_ones(x.shape[0], 1, *x.shape[2:])  # (B, 1, D)
        return x * dropout(ones, p, training)
    if not (INT8_MASK_ON_CPU and x.device.type == "cpu"):
        return F.dropout(x, p, True)
    return _Int8MaskDropout.apply(x, round(p * _LEVELS))  # speed switch (module docstring)


def _lanes(numel: int) -> torch.Tensor:
    """(numel,) integers uniform on [0, 32767], int16 (int64 under torch.compile): four lanes of
    each 64-bit draw, sign bit cleared."""
    # Uniform over all int64 values (the words of ``random_()``, which torch.compile cannot trace).
    words = torch.randint(-2**63, 2**63 - 1, ((numel + _LANES - 1) // _LANES,), dtype=torch.int64)
    if torch.compiler.is_compiling():  # torch.compile cannot view int64 as int16: the same lanes by shifts
        shifts = torch.arange(0, 64, 16, dtype=torch.int64)  # lane k of a little-endian word: bits 16k..16k+15
        return (words.unsqueeze(1) >> shifts).flatten()[:numel].bitwise_and_(_LEVELS - 1)
    return words.view(torch.int16)[:numel].bitwise_and_(_LEVELS - 1)


class _Int8MaskDropout(torch.autograd.Function):
    """Forward: x * keep / (1 - p), with keep an int8 0/1 mask that is 0 (drop) where a 15-bit
    lane is below ``threshold`` = round(p * 32768); backward: the gradient times the same."""

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


class Dropout(nn.Module):
    """Module form of :func:`dropout` (``time_shared``: one (B, 1, D) mask for all time steps)."""

    def __init__(self, p: float, time_shared: bool = False):
        super().__init__()
        self.p = p
        self.time_shared = time_shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.time_shared)



def set_rates(model: nn.Module, dropout: float, attention_dropout: float, activation_dropout: float) -> None:
    """Set every dropout probability of ``model`` for its next forward passes: each
    :class:`Dropout`'s ``p`` (embeddings and sub-layer outputs) to ``dropout``, each attention's
    ``dropout`` (on its weights) to ``attention_dropout`` and each feed-forward's
    ``activation_dropout`` (the float attributes of those names). Used by curriculum dropout."""
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = dropout
        elif isinstance(getattr(m, "dropout", None), float):
            m.dropout = attention_dropout
        if isinstance(getattr(m, "activation_dropout", None), float):
            m.activation_dropout = activation_dropout
