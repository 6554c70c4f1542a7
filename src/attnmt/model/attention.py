"""Scaled dot-product attention, multi-head attention, masks and the key/value cache (paper 3.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (equation 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                       (section 3.2.2)

The model uses attention three ways (section 3.2.3): encoder self-attention, masked decoder
self-attention, and source attention (the paper's "encoder-decoder attention": decoder queries,
encoder keys and values).

Masks are boolean, True where a query may attend to a key, broadcastable to (B, H, Tq, Tk). A
query with no allowed key gets zero weights and a zero output, never NaN.

Two switches choose faster code for the same function; the plain code comes first in each:

- ``MASKS_AS_ARITHMETIC`` (on): the explicit formula applies its mask by adding a bias and
  multiplying by 0/1 floats instead of ``masked_fill`` with a bool mask, which is several times
  slower on CPU (benchmarks/RESULTS.md). The results are equal.
- ``MultiHeadAttention.fused`` (off unless the translator turns it on, ``decode.attention``):
  PyTorch's fused ``scaled_dot_product_attention`` kernel instead of the explicit formula,
  where no weights are asked for. It agrees with the explicit formula to float rounding.

Shapes: B batch, H heads, Tq query length, Tk key length, D d_model, Dh = D / H head size,
K beam size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnmt.errors import OptionError
from attnmt.model.dropout import dropout

MASKS_AS_ARITHMETIC = True  # speed switch (module docstring); False: masked_fill


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equation 1, returning the attention weights too.

    Args:
        q: (B, H, Tq, Dh); k, v: (B, H, Tk, Dh); any float dtype.
        mask: bool, broadcastable to (B, H, Tq, Tk), True = may attend; None = attend to all.
        dropout_p: dropout on the weights (section 5.4 applies dropout to sub-layer outputs;
            dropout on the weights is a common addition), used only when ``training``.
    Returns:
        (output (B, H, Tq, Dh), weights (B, H, Tq, Tk)), both of q's dtype. Each row of weights
        sums to 1 over its allowed keys and is 0 on masked keys (all 0 for a row with none).
        The weights are those before dropout.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    elif not MASKS_AS_ARITHMETIC:
        # A masked key gets the lowest finite score, so its exp underflows to 0; a row with no
        # allowed key would come out uniform, so the masked weights are zeroed afterwards.
        weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
        weights = weights.masked_fill(~mask, 0.0)
    else:
        # Speed switch (module docstring): the same two steps as float arithmetic.
        allowed = mask.to(scores.dtype)  # 1 = may attend, broadcastable to (B, H, Tq, Tk)
        scores = scores + (1.0 - allowed) * torch.finfo(scores.dtype).min
        weights = torch.softmax(scores, dim=-1) * allowed
    return dropout(weights, dropout_p, training) @ v, weights


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, training: bool = False, is_causal: bool = False,
) -> torch.Tensor:
    """Equation 1 through PyTorch's fused kernel: the output of
    :func:`scaled_dot_product_attention` (same shapes and mask), without the weights.

    ``is_causal`` replaces a causal mask (query i attends to keys 0..i) and needs ``mask=None``.
    Rows with no allowed key are zeroed, as in the explicit formula.

    Library: ``torch.nn.functional.scaled_dot_product_attention``.
    """
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p if training else 0.0, is_causal=is_causal
    )
    if mask is not None and mask.size(-1) > 0:
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The H heads of section 3.2.2 side by side: (B, T, H*Dh) -> (B, H, T, Dh), a view of ``x``
    (head i is features i*Dh to (i+1)*Dh - 1 of every position). :func:`merge_heads` undoes it."""
    b, t, _ = x.shape
    return x.view(b, t, num_heads, -1).transpose(1, 2)  # (B, T, H*Dh) -> (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concat(head_1, ..., head_h) of section 3.2.2: (B, H, T, Dh) -> (B, T, H*Dh), the inverse of
    :func:`split_heads`."""
    return x.transpose(1, 2).flatten(2)  # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, H*Dh)


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """(1, 1, T, T + offset) bool mask: query i, the position offset + i, may attend to keys
    0 .. offset + i (section 3.2.3: no attention to later positions)."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length + offset, device=device)[None, :]
    return (k <= q + offset)[None, None]


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, 1, S) bool mask from (B, S) int64 ids: True on real tokens, False on padding."""
    return (tokens != pad_id)[:, None, None, :]


@dataclass
class KVCache:
    """The keys and values one attention keeps between steps of incremental decoding.

    k, v: (B, H, t, Dh), None before the first step. A self-attention cache grows by the new
    positions at every step; a ``static`` cache (source attention) is filled once from the
    encoder output and then only read.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    static: bool = False

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (int64, (B',)), in that order."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, rows), self.v.index_select(0, rows)


@dataclass
class LayerCache:
    """One decoder layer's caches: its self-attention and its source attention."""

    self_attn: KVCache = field(default_factory=KVCache)
    src_attn: KVCache = field(default_factory=lambda: KVCache(static=True))


@dataclass
class DecoderCache:
    """The explicit incremental-decoding state of a whole decoder (fairseq's incremental state).

    Search code owns it: ``Transformer.init_cache`` creates it, each ``Transformer.decode_step``
    grows it, and :meth:`reorder` follows the beams when they are re-ranked or when finished
    sentences leave the batch. ``step`` is the number of target positions consumed so far.
    """

    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Keep rows ``rows`` (int64, (B',)) of every self-attention cache and, if given, rows
        ``sources`` of every source-attention cache. Beam search keeps the source side once per
        sentence, so re-ranking beams within their sentences leaves it alone (``sources=None``)."""
        for layer in self.layers:
            layer.self_attn.reorder(rows)
            if sources is not None:
                layer.src_attn.reorder(sources)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (section 3.2.2): h = ``num_heads`` heads of d_k = d_v = D / H.

    Parameters: ``q_proj`` (W^Q of all heads), ``kv_proj`` (W^K and W^V of all heads stacked, so
    that keys and values of one input come from one matmul) and ``out_proj`` (W^O), each with a
    bias unless ``bias`` is False.

    ``head_dim`` sets Dh independently of D (the projections are then H * Dh wide and W^O maps
    H * Dh back to D); None gives the paper's Dh = D / H.

    Raises:
        ValueError: D not divisible by H when ``head_dim`` is None.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, fused: bool = False,
                 head_dim: int | None = None, bias: bool = True):
        super().__init__()
        if head_dim is None and d_model % num_heads:
            raise OptionError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = head_dim or d_model // num_heads
        inner = num_heads * self.head_dim  # H * Dh (= D in the paper)
        self.dropout = dropout  # on the attention weights, in training
        self.fused = fused  # speed switch (module docstring): PyTorch's fused kernel when no weights are asked for
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    def _project_kv(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K W^K and V W^V with their heads split: (Bk, H, Tk, Dh) each."""
        if key is value:  # self-attention, and source attention over the encoder output
            k, v = self.kv_proj(key).chunk(2, dim=-1)  # (Bk, Tk, D) each, one matmul
        else:
            w_k, w_v = self.kv_proj.weight.chunk(2)
            b_k, b_v = self.kv_proj.bias.chunk(2) if self.kv_proj.bias is not None else (None, None)
            k, v = F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        return split_heads(k, self.num_heads), split_heads(v, self.num_heads)

    def _keys_values(self, key: torch.Tensor | None, value: torch.Tensor | None,
                     cache: KVCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values, from the cache where it holds them: (Bk, H, Tk, Dh) each."""
        if cache is not None and cache.static and cache.k is not None:
            return cache.k, cache.v
        k, v = self._project_kv(key, value)
        if cache is None:
            return k, v
        if cache.static:
            # Contiguous once, so that later steps' matmuls do not copy the strided halves.
            cache.k, cache.v = k.contiguous(), v.contiguous()
        elif cache.k is None:
            cache.k, cache.v = k, v
        else:
            cache.k, cache.v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)  # (B, H, t, Dh)
        return cache.k, cache.v

    def forward(
        self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
        mask: torch.Tensor | None = None, is_causal: bool = False, cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, Tq, D).
            key, value: (Bk, Tk, D). Bk = B, or B / K in beam search, where the K consecutive
                query rows of a sentence (its beams) share that sentence's one key row. None
                when a filled static ``cache`` holds the projected keys and values.
            mask: bool, broadcastable to (Bk, H, Tq, Tk) (with Bk < B: to (Bk, H, 1, Tk)).
            is_causal: mask later positions: query i, the newest Tq of all Tk positions
                (cached ones included), may attend to keys up to its own position.
            cache: incremental decoding: self-attention appends the new keys/values to it and
                attends to all of them; a static cache is filled on the first call.
            need_weights: return the attention weights (always the explicit formula).
        Returns:
            (output (B, Tq, D), weights (B, H, Tq, Tk) if ``need_weights`` else None).
        """
        # 1) Linear projections of the query, and of the keys and values unless cached.
        k, v = self._keys_values(key, value, cache)  # (Bk, H, Tk, Dh) each
        b, tq, _ = query.shape
        beams = b // k.size(0)  # K query rows per key row (1 outside beam search)
        if beams * k.size(0) != b:
            raise ValueError(f"{b} query rows do not split evenly over {k.size(0)} key rows")
        # The beams of a sentence attend to its source together, as K * Tq query positions.
        q = split_heads(self.q_proj(query.reshape(k.size(0), beams * tq, -1)), self.num_heads)  # (Bk, H, K*Tq, Dh)
        tk = k.size(-2)
        if is_causal and tq == 1:
            is_causal = False  # one query at the newest position may attend to every key
        if is_causal and (need_weights or not self.fused or tq != tk):
            # An explicit mask for the explicit formula, and where the fused kernel's top-left
            # causal alignment would be wrong (the queries are the last Tq of Tk positions).
            mask, is_causal = causal_mask(tq, q.device, offset=tk - tq), False
        # 2) Scaled dot-product attention of every head at once.
        if need_weights or not self.fused:
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, self.training)
        else:
            out = fused_attention(q, k, v, mask, self.dropout, self.training, is_causal)  # speed switch
            weights = None
        # 3) Concatenate the heads and apply W^O.
        out = merge_heads(out).reshape(b, tq, -1)  # (Bk, H, K*Tq, Dh) -> (Bk, K*Tq, H*Dh) -> (B, Tq, H*Dh)
        if need_weights and beams > 1:
            weights = weights.unflatten(2, (beams, tq)).transpose(1, 2).flatten(0, 1)  # (B, H, Tq, Tk)
        return self.out_proj(out), weights if need_weights else None
