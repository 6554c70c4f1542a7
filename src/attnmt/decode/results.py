"""What translating a sentence returns: its scored hypotheses, best first, and the sentence's
:class:`Translation` around them (source pieces, attention, warnings).

A search (``attnmt.search``) returns :class:`attnmt.search.hypothesis.Hypothesis` objects of
target ids; :func:`scored_hypothesis` adds what a user reads: the detokenised text and the
subword pieces. ``attnmt.decode.translator.Translator`` returns these records; the output
formats are built from them.

Shapes: T output length, S source length, L layers, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnmt.data.tokenizers import EOS_ID
from attnmt.decode.confidence import mean_log_prob

if TYPE_CHECKING:  # PyTorch only where an engine returned attention: the others run without it
    import torch

    from attnmt.data.tokenizers import Tokenizer, WordTokenizer
    from attnmt.search.hypothesis import Hypothesis


@dataclass
class ScoredHypothesis:
    """One translation candidate.

    text: detokenized output. token_ids: output ids (ending with EOS unless cut at the length
    limit). pieces: their subword strings (EOS shown as '</s>').
    token_log_probs: natural-log probability of each piece. log_prob: their sum.
    score: log_prob / length penalty (beam search) or log_prob (greedy); with
    ``decode.length_penalty_type: average`` log_prob / len(token_ids) in both.
    alignment: when asked for, its word alignment: (source word, output word) pairs, 0-based
    indices of whitespace-separated words (``attnmt.decode.alignment``).
    """

    text: str
    token_ids: list[int]
    pieces: list[str]
    token_log_probs: list[float]
    log_prob: float
    score: float
    alignment: list[tuple[int, int]] | None = None

    @property
    def mean_log_prob(self) -> float:
        """Confidence: the mean natural-log probability per token, EOS included (0.0 when empty)."""
        return mean_log_prob(self.token_log_probs)


@dataclass
class Translation:
    """The result for one input sentence.

    hypotheses: best first (``nbest`` of them). src_pieces: source subwords incl. '</s>'.
    attention: when requested, the best hypothesis' encoder-decoder attention, float32
    (L, H, T, S) with T = len(hypotheses[0].pieces) and S = len(src_pieces).
    warnings: what could not be honoured, e.g. constraints too long for the output limit.
    """

    hypotheses: list[ScoredHypothesis]
    src_pieces: list[str] = field(default_factory=list)
    attention: torch.Tensor | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The best translation."""
        return self.hypotheses[0].text if self.hypotheses else ""

    @property
    def alignment(self) -> list[tuple[int, int]] | None:
        """The best translation's word alignment, when asked for."""
        return self.hypotheses[0].alignment if self.hypotheses else None


def scored_hypothesis(hypothesis: Hypothesis, tgt_tokenizer: Tokenizer | WordTokenizer) -> ScoredHypothesis:
    """A search's hypothesis with its text (the ids before EOS, detokenised) and pieces (EOS
    shown as '</s>'); ids, log-probabilities and score are copied as they are."""
    tokens = hypothesis.tokens
    body = tokens[:-1] if tokens and tokens[-1] == EOS_ID else tokens
    pieces = tgt_tokenizer.pieces(body) + (["</s>"] if len(body) < len(tokens) else [])
    return ScoredHypothesis(tgt_tokenizer.decode(body), list(tokens), pieces, list(hypothesis.token_log_probs),
                            hypothesis.log_prob, hypothesis.score)


def empty_translation(nbest: int = 1) -> Translation:
    """The translation of an empty line: ``nbest`` empty hypotheses with score 0."""
    return Translation([ScoredHypothesis("", [], [], [], 0.0, 0.0) for _ in range(nbest)])
