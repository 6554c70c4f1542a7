"""What every search returns, and the pieces greedy and beam search share.

Shapes: B batch (sentences), K beam size, S source length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnmt.data.tokenizers import PAD_ID


@dataclass
class Hypothesis:
    """One output of a search.

    tokens: generated ids, ending with EOS_ID unless the maximum length stopped it.
    token_log_probs: natural-log probability of each of ``tokens`` (same length).
    log_prob: sum of ``token_log_probs``.
    score: the ranking score: ``log_prob`` divided by the length penalty (beam search), or
        ``log_prob`` itself (greedy).
    """

    tokens: list[int]
    token_log_probs: list[float]
    log_prob: float
    score: float
    extra: dict = field(default_factory=dict)


def max_output_lengths(src: torch.Tensor, a: float, b: int, limit: int) -> torch.Tensor:
    """Per-sentence output length limits ``a * source_length + b`` (tokens, EOS included),
    at least 1 and at most ``limit`` (the model's max_positions): (B,) int64."""
    src_len = (src != PAD_ID).sum(dim=1).float()  # (B,)
    return (a * src_len + b).floor().long().clamp(min=1, max=limit)
