"""The Transformer: embeddings, encoder and decoder stacks, output projection (paper section 3).

Read top-down: ``Transformer.forward`` = ``decode(encode(src), tgt_in)``. The encoder is a stack
of N ``EncoderLayer``s over scaled embeddings plus positions; the decoder a stack of N
``DecoderLayer``s, then a linear projection to vocabulary logits. Search code uses
``encode``, ``init_cache`` and ``decode_step`` (one new target position per call); training
uses ``decoder_states`` (the projection's input), as its loss applies the projection itself.

Embeddings are multiplied by sqrt(d_model) (section 3.4). With a joint vocabulary, source and
target embeddings can be shared (``share_embeddings``), and the output projection shares the
target embedding (``tie_output``, the paper's choice, section 3.4).

Shapes: B batch, S source length, T target length, D d_model, H heads, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnmt.config import ModelConfig
from attnmt.data.tokenizers import PAD_ID
from attnmt.model.attention import DecoderCache, LayerCache, padding_mask
from attnmt.model.dropout import Dropout
from attnmt.model.layers import DecoderLayer, EncoderLayer
from attnmt.model.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(d_model) (section 3.4): (B, T) int64 -> (B, T, D)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model ** -0.5)
        with torch.no_grad():
            self.weight[PAD_ID].zero_()
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(tokens, self.weight, padding_idx=PAD_ID) * self.scale


def _positions(cfg: ModelConfig) -> nn.Module:
    if cfg.positional == "learned":
        return LearnedPositionalEmbedding(cfg.d_model, cfg.max_positions)
    return SinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions)


@dataclass
class DecoderOutput:
    """Decoder results: logits (B, T, V); per-layer attention weights when requested:
    self_attention[l] (B, H, T, T), source_attention[l] (B, H, T, S)."""

    logits: torch.Tensor
    self_attention: list[torch.Tensor] | None = None
    source_attention: list[torch.Tensor] | None = None


class Encoder(nn.Module):
    """N encoder layers over embeddings + positions (final LayerNorm only with pre-norm)."""

    def __init__(self, cfg: ModelConfig, embedding: ScaledEmbedding):
        super().__init__()
        self.embedding = embedding
        self.positions = _positions(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.norm_first)
            for _ in range(cfg.num_encoder_layers)
        )
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """src: (B, S) ids; src_mask: (B, 1, 1, S). Returns memory (B, S, D) and, if asked,
        each layer's self-attention weights (B, H, S, S)."""
        x = self.dropout(self.embedding(src) + self.positions(src.size(1)))  # (B, S, D)
        weights = [] if need_weights else None
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights)
            if weights is not None:
                weights.append(w)
        return self.final_norm(x), weights


class Decoder(nn.Module):
    """N decoder layers over embeddings + positions, then the output projection to V logits."""

    def __init__(self, cfg: ModelConfig, embedding: ScaledEmbedding, vocab_size: int):
        super().__init__()
        self.embedding = embedding
        self.positions = _positions(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.norm_first)
            for _ in range(cfg.num_decoder_layers)
        )
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.output_projection = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_output:
            self.output_projection.weight = embedding.weight
        else:
            nn.init.normal_(self.output_projection.weight, std=cfg.d_model ** -0.5)

    def forward(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
        cache: DecoderCache | None = None, need_weights: bool = False,
    ) -> DecoderOutput:
        """tgt_in: (B, T) ids (with a cache, only the new positions); memory: (B, S, D)."""
        states, self_ws, src_ws = self.states(tgt_in, memory, src_mask, cache, need_weights)
        return DecoderOutput(self.output_projection(states), self_ws, src_ws)

    def states(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
        cache: DecoderCache | None = None, need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """The final states (B, T, D), before the output projection, and the attention weights
        of :class:`DecoderOutput` when asked (else None)."""
        offset = cache.step if cache is not None else 0
        x = self.dropout(self.embedding(tgt_in) + self.positions(tgt_in.size(1), offset))  # (B, T, D)
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
    """The encoder-decoder Transformer (Figure 1)."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError("share_embeddings needs a joint vocabulary (equal source and target sizes)")
        self.config = cfg
        src_embedding = ScaledEmbedding(src_vocab_size, cfg.d_model)
        tgt_embedding = src_embedding if cfg.share_embeddings else ScaledEmbedding(tgt_vocab_size, cfg.d_model)
        self.encoder = Encoder(cfg, src_embedding)
        self.decoder = Decoder(cfg, tgt_embedding, tgt_vocab_size)
        self._init_linear_weights()

    def _init_linear_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embedding" not in name and "output_projection" not in name:
                nn.init.xavier_uniform_(p)

    def encode(self, src: torch.Tensor, need_weights: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """src: (B, S) int64 ids. Returns memory (B, S, D), src_mask (B, 1, 1, S) bool, and the
        encoder self-attention weights per layer when asked."""
        src_mask = padding_mask(src, PAD_ID)
        memory, weights = self.encoder(src, src_mask, need_weights)
        return memory, src_mask, weights

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               need_weights: bool = False) -> DecoderOutput:
        """Teacher-forced decoding of a whole prefix: tgt_in (B, T) -> logits (B, T, V)."""
        return self.decoder(tgt_in, memory, src_mask, None, need_weights)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the next target token at every position, from src (B, S) and
        tgt_in (B, T) = BOS + target."""
        return self.decoder.output_projection(self.decoder_states(src, tgt_in))

    def decoder_states(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The decoder's final states (B, T, D), the input of the output projection: training
        computes its loss from these and ``decoder.output_projection.weight`` (V, D) in row
        chunks, never holding the (B, T, V) logits (``attnmt.train.losses``)."""
        memory, src_mask, _ = self.encode(src)
        return self.decoder.states(tgt_in, memory, src_mask)[0]

    def init_cache(self) -> DecoderCache:
        """An empty incremental-decoding state for :meth:`decode_step`."""
        return DecoderCache([LayerCache() for _ in self.decoder.layers])

    def decode_step(self, tokens: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor,
                    cache: DecoderCache) -> torch.Tensor:
        """Log-probabilities of the next token after feeding one new position per sentence.

        Args:
            tokens: (B, 1) int64, the last token of each prefix.
            memory, src_mask: from :meth:`encode`, one row per sentence: B rows, or B / K when
                the K beams of each sentence are K consecutive rows of ``tokens`` (they share
                the source's keys/values). ``memory`` is only read at the first step (it may
                be None once the cache holds the source-attention keys/values).
            cache: grown in place by one position.
        Returns:
            (B, V) log-probabilities in the model's dtype: float32 for a float32 model; for a
            bfloat16 model computed in float32 by the fused log-softmax kernel and rounded to
            bfloat16 (relative error <= 2^-8, e.g. +-0.004 on a log-probability of -1), which
            halves the bytes the search's top-k reads over the whole vocabulary every step.
        """
        logits = self.decoder(tokens, memory, src_mask, cache).logits[:, -1]  # (B, V)
        return torch.log_softmax(logits, dim=-1)


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad)
