"""Lexically constrained beam search (dynamic beam allocation): tracking, allocation order, and
searches with hand-set probabilities and with a random model."""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch

from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.search.beam import beam_search
from attnmt.search.options import SearchOptions
from attnmt.search.constraints import ConstraintState, advance, constraints_fit, met_tokens, next_tokens, round_robin
from tests.conftest import tiny_model
from tests.test_search_core import SRC, A, B_, C, FakeModel, run_beam


def _walk(phrases, tokens):
    state = ConstraintState.start(len(phrases))
    for tok in tokens:
        state = advance(phrases, state, tok)
    return state


def test_tracking_partial_phrases():
    phrases = [[A, B_, C], [C]]
    state = _walk(phrases, [A, B_])
    assert (state.met, state.phrase, state.progress) == ((False, False), 0, 2)
    assert met_tokens(phrases, state) == 2 and next_tokens(phrases, state) == {C}
    # Abandoned midway: its tokens are un-met again.
    state = _walk(phrases, [A, B_, A])
    assert (state.met, state.phrase, state.progress) == ((False, False), 0, 1) and met_tokens(phrases, state) == 1
    assert _walk(phrases, [A, B_, B_]) == ConstraintState((False, False))
    # The abandoned run's suffix can begin the phrase again: "a a b" is found in "a a a b".
    assert _walk([[A, A, B_]], [A, A, A, B_]).met == (True,)
    # A mismatch that completes another phrase meets it.
    assert _walk(phrases, [A, C]).met == (False, True)
    state = _walk(phrases, [C, A, B_, C])
    assert state.met == (True, True) and met_tokens(phrases, state) == 4 and next_tokens(phrases, state) == set()


def test_round_robin_allocates_slots_across_banks():
    banks = [0, 0, 0, 1, 2, 1, 0]
    scores = [-1.0, -2.0, -3.0, -5.0, -9.0, -4.0, -0.5]
    # Best of bank 2, of bank 1, of bank 0; then the second best of each bank that has one, ...
    assert round_robin(banks, scores) == [4, 5, 6, 3, 0, 1, 2]
    assert round_robin([], []) == []


def test_constraints_fit():
    assert constraints_fit([[4, 5], [6]], 4) and not constraints_fit([[4, 5], [6]], 3)


def test_a_constraint_changes_the_output_to_contain_it():
    # Unconstrained: [A, EOS] (0.6 * 0.8). With the constraint [C]: step 1 keeps C (bank 1) and
    # A (bank 0); step 2 ranks A->C (0.12, bank 1) first; A, C, EOS finishes at step 3.
    table = {(): {A: 0.6, B_: 0.3, C: 0.1}, (A,): {EOS_ID: 0.8, C: 0.2}, (C,): {EOS_ID: 0.7, A: 0.3}}
    (plain,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0)
    assert plain[0].tokens == [A, EOS_ID]
    (hyps,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0, constraints=[[[C]]])
    assert hyps[0].tokens == [A, C, EOS_ID]
    assert hyps[0].log_prob == pytest.approx(math.log(0.12), abs=1e-5)
    assert hyps[0].token_log_probs == pytest.approx([math.log(0.6), math.log(0.2), 0.0], abs=1e-5)


def test_eos_waits_for_a_two_token_phrase():
    # The model would stop after A (EOS 0.9); the phrase [B, C] must come first, in order.
    table = {(): {A: 0.9, B_: 0.1}, (A,): {EOS_ID: 0.9, B_: 0.05, C: 0.05}, (A, B_): {EOS_ID: 0.6, C: 0.4},
             (A, B_, C): {EOS_ID: 1.0}}
    (hyps,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=3, length_penalty=0.0, nbest=2,
                       constraints=[[[B_, C]]])
    assert hyps[0].tokens == [A, B_, C, EOS_ID]
    assert hyps[0].log_prob == pytest.approx(math.log(0.9 * 0.05 * 0.4), abs=1e-5)
    for h in hyps:  # every finished hypothesis contains the phrase
        assert any(h.tokens[k:k + 2] == [B_, C] for k in range(len(h.tokens)))


def test_constraints_longer_than_the_limit_are_dropped_with_a_warning(caplog):
    table = {(): {A: 0.6, EOS_ID: 0.4}}
    model = FakeModel(table, {EOS_ID: 1.0})
    with caplog.at_level(logging.WARNING, logger="attnmt.search.constraints"):
        (hyps,) = run_beam(model, SRC, beam_size=2, length_penalty=0.0, max_len_a=0.0, max_len_b=3,
                           constraints=[[[B_, C], [B_, B_]]])
    assert "sentence 1" in caplog.text and "output limit is 3" in caplog.text
    (plain,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0, max_len_a=0.0, max_len_b=3)
    assert [h.tokens for h in hyps] == [h.tokens for h in plain]


def test_special_ids_in_a_phrase_are_refused():
    with pytest.raises(ValueError, match="special"):
        run_beam(FakeModel({}, {EOS_ID: 1.0}), SRC, beam_size=2, constraints=[[[A, EOS_ID]]])


def _sources(seed: int, rows: int) -> torch.Tensor:
    torch.manual_seed(seed)
    src = torch.randint(4, 40, (rows, 7))
    src[:, -1] = EOS_ID
    src[1, 4:] = PAD_ID
    src[1, 3] = EOS_ID
    return src


@pytest.mark.parametrize("beam_size", [1, 4])
def test_random_model_meets_every_constraint_and_leaves_the_others_alone(beam_size):
    model = tiny_model(seed=7, vocab=40)
    src = _sources(seed=beam_size, rows=4)
    rng = random.Random(beam_size)
    plain = beam_search(model, src, SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=6, nbest=1))
    for trial in range(3):
        constraints = [[[rng.randint(4, 39) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 2))],
                       [], [[rng.randint(4, 39)]], []]
        out = beam_search(model, src, SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=6, nbest=1,
                                                    constraints=constraints))
        for phrases, (h,) in zip(constraints, out):
            for p in phrases:
                assert any(h.tokens[k:k + len(p)] == p for k in range(len(h.tokens))), (trial, p, h.tokens)
            assert h.tokens[-1] == EOS_ID or not phrases  # a constrained output ends with EOS, even at its limit
            assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)
        for i in (1, 3):  # the unconstrained sentences of the batch: exactly plain beam search
            assert out[i][0].tokens == plain[i][0].tokens
            assert out[i][0].token_log_probs == plain[i][0].token_log_probs and out[i][0].score == plain[i][0].score


def test_empty_constraints_equal_plain_beam_search_exactly():
    model = tiny_model(seed=8, vocab=40)
    src = _sources(seed=2, rows=3)
    plain = beam_search(model, src, SearchOptions(beam_size=4, nbest=3))
    same = beam_search(model, src, SearchOptions(beam_size=4, nbest=3, constraints=[[], [], []]))
    assert [[(h.tokens, h.token_log_probs, h.score) for h in hs] for hs in plain] == \
        [[(h.tokens, h.token_log_probs, h.score) for h in hs] for hs in same]


def test_constraints_and_streaming_follow_their_sentences_through_length_batches():
    from attnmt.search.batched import native_search
    from attnmt.search.options import SearchOptions

    model = tiny_model(seed=9, vocab=40)
    sources = [[5, 6, EOS_ID], [7, 8, 9, 10, 11, EOS_ID], [12, EOS_ID], [13, 14, 15, 16, EOS_ID], [17, 18, 19, EOS_ID]]
    constraints = [[[20]], [], [[21, 22]], [[23], [24]], []]
    reported: dict[int, list[int]] = {}

    def on_step(i: int, tokens: list[int]) -> bool:
        reported[i] = tokens
        return False

    for beam_size in (1, 3):
        options = SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=6, constraints=constraints,
                                on_step=on_step)
        assert options.requested() >= {"constraints", "streaming"}
        out = native_search(model, sources, options, batch_size=2)  # batches of the longest first
        plain = native_search(model, sources, SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=6),
                              batch_size=2)
        for i, ((h,), phrases) in enumerate(zip(out, constraints)):
            assert all(any(h.tokens[k:k + len(p)] == p for k in range(len(h.tokens))) for p in phrases), i
            assert h.tokens[:len(reported[i])] == reported[i]  # streamed under its own index
            if not phrases:
                assert h.tokens == plain[i][0].tokens
