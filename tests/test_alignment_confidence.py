"""Word alignments from attention and word probabilities: hand-made matrices and tokenizers."""

from __future__ import annotations

import math

import pytest
import torch

from attnmt.data.tokenizers import EOS_ID

from attnmt.decode.alignment import align_words, format_alignment, word_ids
from attnmt.decode.confidence import mean_log_prob, word_probabilities

PIECES = {11: "▁Ein", 12: "▁Fahr", 13: "rad", 14: "▁fährt", 15: "."}  # ids past the special ones


def _decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids if i != EOS_ID).replace("▁", " ").strip()


def test_word_ids_follow_the_detokenised_words():
    assert word_ids([11, 12, 13, 14, 15], _decode) == [0, 1, 1, 2, 2]  # "Ein Fahrrad fährt."
    assert word_ids([13, 12], _decode) == [0, 1]
    assert word_ids([], _decode) == []


def test_alignment_sums_source_subwords_and_averages_target_subwords():
    # 3 target subwords (words 0, 1, 1) then EOS; 4 source subwords (words 0, 1, 1, 2) then EOS.
    att = torch.tensor([[0.60, 0.10, 0.10, 0.10, 0.10],
                        [0.40, 0.30, 0.00, 0.20, 0.10],   # alone, source word 0 (0.4) beats word 1 (0.3)
                        [0.10, 0.30, 0.30, 0.20, 0.10],   # summed, word 1 (0.6) wins
                        [0.00, 0.00, 0.00, 0.00, 1.00]])  # EOS row: ignored
    pairs = align_words(att, [0, 1, 1, 2], [0, 1, 1])
    # target word 1: mean over its two rows of the summed mass: word 0 0.25, word 1 0.35, word 2 0.2
    assert pairs == [(0, 0), (1, 1)]
    assert format_alignment(pairs) == "0-0 1-1"
    # The source EOS column never wins, however large.
    assert align_words(torch.tensor([[0.2, 0.1, 0.7]]), [0, 1], [0]) == [(0, 0)]
    assert align_words(att, [], [0]) == []
    with pytest.raises(ValueError):
        align_words(att, [0] * 6, [0])


def test_word_probabilities_are_products_of_subword_probabilities():
    lps = [math.log(0.5), math.log(0.8), math.log(0.9), math.log(0.7)]  # three subwords and EOS
    probs = word_probabilities(lps, [0, 1, 1])
    assert probs == pytest.approx([0.5, 0.72])
    assert mean_log_prob(lps) == pytest.approx(sum(lps) / 4)
    assert mean_log_prob([]) == 0.0 and word_probabilities([], []) == []


def test_word_confidence_names_the_words():
    from attnmt.decode.confidence import word_confidence

    lps = [math.log(0.5), math.log(0.8), math.log(0.9), math.log(0.6), math.log(0.7), math.log(0.99)]
    words, probs = word_confidence([11, 12, 13, 14, 15, EOS_ID], lps, _decode)
    assert words == ["Ein", "Fahrrad", "fährt."]
    assert probs == pytest.approx([0.5, 0.72, 0.42])
    assert word_confidence([EOS_ID], [0.0], _decode) == ([], [])
