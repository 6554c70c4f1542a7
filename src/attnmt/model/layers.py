"""Position-wise feed-forward and the encoder and decoder layers (paper sections 3.1 and 3.3).

Each sub-layer is wrapped in a residual connection with dropout and layer normalisation:
post-norm, as in the paper, ``LayerNorm(x + Dropout(Sublayer(x)))``; or pre-norm (an option,
often more stable for deep stacks), ``x + Dropout(Sublayer(LayerNorm(x)))``.

Shapes: B batch, S source length, T target length, D d_model, F d_ff, H heads.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnmt.model.attention import LayerCache, MultiHeadAttention
from attnmt.model.dropout import Dropout, dropout


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (paper, equation 2): (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.w_1(x))  # (B, T, F)
        h = dropout(h, self.activation_dropout, self.training)
        return self.w_2(h)


class ResidualSublayer(nn.Module):
    """Residual connection + dropout + LayerNorm around one sub-layer (paper section 5.4)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each a residual sub-layer (Figure 1, left)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation_dropout)
        self.sublayers = nn.ModuleList(ResidualSublayer(d_model, dropout, norm_first) for _ in range(2))

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, S, D); src_mask: (B, 1, 1, S). Returns (B, S, D) and self-attention weights or None."""
        weights = None

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            k, v = self.self_attn.project_kv(h)
            out, weights = self.self_attn(h, k, v, src_mask, need_weights=need_weights)
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, self.feed_forward)
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, source attention, feed-forward (Figure 1, right)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.src_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation_dropout)
        self.sublayers = nn.ModuleList(ResidualSublayer(d_model, dropout, norm_first) for _ in range(3))

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
        cache: LayerCache | None = None, need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One decoder layer.

        Args:
            x: (B, T, D) target states; with a cache, only the T new positions.
            memory: (B_src, S, D) encoder output (unused when the cache holds its keys/values),
                B_src = B, or B / K when each sentence's K beams are K consecutive rows of x.
            src_mask: (B_src, 1, 1, S) source padding mask.
            cache: incremental state; self-attention keys/values are appended to it.
        Returns:
            (B, T, D), self-attention weights (B, H, T, t) and source-attention weights
            (B, H, T, S) when ``need_weights``, else None.
        """
        self_w = src_w = None

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            nonlocal self_w
            k, v = self.self_attn.project_kv(h)  # (B, H, T, Dh)
            if cache is not None:
                if cache.self_k is not None:
                    k = torch.cat([cache.self_k, k], dim=2)  # (B, H, t, Dh)
                    v = torch.cat([cache.self_v, v], dim=2)
                cache.self_k, cache.self_v = k, v
            # With a cache and one new position, every cached key is in the past: no mask needed.
            causal = h.size(1) > 1
            out, self_w = self.self_attn(h, k, v, is_causal=causal, need_weights=need_weights)
            return out

        def source_attention(h: torch.Tensor) -> torch.Tensor:
            nonlocal src_w
            if cache is not None and cache.cross_k is not None:
                k, v = cache.cross_k, cache.cross_v
            else:
                k, v = self.src_attn.project_kv(memory)  # (B_src, H, S, Dh)
                if cache is not None:
                    # Contiguous once, not copied by every step's matmuls (kv_proj's halves are strided views).
                    k, v = k.contiguous(), v.contiguous()
                    cache.cross_k, cache.cross_v = k, v
            group = h.size(0) // k.size(0)
            if group == 1:
                out, src_w = self.src_attn(h, k, v, src_mask, need_weights=need_weights)
                return out
            # Beam search: the `group` consecutive rows of a sentence (its beams) share one
            # source, so they attend to it as group x T query positions of that sentence.
            if group * k.size(0) != h.size(0):
                raise ValueError(f"{h.size(0)} target rows do not split evenly over {k.size(0)} sources")
            b_src, t = k.size(0), h.size(1)
            out, w = self.src_attn(h.reshape(b_src, group * t, -1), k, v, src_mask, need_weights=need_weights)
            if w is not None:  # (B_src, H, group*T, S) -> (B, H, T, S)
                src_w = w.unflatten(2, (group, t)).transpose(1, 2).flatten(0, 1)
            return out.reshape(h.shape)

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, source_attention)
        x = self.sublayers[2](x, self.feed_forward)
        return x, self_w, src_w
