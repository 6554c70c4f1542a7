"""What every search returns, and the output length limit that greedy and beam search share.

Shapes: B batch (sentences), S source length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # only for annotations: engines without PyTorch (CTranslate2) import this module
    import torch


@dataclass
class Hypothesis:
    """One output of a search.

    tokens: generated ids, ending with EOS unless the length limit stopped the search first.
    token_log_probs: natural-log probability of each of ``tokens`` (same length); empty where
        the search was asked not to return them (``SearchOptions.return_token_log_probs``) and
        the engine does not have them for free.
    log_prob: the sum of ``token_log_probs``.
    score: what ranks hypotheses: ``log_prob`` divided by the length penalty in beam search,
        ``log_prob`` itself in greedy search.
    attention: None, or (when an engine is asked for it) the encoder-decoder attention that
        produced ``tokens``: float32 (L, H, T, S), L decoder layers, H heads, T = len(tokens),
        S source tokens (EOS included).
    """

    tokens: list[int]
    token_log_probs: list[float]
    log_prob: float
    score: float
    attention: torch.Tensor | None = None


def max_output_lengths(src: torch.Tensor, pad_id: int, a: float, b: int, limit: int) -> torch.Tensor:
    """Per-sentence output length limits ``floor(a * source length + b)`` in tokens (EOS
    included), at least 1 and at most ``limit`` (the model's max_positions - 1).

    Args:
        src: (B, S) int64 source ids, right-padded with ``pad_id``.
    Returns:
        (B,) int64.
    """
    src_len = (src != pad_id).sum(dim=1).float()  # (B,)
    return (a * src_len + b).floor().long().clamp(min=1, max=limit)


def output_length_limits(src_lengths: Sequence[int], a: float, b: int, limit: int) -> list[int]:
    """:func:`max_output_lengths` without PyTorch, for engines that have none (the same float32
    arithmetic, so the same limits).

    Args:
        src_lengths: each sentence's source length in tokens (EOS included).
    """
    src_len = np.asarray(src_lengths, dtype=np.float32)
    return np.clip(np.floor(np.float32(a) * src_len + np.float32(b)), 1, limit).astype(np.int64).tolist()
