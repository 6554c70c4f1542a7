"""Streaming hooks of greedy and beam search: the settled tokens reported at each step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.search.beam import beam_search
from attnmt.search.greedy import greedy_search
from attnmt.search.options import SearchOptions
from tests.conftest import tiny_model

SRC = torch.tensor([[5, 9, 12, 7, 30, 8, EOS_ID], [6, 11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])


def _recorder(stop_at: dict[int, int] | None = None):
    calls: dict[int, list[list[int]]] = {}

    def on_step(i: int, tokens: list[int]) -> bool:
        calls.setdefault(i, []).append(list(tokens))
        return stop_at is not None and len(calls[i]) >= stop_at.get(i, 10 ** 9)

    return calls, on_step


@pytest.mark.parametrize("beam_size", [1, 4])
def test_reported_prefixes_grow_and_end_as_the_result(beam_size):
    model = tiny_model(seed=11, vocab=40)
    calls, on_step = _recorder()
    if beam_size == 1:
        final = [[h] for h in greedy_search(model, SRC, max_len_a=1.0, max_len_b=8, on_step=on_step)]
        assert final == [[h] for h in greedy_search(model, SRC, max_len_a=1.0, max_len_b=8)]
    else:
        options = SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=8, nbest=2)
        final = beam_search(model, SRC, replace(options, on_step=on_step))
        assert final == beam_search(model, SRC, options)
    for i, hyps in enumerate(final):
        reported = calls[i]
        for before, after in zip(reported, reported[1:]):
            assert after[:len(before)] == before  # settled tokens are never taken back
        for h in hyps:  # every returned hypothesis starts with the last settled prefix
            assert h.tokens[:len(reported[-1])] == reported[-1]
        if beam_size == 1:  # greedy: one call per token, the last with all of them
            assert reported[-1] == hyps[0].tokens and len(reported) == len(hyps[0].tokens)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_stopping_a_sentence_leaves_the_others_alone(beam_size):
    model = tiny_model(seed=12, vocab=40)
    calls, on_step = _recorder(stop_at={0: 2})
    if beam_size == 1:
        out = greedy_search(model, SRC, max_len_a=2.0, max_len_b=8, on_step=on_step)
        plain = greedy_search(model, SRC, max_len_a=2.0, max_len_b=8)
        assert len(out[0].tokens) == 2
        out, plain = [out], [plain]
    else:
        options = SearchOptions(beam_size=beam_size, max_len_a=2.0, max_len_b=8)
        out = beam_search(model, SRC, replace(options, on_step=on_step))
        plain = beam_search(model, SRC, options)
    # the other sentence: the same search (a smaller batch may round the last digit differently)
    other, alone = (out[0][1], plain[0][1]) if beam_size == 1 else (out[1][0], plain[1][0])
    assert other.tokens == alone.tokens and other.log_prob == pytest.approx(alone.log_prob, abs=1e-4)
    assert len(calls[0]) == 2  # no step after the stop
