"""Confidence of a translation: its mean token log-probability and a probability per word.

- Mean token log-probability: ``log P(Y | X) / |Y|``, |Y| the output tokens with EOS (the
  sentence-level score that quality estimation in OpenNMT-py and CTranslate2 reports; 0 is
  certain, more negative less sure).
- Word probability: the product of the probabilities of the word's subwords, ``exp(sum of
  their log-probabilities)``: the probability that the model produces that whole word given the
  words before it (chain rule), so it is comparable across words split into different numbers
  of subwords only as a joint probability (a long rare word is less probable). EOS belongs to
  no word. Words are those of :func:`attnmt.decode.alignment.word_ids`. Forced decoding of the
  same pair (``attnmt score``) gives the same numbers, up to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from attnmt.data.tokenizers import EOS_ID
from attnmt.decode.alignment import word_ids


def mean_log_prob(token_log_probs: Sequence[float]) -> float:
    """Mean natural-log probability per output token (EOS included); 0.0 for no tokens."""
    return sum(token_log_probs) / len(token_log_probs) if token_log_probs else 0.0


def word_probabilities(token_log_probs: Sequence[float], words: Sequence[int]) -> list[float]:
    """The probability of each word: the product of its subwords' probabilities.

    Args:
        token_log_probs: natural-log probability of each output token; tokens past ``words``
            (EOS) are ignored.
        words: the word index of each subword (non-decreasing, from 0).
    Returns:
        One probability per word index 0..max(words) (a word without subwords gets 1.0).
    """
    if not words:
        return []
    sums = [0.0] * (words[-1] + 1)
    for lp, w in zip(token_log_probs, words):
        sums[w] += lp
    return [math.exp(s) for s in sums]


def word_confidence(tokens: Sequence[int], token_log_probs: Sequence[float], decode: Callable[[list[int]], str]
                    ) -> tuple[list[str], list[float]]:
    """The words of an output and the probability of each.

    Args:
        tokens: output ids, maybe ending with EOS (which belongs to no word).
        token_log_probs: the natural-log probability of each of ``tokens``.
        decode: the target tokenizer's ids -> text.
    Returns:
        (words, probabilities): the whitespace-separated words of the detokenised output and,
        for each, the product of its subwords' probabilities.
    """
    body = [t for t in tokens if t != EOS_ID]
    words = decode(body).split()
    if not words:
        return [], []
    return words, word_probabilities(token_log_probs[:len(body)], word_ids(body, decode))[:len(words)]
