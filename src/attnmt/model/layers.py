"""Position-wise feed-forward network, residual sub-layers, encoder and decoder layers
(paper sections 3.1 and 3.3).

Each sub-layer is wrapped in a residual connection with dropout and layer normalisation:
post-norm as in the paper (section 3.1), ``LayerNorm(x + Dropout(Sublayer(x)))``; or, as an
option, pre-norm, ``x + Dropout(Sublayer(LayerNorm(x)))``, often more stable for deep stacks; or
both (``pre_post_norm``), ``LayerNorm(x + Dropout(Sublayer(LayerNorm(x))))``. A LayerNorm
(Ba et al., 2016) has a learned scale and shift, or, with ``layer_norm_scale`` off, a learned
shift only.

Shapes: B batch, S source length, T target length (new positions only, with a cache), t target
positions so far, D d_model, F d_ff, H heads.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnmt.config import ModelConfig
from attnmt.model.attention import LayerCache, MultiHeadAttention
from attnmt.model.dropout import Dropout, dropout

Weights = torch.Tensor | None  # attention weights (B, H, Tq, Tk), when asked for


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,  # the paper's max(0, x)
    "swish": F.silu,  # x * sigmoid(x) (Ramachandran et al., 2017), MarianMT's choice
    "gelu": F.gelu,  # x * Phi(x) (Hendrycks and Gimpel, 2016)
}


class ShiftLayerNorm(nn.Module):
    """LayerNorm with a learned shift and no learned scale: (x - mean) / sqrt(var + eps) + b,
    over the last dimension (D); any shape (..., D) -> the same."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.size(-1),), None, self.bias, self.eps)


def layer_norm(cfg: ModelConfig) -> nn.Module:
    """A LayerNorm over d_model with ``cfg.layer_norm_eps``: scale and shift learned, or with
    ``cfg.layer_norm_scale`` off only the shift (:class:`ShiftLayerNorm`)."""
    if cfg.layer_norm_scale:
        return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return ShiftLayerNorm(cfg.d_model, cfg.layer_norm_eps)


def attention(cfg: ModelConfig) -> MultiHeadAttention:
    """A MultiHeadAttention with the configuration's heads, head size, bias and dropout."""
    return MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.attention_dropout, head_dim=cfg.head_dim,
                              bias=cfg.attention_bias)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2): (B, T, D) -> (B, T, D).

    ``activation`` replaces max(0, .) by another of :data:`ACTIVATIONS` (the paper: relu);
    ``output_activation`` applies it after the second layer too, act(act(x W_1 + b_1) W_2 + b_2)
    (not in the paper).
    """

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0, activation: str = "relu",
                 output_activation: bool = False):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.activation_dropout = activation_dropout  # dropout after the activation, in training
        self.output_activation = output_activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.activation(self.w_1(x))  # (B, T, F)
        h = dropout(h, self.activation_dropout, self.training)
        y = self.w_2(h)  # (B, T, D)
        return self.activation(y) if self.output_activation else y


def feed_forward(cfg: ModelConfig) -> PositionwiseFeedForward:
    """The configuration's feed-forward network."""
    return PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation,
                                   cfg.ffn_output_activation)


class ResidualSublayer(nn.Module):
    """A residual connection with dropout and LayerNorm around one sub-layer (section 5.4):
    post-norm (the paper), pre-norm (``norm_first``) or both (``pre_post_norm``, two LayerNorms)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = layer_norm(cfg)
        self.dropout = Dropout(cfg.dropout, cfg.time_shared_dropout)
        self.norm_first = cfg.norm_first
        self.pre_norm = layer_norm(cfg) if cfg.pre_post_norm else None  # the LayerNorm before the sub-layer

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], tuple[torch.Tensor, Weights]]
                ) -> tuple[torch.Tensor, Weights]:
        """x: (B, T, D); ``sublayer`` maps (B, T, D) to (B, T, D) and its attention weights (or
        None). Returns the new x (B, T, D) and those weights."""
        if self.norm_first:
            y, weights = sublayer(self.norm(x))
            return x + self.dropout(y), weights
        if self.pre_norm is not None:
            y, weights = sublayer(self.pre_norm(x))
            return self.norm(x + self.dropout(y)), weights
        y, weights = sublayer(x)
        return self.norm(x + self.dropout(y)), weights


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network (Figure 1, left)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.sublayers = nn.ModuleList(ResidualSublayer(cfg) for _ in range(2))

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool = False) -> tuple[torch.Tensor, Weights]:
        """x: (B, S, D); src_mask: (B, 1, 1, S) bool. Returns (B, S, D) and the self-attention
        weights (B, H, S, S) if ``need_weights``, else None."""
        x, weights = self.sublayers[0](x, lambda h: self.self_attn(h, h, h, src_mask, need_weights=need_weights))
        x, _ = self.sublayers[1](x, lambda h: (self.feed_forward(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, source attention over the encoder output, then the feed-forward
    network (Figure 1, right)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = attention(cfg)
        self.src_attn = attention(cfg)
        self.feed_forward = feed_forward(cfg)
        self.sublayers = nn.ModuleList(ResidualSublayer(cfg) for _ in range(3))

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
        cache: LayerCache | None = None, need_weights: bool = False,
    ) -> tuple[torch.Tensor, Weights, Weights]:
        """One decoder layer.

        Args:
            x: (B, T, D) target states; with a cache, only the T new positions.
            memory: (Bs, S, D) encoder output; Bs = B, or B / K in beam search, where the K
                beams of a sentence are K consecutive rows of x. None once the cache holds the
                source attention's keys and values.
            src_mask: (Bs, 1, 1, S) bool source padding mask.
            cache: incremental decoding state of this layer, grown in place.
        Returns:
            (B, T, D), and if ``need_weights`` the self-attention weights (B, H, T, t) and the
            source-attention weights (B, H, T, S), else None twice.
        """
        self_cache, src_cache = (cache.self_attn, cache.src_attn) if cache is not None else (None, None)
        x, self_w = self.sublayers[0](x, lambda h: self.self_attn(
            h, h, h, is_causal=True, cache=self_cache, need_weights=need_weights))
        x, src_w = self.sublayers[1](x, lambda h: self.src_attn(
            h, memory, memory, src_mask, cache=src_cache, need_weights=need_weights))
        x, _ = self.sublayers[2](x, lambda h: (self.feed_forward(h), None))
        return x, self_w, src_w
