"""Scaled dot-product attention, multi-head attention and the key/value cache (paper section 3.2).

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (paper, equation 1)
MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                       (paper, section 3.2.2)

Masks are boolean, True where a query may attend to a key, broadcastable to (B, H, Tq, Tk);
``attnmt.model.transformer`` builds them. A query row with no allowed key gives zero weights
and a zero output, never NaN.

Two paths compute the same function: the explicit formula, which can return the attention
weights (for plots), and ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels),
used when weights are not requested. A test checks that they agree.

Shapes: B batch, H heads, Tq query length, Tk key length, D d_model, Dh = D / H.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnmt.model.dropout import dropout


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit formula of equation 1, returning the weights too.

    Args:
        q: (B, H, Tq, Dh); k: (B, H, Tk, Dh); v: (B, H, Tk, Dh); any float dtype.
        mask: bool, broadcastable to (B, H, Tq, Tk), True = may attend; None = attend to all.
        dropout_p: dropout on the weights (applied only when ``training``).
    Returns:
        (output (B, H, Tq, Dh), weights (B, H, Tq, Tk)); weights rows sum to 1 over allowed
        keys and are 0 on masked keys (all 0 for a row with no allowed key).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        # The mask enters as float arithmetic (add a bias, multiply by 0/1), not masked_fill:
        # on CPU masked_fill with a bool mask is far slower than a float add or multiply (this
        # function's forward and backward took 10.3 instead of 7.4 ms for B 256, H 8, T 16).
        # The bias is the finite minimum, not -inf: a fully masked row then stays finite (no NaN
        # in backward), and the product with ``allowed`` sets its weights to 0.
        allowed = mask.to(scores.dtype)  # broadcastable to (B, H, Tq, Tk), 1 = may attend
        scores = scores + (1.0 - allowed) * torch.finfo(scores.dtype).min
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * allowed
    if dropout_p > 0.0 and training:
        weights_out = dropout(weights, dropout_p, True)
    else:
        weights_out = weights
    return weights_out @ v, weights


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, training: bool = False, is_causal: bool = False,
) -> torch.Tensor:
    """Equation 1 through PyTorch's fused kernel (same shapes as the explicit path, no weights).

    ``is_causal`` replaces a causal mask (query i attends to keys 0..i) and needs ``mask=None``.
    Fully masked rows are zeroed, as in the explicit path.
    """
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p if training else 0.0, is_causal=is_causal
    )
    if mask is not None and mask.size(-1) > 0:
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out


def fused_is_faster(rows: int, group: int, num_heads: int, head_dim: int, keys: int = 16,
                    dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``fused_attention`` beats the explicit formula on this CPU, at this thread count,
    for the attention of one incremental decoding step, timed on random tensors (~0.1 s, once
    per argument set and thread count).

    Which one wins depends on the CPU: for one-query steps the fused kernel was ~5x faster in
    float32 on the AVX-512 machine of an earlier benchmark, but on an AVX2-only AMD EPYC (2 threads)
    it was 2.2x slower for 640 one-query rows over 16 keys and 5x slower for 128 sources with 5
    queries each, and the explicit path in the decoder made beam-5 translation of test_2016
    faster by a tenth (4 alternating rounds in one process: 14.0-15.6 s against 16.5-17.8 s,
    same output). The two paths compute the same function, so the choice changes speed only.

    Args:
        rows: target rows of a step (sentences x beam size); group: beam size, the rows that
            share one source (their source attention is ``group`` queries per source).
        num_heads, head_dim: H and Dh; keys: key positions (past target tokens, source tokens).
        dtype: the activations' dtype.
    Returns:
        True if the fused kernel took less time over one self-attention step (``rows`` queries
        of length 1, no mask) plus one source-attention step (``rows / group`` sources, with a
        padding mask).
    """
    return _fused_is_faster(rows, group, num_heads, head_dim, keys, dtype, torch.get_num_threads())


@functools.cache
def _fused_is_faster(rows: int, group: int, num_heads: int, head_dim: int, keys: int, dtype: torch.dtype,
                     threads: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    sources = max(rows // group, 1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    q_self, k_self, v_self = randn(rows, num_heads, 1, head_dim), randn(rows, num_heads, keys, head_dim), \
        randn(rows, num_heads, keys, head_dim)
    q_src, k_src, v_src = randn(sources, num_heads, group, head_dim), randn(sources, num_heads, keys, head_dim), \
        randn(sources, num_heads, keys, head_dim)
    mask = torch.ones(sources, 1, 1, keys, dtype=torch.bool)
    mask[::2, ..., keys // 2:] = False  # half the sources padded

    def run(fused: bool) -> float:
        t0 = time.perf_counter()
        if fused:
            fused_attention(q_self, k_self, v_self)
            fused_attention(q_src, k_src, v_src, mask)
        else:
            scaled_dot_product_attention(q_self, k_self, v_self)
            scaled_dot_product_attention(q_src, k_src, v_src, mask)
        return time.perf_counter() - t0

    with torch.no_grad():
        best = {True: float("inf"), False: float("inf")}
        for rep in range(4):  # alternating; the first round warms up both
            for fused in (True, False) if rep % 2 == 0 else (False, True):
                seconds = run(fused)
                if rep:
                    best[fused] = min(best[fused], seconds)
    return best[True] < best[False]


@dataclass
class LayerCache:
    """Keys and values one decoder layer keeps between steps of incremental decoding.

    self_k, self_v: (B, H, t, Dh) self-attention keys/values of the t positions decoded so far.
    cross_k, cross_v: (B_src, H, S, Dh) encoder-decoder keys/values, computed once from the
    memory; B_src = B, or B / K in beam search, where the K beams of a sentence share them.
    """

    self_k: torch.Tensor | None = None
    self_v: torch.Tensor | None = None
    cross_k: torch.Tensor | None = None
    cross_v: torch.Tensor | None = None

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Keep rows ``rows`` (int64, (B',)) of the self-attention keys/values and, if given,
        rows ``sources`` of the source-attention ones (None leaves them as they are: beam
        search keeps those once per sentence, so re-ranking beams does not move them)."""
        if self.self_k is not None:
            self.self_k, self.self_v = self.self_k.index_select(0, rows), self.self_v.index_select(0, rows)
        if sources is not None and self.cross_k is not None:
            self.cross_k, self.cross_v = self.cross_k.index_select(0, sources), self.cross_v.index_select(0, sources)


@dataclass
class DecoderCache:
    """The explicit incremental-decoding state of a whole decoder (fairseq's incremental state).

    Search code owns it: it is created by ``Transformer.init_cache``, grown by each
    ``Transformer.decode_step`` and reordered with :meth:`reorder` when beams are re-ranked or
    finished sentences leave the batch. ``step`` is the number of target positions consumed.
    """

    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Select rows ``rows`` (int64, (B',)) of every layer's self-attention keys/values and,
        if given, rows ``sources`` of the source-attention ones (see :meth:`LayerCache.reorder`)."""
        for layer in self.layers:
            layer.reorder(rows, sources)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (paper section 3.2.2) with h = ``num_heads`` heads of d_k = d_v = D / H.

    Used three ways: encoder self-attention, masked decoder self-attention, and encoder-decoder
    ("source") attention. In incremental decoding, self-attention appends the new position's
    keys/values to the cache and source attention computes its keys/values once.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, fused: bool = False):
        super().__init__()
        self.fused = fused  # use PyTorch's fused kernel when weights are not needed
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)  # W^Q for all heads
        self.kv_proj = nn.Linear(d_model, 2 * d_model)  # W^K and W^V for all heads, fused
        self.out_proj = nn.Linear(d_model, d_model)  # W^O

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x`` (B, Tk, D): each (B, H, Tk, Dh)."""
        k, v = self.kv_proj(x).chunk(2, dim=-1)  # (B, Tk, D) each
        return self._split_heads(k), self._split_heads(v)

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
        mask: torch.Tensor | None = None, is_causal: bool = False, need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` (B, Tq, D) to projected ``keys``/``values`` (B, H, Tk, Dh).

        Returns:
            (output (B, Tq, D), weights (B, H, Tq, Tk) if ``need_weights`` else None).
        """
        q = self._split_heads(self.q_proj(query))  # (B, H, Tq, Dh)
        tq, tk = q.size(-2), keys.size(-2)
        if is_causal and (need_weights or not self.fused or tq != tk):
            # An explicit mask for the explicit path, and where the fused kernel's top-left causal
            # alignment would be wrong (queries here are the last Tq of Tk positions).
            mask, is_causal = causal_mask(tq, q.device, offset=tk - tq), False
        if need_weights or not self.fused:
            out, weights = scaled_dot_product_attention(q, keys, values, mask, self.dropout, self.training)
            weights = weights if need_weights else None
        else:
            out = fused_attention(q, keys, values, mask, self.dropout, self.training, is_causal)
            weights = None
        b, _, tq, _ = out.shape
        out = out.transpose(1, 2).reshape(b, tq, -1)  # (B, Tq, D)
        return self.out_proj(out), weights


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """(1, 1, T, T + offset) bool mask: query i may attend to keys 0..i + offset."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length + offset, device=device)[None, :]
    return (k <= q + offset)[None, None]


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, 1, S) bool mask from (B, S) ids: True on real tokens, False on padding."""
    return (tokens != pad_id)[:, None, None, :]
