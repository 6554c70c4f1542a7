"""Positional encodings (paper section 3.5): sinusoidal, or learned as an option.

PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

That is the "interleaved" layout. tensor2tensor, MarianMT and CTranslate2 use the same sinusoids
laid out in "halves": PE(pos, i) = sin(pos / 10000^(2i / d_model)) and PE(pos, d_model/2 + i) =
cos(pos / 10000^(2i / d_model)) for i < d_model / 2 (``ModelConfig.positional_layout``).

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnmt.errors import OptionError


def sinusoidal_table(max_positions: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """The (max_positions, d_model) float32 table of section 3.5, in the ``layout``
    'interleaved' (the paper) or 'halves' (module docstring).

    Raises:
        ValueError: another layout, or 'halves' with an odd d_model.
    """
    if layout not in ("interleaved", "halves") or (layout == "halves" and d_model % 2):
        raise OptionError(f"no sinusoid layout {layout!r} for d_model {d_model}")
    pos = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    if layout == "halves":
        table = torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)  # (P, D): sines, then cosines
    return table


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoids, a non-trainable buffer (not saved in checkpoints)."""

    def __init__(self, d_model: int, max_positions: int, layout: str = "interleaved"):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model, layout), persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Encodings of positions offset .. offset + length - 1: (1, length, D)."""
        if offset + length > self.table.size(0):
            raise OptionError(f"position {offset + length - 1} exceeds max_positions {self.table.size(0)}")
        return self.table[offset: offset + length][None]


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions (the variant of Table 3, row E): a trainable (max_positions, D) table."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Embeddings of positions offset .. offset + length - 1: (1, length, D)."""
        if offset + length > self.embedding.num_embeddings:
            raise OptionError(f"position {offset + length - 1} exceeds max_positions {self.embedding.num_embeddings}")
        idx = torch.arange(offset, offset + length, device=self.embedding.weight.device)
        return self.embedding(idx)[None]
