"""The stopping rules of beam search: early stopping with patience (CTranslate2's rule) and exact
stopping, on hand-set probabilities and on a tiny random model."""

from __future__ import annotations

import math

import pytest
import torch

from attnmt.data.tokenizers import EOS_ID
from attnmt.search.batched import search_batch
from attnmt.search.beam import beam_search
from attnmt.search.options import SearchOptions, finished_wanted, length_penalty
from tests.conftest import tiny_model
from tests.test_search_core import SRC, A, B_, C, FakeModel, run_beam

# Step 1: A 0.5, EOS 0.3, B 0.2. [EOS] finishes (0.3); A and B stay open. Step 2: [A, C] 0.45 and
# [B, EOS] 0.2 are the two best: [B, EOS] finishes, the second finished hypothesis. Step 3:
# [A, C, EOS] 0.45 finishes, better than both.
LATE_WINNER = {(): {A: 0.5, EOS_ID: 0.3, B_: 0.2}, (A,): {C: 0.9, EOS_ID: 0.1}, (B_,): {EOS_ID: 1.0},
               (A, C): {EOS_ID: 1.0}}


def test_early_stopping_ends_at_k_finished_and_exact_waits_for_the_better_one():
    (early,) = run_beam(FakeModel(LATE_WINNER, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0, nbest=2,
                        early_stopping=True)
    assert [h.tokens for h in early] == [[EOS_ID], [B_, EOS_ID]]
    assert [h.log_prob for h in early] == pytest.approx([math.log(0.3), math.log(0.2)], abs=1e-5)
    (exact,) = run_beam(FakeModel(LATE_WINNER, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0, nbest=2)
    assert [h.tokens for h in exact] == [[A, C, EOS_ID], [EOS_ID]]


def test_patience_waits_for_more_finished_hypotheses():
    # round(2 x 1.5) = 3 finished hypotheses: the search goes on to step 3 and finds [A, C, EOS].
    (hyps,) = run_beam(FakeModel(LATE_WINNER, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0, nbest=2,
                       early_stopping=True, patience=1.5)
    assert [h.tokens for h in hyps] == [[A, C, EOS_ID], [EOS_ID]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.45), abs=1e-5)


def test_at_the_limit_both_rules_finish_hypotheses_without_eos():
    """CTranslate2's last step, under either stopping rule: the K best extensions finish as they are."""
    model = FakeModel({}, default={A: 0.9, B_: 0.1})  # EOS never proposed (log-prob -30)
    (early,) = run_beam(model, SRC, beam_size=2, length_penalty=1.0, max_len_a=0.0, max_len_b=3, early_stopping=True)
    assert early[0].tokens == [A, A, A]
    assert early[0].token_log_probs == pytest.approx([math.log(0.9)] * 3, abs=1e-5)
    assert early[0].score == pytest.approx(3 * math.log(0.9) / length_penalty(3, 1.0, 5.0), abs=1e-5)
    (exact,) = run_beam(FakeModel({}, default={A: 0.9, B_: 0.1}), SRC, beam_size=2, length_penalty=1.0, max_len_a=0.0,
                        max_len_b=3)
    assert exact[0].tokens == [A, A, A] and exact[0].score == pytest.approx(early[0].score, abs=1e-6)


def test_finished_wanted_rounds_half_away_from_zero():
    assert finished_wanted(5, 1.0) == 5
    assert finished_wanted(4, 1.125) == 5  # 4.5 -> 5 (std::round), where Python's round gives 4
    assert finished_wanted(4, 1.1) == 4
    assert finished_wanted(3, 2.0) == 6
    assert SearchOptions(beam_size=4, early_stopping=True, patience=1.125).finished_wanted == 5
    assert SearchOptions(beam_size=4).finished_wanted is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(early_stopping=True, patience=0.5), "patience .* is out of range: use a finite number from 1 to"),
    (dict(early_stopping=True, patience=float("nan")), "patience .* is out of range: use a finite number from 1 to"),
    (dict(patience=2.0), "applies only to early stopping"),
])
def test_patience_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(beam_size=4, **kwargs)


def _sources() -> torch.Tensor:
    torch.manual_seed(7)
    src = torch.randint(4, 40, (4, 9))
    src[:, -1] = EOS_ID
    src[2, 5:] = 0
    src[2, 4] = EOS_ID
    return src


def test_early_stopping_batching_is_invisible_and_nbest_is_ranked():
    model = tiny_model(seed=6, vocab=40)
    src = _sources()
    options = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4, nbest=3, early_stopping=True,
                            patience=1.5)
    batched = beam_search(model, src, options)
    for i in range(src.size(0)):
        alone = beam_search(model, src[i:i + 1], options)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        scores = [h.score for h in batched[i]]
        assert scores == sorted(scores, reverse=True)
        for h in batched[i]:
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens), 0.6, 5.0), abs=1e-4)
            assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)


def test_greedy_search_ignores_the_stopping_rule():
    model = tiny_model(seed=6, vocab=40)
    sources = [row[row != 0].tolist() for row in _sources()]
    exact = search_batch(model, sources, SearchOptions(beam_size=1, max_len_a=1.0, max_len_b=4))
    early = search_batch(model, sources, SearchOptions(beam_size=1, max_len_a=1.0, max_len_b=4,
                                                       early_stopping=True, patience=2.0))
    assert [h.tokens for [h] in exact] == [h.tokens for [h] in early]
    cut = [(h, len(src) + 4) for [h], src in zip(early, sources) if h.tokens[-1] != EOS_ID]  # no EOS: cut
    assert cut and all(len(h.tokens) == limit for h, limit in cut)  # at the limit, 1.0 x source length + 4
    assert all(h.log_prob == pytest.approx(sum(h.token_log_probs)) for [h] in early)


@pytest.mark.parametrize("early_stopping", [True, False])
def test_constrained_sentences_end_with_eos_at_their_limit(early_stopping):
    """A sentence with phrases is checked when EOS is allowed, so at its limit it still gets EOS;
    a sentence without phrases in the same batch is cut as plain beam search cuts it."""
    model = tiny_model(seed=8, vocab=40)
    sources = [row[row != 0].tolist() for row in _sources()][:2]
    phrase = [11, 12]
    options = SearchOptions(beam_size=3, nbest=3, max_len_a=0.0, max_len_b=6, early_stopping=early_stopping,
                            constraints=[[phrase], []])
    with_phrase, without = search_batch(model, sources, options)
    for h in with_phrase:
        assert h.tokens[-1] == EOS_ID
        assert any(h.tokens[k:k + 2] == phrase for k in range(len(h.tokens) - 1))
    plain = search_batch(model, sources[1:], SearchOptions(beam_size=3, nbest=3, max_len_a=0.0, max_len_b=6,
                                                           early_stopping=early_stopping))[0]
    assert [h.tokens for h in without] == [h.tokens for h in plain]
    assert any(len(h.tokens) == 6 and h.tokens[-1] != EOS_ID for h in without)  # cut at the limit, no EOS


def test_config_keys_of_the_stopping_rule():
    from attnmt.config import config_from_dict
    from attnmt.errors import ConfigError

    decode = config_from_dict({"decode": {"early_stopping": True, "patience": 1.5}}).decode
    options = SearchOptions.from_config(decode, beam_size=4)
    assert (options.early_stopping, options.patience, options.finished_wanted) == (True, 1.5, 6)
    assert SearchOptions.from_config(config_from_dict({}).decode).early_stopping is False  # exact by default
    with pytest.raises(ConfigError, match="decode.patience applies only to decode.early_stopping true"):
        config_from_dict({"decode": {"patience": 2.0}})
    with pytest.raises(ConfigError, match="decode.patience"):
        config_from_dict({"decode": {"early_stopping": True, "patience": 0.5}})
