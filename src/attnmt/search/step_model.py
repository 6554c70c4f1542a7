"""The step model: what attnmt's greedy and beam search need from a model, and nothing more.

A step model encodes a batch of sources once, then decodes one position at a time with an
explicit cache that the search reorders as beams survive and sentences finish (fairseq's
incremental state with ``reorder_incremental_state``). ``attnmt.model.transformer.Transformer``
implements it in PyTorch, ``attnmt.interop.onnx.OnnxTransformer`` over ONNX Runtime sessions;
the browser page's JavaScript search (``attnmt/web/src/search.js``) drives the same three
calls. An engine that runs a whole search of its own (CTranslate2) is not a step model.

Shapes: B sentences, R hypothesis rows (B, or B x K in beam search: a sentence's K rows
consecutive), S source length, D d_model, V target vocabulary.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class StepCache(Protocol):
    """The decoding state between steps: one row per hypothesis for what grows with the output
    (self-attention keys and values), one row per sentence for the source side."""

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Follow the search: new hypothesis row j continues old row ``rows[j]`` ((R',) int64);
        with ``sources`` ((B',) int64), only those sentences stay (their source side is kept
        once per sentence and moves only then)."""
        ...


class StepModelConfig(Protocol):
    """What the search reads from the model's configuration."""

    max_positions: int  # output length limits stay below it
    decoder_start_id: int  # the first decoder input (BOS)


@runtime_checkable
class StepModel(Protocol):
    """encode; decode one step with a cache; reorder (the cache's :meth:`StepCache.reorder`).

    pad_id: the source padding id. config: :class:`StepModelConfig`.
    """

    pad_id: int
    config: Any  # a StepModelConfig (a Protocol attribute cannot be narrowed by implementations)

    def encode(self, src: torch.Tensor) -> tuple[Any, torch.Tensor, Any]:
        """src (B, S) int64, right-padded -> (memory, src_mask, weights): memory is whatever
        :meth:`decode_step` takes the source side as (the encoder output (B, S, D) float, or
        precomputed source keys and values), src_mask (B, 1, 1, S) bool (True = a real token),
        weights unused by the search."""
        ...

    def init_cache(self) -> StepCache:
        """An empty cache for one search."""
        ...

    def decode_step(self, tokens: torch.Tensor, memory: Any, src_mask: torch.Tensor, cache: Any) -> torch.Tensor:
        """tokens (R, 1) int64, the newest token of each hypothesis -> next-token
        log-probabilities (R, V) (any float dtype; forbidden ids at -inf). ``memory`` and
        ``src_mask`` have one row per sentence (R / B hypotheses each); ``memory`` may be None
        after the first step (the cache then holds the source side)."""
        ...
