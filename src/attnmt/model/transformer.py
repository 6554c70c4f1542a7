"""The Transformer: embeddings, the encoder and decoder stacks, the output projection (paper 3).

Read top-down: ``Transformer.forward(src, tgt_in)`` is ``decode(tgt_in, encode(src))``. The
encoder is a stack of N ``EncoderLayer``s over scaled embeddings plus positions; the decoder a
stack of N ``DecoderLayer``s over the same, then a linear projection to vocabulary logits
(section 3.4; the softmax is left to the loss and the search). Search code uses ``encode``,
``init_cache`` and ``decode_step``, which feeds one new target position per call.

Embeddings are multiplied by sqrt(d_model) (section 3.4; ``scale_embeddings`` off: not), and
the positional encodings may be multiplied by a trainable scalar per side (``positional_scale``,
initialised to 1). Token embeddings may start from pretrained vectors and stay frozen
(:func:`load_pretrained_embeddings`, ``freeze_embeddings``). With a joint vocabulary, source and
target embeddings can be one matrix (``share_embeddings``); the output projection shares the
target embedding (``tie_output``, the paper's choice, section 3.4). With pre-norm a final
LayerNorm closes each stack. Weight matrices are initialised Xavier-uniform, embeddings from
N(0, 1/d_model) (``init: xavier_uniform``: embeddings and the output layer Xavier-uniform too).

Shapes: B batch, S source length, T target length, D d_model, H heads, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnmt.config import ModelConfig
from attnmt.errors import OptionError
from attnmt.model.attention import DecoderCache, LayerCache, MultiHeadAttention, padding_mask
from attnmt.model.dropout import Dropout
from attnmt.model.layers import DecoderLayer, EncoderLayer, layer_norm
from attnmt.model.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(d_model) (section 3.4; times 1 with ``scale=False``):
    (B, T) int64 -> (B, T, D).

    The padding id's row is zero and receives no gradient. ``scale=False`` leaves out the
    sqrt(d_model) factor (``ModelConfig.scale_embeddings``)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int, scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model ** -0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()
        self.pad_id = pad_id
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(tokens, self.weight, padding_idx=self.pad_id) * self.scale


def _positions(cfg: ModelConfig) -> nn.Module:
    if cfg.positional == "learned":
        return LearnedPositionalEmbedding(cfg.d_model, cfg.max_positions)
    return SinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions, cfg.positional_layout)


def _position_scale(cfg: ModelConfig) -> nn.Parameter | None:
    """The trainable scalar that multiplies a stack's positional encodings (initialised to 1), or
    None without ``positional_scale``."""
    return nn.Parameter(torch.ones(())) if cfg.positional_scale else None


@dataclass
class DecoderOutput:
    """Decoder results: logits (B, T, V), and per layer, when asked for, the attention weights
    self_attn[l] (B, H, T, t) and src_attn[l] (B, H, T, S)."""

    logits: torch.Tensor
    self_attn: list[torch.Tensor] | None = None
    src_attn: list[torch.Tensor] | None = None


class Encoder(nn.Module):
    """N encoder layers over embeddings + positions (Figure 1, left)."""

    def __init__(self, cfg: ModelConfig, embedding: ScaledEmbedding):
        super().__init__()
        self.embedding = embedding
        self.positions = _positions(cfg)
        self.position_scale = _position_scale(cfg)
        self.dropout = Dropout(cfg.dropout, cfg.time_shared_dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(cfg)
            for _ in range(cfg.num_encoder_layers)
        )
        self.final_norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """src: (B, S) int64 ids; src_mask: (B, 1, 1, S) bool. Returns the memory (B, S, D) and,
        if asked for, each layer's self-attention weights (B, H, S, S)."""
        pos = self.positions(src.size(1))  # (1, S, D)
        if self.position_scale is not None:
            pos = pos * self.position_scale
        x = self.dropout(self.embedding(src) + pos)  # (B, S, D)
        weights = [] if need_weights else None
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights)
            if weights is not None:
                weights.append(w)
        return self.final_norm(x), weights


class Decoder(nn.Module):
    """N decoder layers over embeddings + positions, then the projection to V logits
    (Figure 1, right)."""

    def __init__(self, cfg: ModelConfig, embedding: ScaledEmbedding, vocab_size: int):
        super().__init__()
        self.embedding = embedding
        self.positions = _positions(cfg)
        self.position_scale = _position_scale(cfg)
        self.dropout = Dropout(cfg.dropout, cfg.time_shared_dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg)
            for _ in range(cfg.num_decoder_layers)
        )
        self.final_norm = layer_norm(cfg) if cfg.norm_first else nn.Identity()
        self.output_projection = nn.Linear(cfg.d_model, vocab_size, bias=cfg.output_bias)
        if cfg.tie_output:
            self.output_projection.weight = embedding.weight
        else:
            nn.init.normal_(self.output_projection.weight, std=cfg.d_model ** -0.5)
        if cfg.output_bias:  # a learned bias on the logits (not in the paper), zero at the start
            nn.init.zeros_(self.output_projection.bias)

    def forward(
        self, tgt_in: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
        cache: DecoderCache | None = None, need_weights: bool = False,
    ) -> DecoderOutput:
        """Logits of the next token at every position: tgt_in (B, T) int64 (with a cache, only
        the new positions), memory (B, S, D) -> :class:`DecoderOutput` with logits (B, T, V)."""
        states, self_ws, src_ws = self.features(tgt_in, memory, src_mask, cache, need_weights)
        return DecoderOutput(self.output_projection(states), self_ws, src_ws)

    def features(
        self, tgt_in: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
        cache: DecoderCache | None = None, need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """The decoder stack without the output projection: the final states (B, T, D), and the
        per-layer attention weights of :class:`DecoderOutput` when asked for (else None)."""
        offset = cache.step if cache is not None else 0
        pos = self.positions(tgt_in.size(1), offset)  # (1, T, D)
        if self.position_scale is not None:
            pos = pos * self.position_scale
        x = self.dropout(self.embedding(tgt_in) + pos)  # (B, T, D)
        self_ws: list[torch.Tensor] | None = [] if need_weights else None
        src_ws: list[torch.Tensor] | None = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            x, self_w, src_w = layer(x, memory, src_mask, cache.layers[i] if cache is not None else None, need_weights)
            if need_weights:
                self_ws.append(self_w)
                src_ws.append(src_w)
        if cache is not None:
            cache.step += tgt_in.size(1)
        return self.final_norm(x), self_ws, src_ws


class Transformer(nn.Module):
    """The encoder-decoder Transformer (Figure 1).

    Args:
        cfg: the hyper-parameters.
        src_vocab_size, tgt_vocab_size: V of each side (equal with ``share_embeddings``).
        pad_id: the padding id of both vocabularies (masked in attention, zero embedding).
    Raises:
        ValueError: ``share_embeddings`` with different vocabulary sizes.
    """

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0):
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise OptionError("share_embeddings needs a joint vocabulary (equal source and target sizes)")
        self.config = cfg
        self.pad_id = pad_id
        src_embedding = ScaledEmbedding(src_vocab_size, cfg.d_model, pad_id, cfg.scale_embeddings)
        tgt_embedding = src_embedding if cfg.share_embeddings else ScaledEmbedding(
            tgt_vocab_size, cfg.d_model, pad_id, cfg.scale_embeddings)
        self.encoder = Encoder(cfg, src_embedding)
        self.decoder = Decoder(cfg, tgt_embedding, tgt_vocab_size)
        for name, p in self.named_parameters():
            if p.dim() == 2 and (cfg.init == "xavier_uniform" or (
                    "embedding" not in name and "output_projection" not in name)):
                nn.init.xavier_uniform_(p)
        with torch.no_grad():  # the padding rows stay zero
            src_embedding.weight[pad_id].zero_()
            tgt_embedding.weight[pad_id].zero_()
        if cfg.freeze_embeddings:
            src_embedding.weight.requires_grad_(False)
            tgt_embedding.weight.requires_grad_(False)

    def encode(self, src: torch.Tensor, need_weights: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """src: (B, S) int64 ids. Returns the memory (B, S, D), src_mask (B, 1, 1, S) bool, and
        the encoder self-attention weights of each layer when asked for (else None)."""
        src_mask = padding_mask(src, self.pad_id)
        memory, weights = self.encoder(src, src_mask, need_weights)
        return memory, src_mask, weights

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               need_weights: bool = False) -> DecoderOutput:
        """Teacher-forced decoding of whole prefixes: tgt_in (B, T) -> logits (B, T, V)."""
        return self.decoder(tgt_in, memory, src_mask, None, need_weights)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the next target token at every position, from src (B, S) and
        tgt_in (B, T) = BOS + target, both int64."""
        memory, src_mask, _ = self.encode(src)
        return self.decode(tgt_in, memory, src_mask).logits

    def init_cache(self) -> DecoderCache:
        """An empty incremental-decoding state for :meth:`decode_step`."""
        return DecoderCache([LayerCache() for _ in self.decoder.layers])

    def decode_step(self, tokens: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
                    cache: DecoderCache) -> torch.Tensor:
        """Log-probabilities of the next token after feeding one new position per prefix.

        Args:
            tokens: (B, 1) int64, the last token of each prefix.
            memory, src_mask: from :meth:`encode`, one row per sentence: B rows, or B / K when
                the K beams of each sentence are K consecutive rows of ``tokens`` (they share
                the source's keys and values). ``memory`` is read only at the first step and
                may be None afterwards.
            cache: grown in place by one position.
        Returns:
            (B, V) log-probabilities in the model's dtype (for a bfloat16 model computed in
            float32 by the log-softmax kernel and rounded to bfloat16); -inf for the
            ``forbidden_ids`` of the configuration.
        """
        logits = self.decoder(tokens, memory, src_mask, cache).logits[:, -1]  # (B, V)
        return forbid(torch.log_softmax(logits, dim=-1), self.config.forbidden_ids)

    def set_fused_attention(self, encoder: bool, decoder: bool) -> None:
        """Turn the fused attention kernel (``MultiHeadAttention.fused``) on or off in the
        encoder's and the decoder's attention modules."""
        for part, fused in ((self.encoder, encoder), (self.decoder, decoder)):
            for module in part.modules():
                if isinstance(module, MultiHeadAttention):
                    module.fused = fused


def forbid(logp: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``logp`` (B, V) with the columns ``ids`` set to -inf, so that search never picks them
    (``ModelConfig.forbidden_ids``; applied after the log-softmax, as transformers' generate does
    with ``bad_words_ids``)."""
    if ids:
        logp[:, ids] = float("-inf")
    return logp


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad)


def load_pretrained_embeddings(embedding: ScaledEmbedding, words: list[str], vectors: dict[str, torch.Tensor],
                               first_word_id: int) -> int:
    """Copy pretrained word vectors into the rows of an embedding.

    Args:
        embedding: its weight (V, D); row ``first_word_id + i`` is ``words[i]``.
        words: the vocabulary's words after the special ids.
        vectors: word -> (D,) float vector (e.g. from a fastText ``.vec`` file).
        first_word_id: the id of ``words[0]``; the rows before it (padding, unknown, BOS, EOS)
            keep their random initialisation, so the unknown row is the one shared OOV vector.
    Returns:
        The number of rows filled.
    Raises:
        ValueError: the vectors' dimension is not D.
    """
    filled = 0
    with torch.no_grad():
        for i, word in enumerate(words):
            vec = vectors.get(word)
            if vec is None:
                continue
            if vec.numel() != embedding.weight.size(1):
                raise OptionError(f"pretrained vectors have dimension {vec.numel()}, the model's d_model is "
                                 f"{embedding.weight.size(1)}")
            embedding.weight[first_word_id + i] = vec
            filled += 1
    return filled
