"""Greedy and beam search: hand-set probabilities, the length penalty, stopping, n-best."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.search.batched import search_in_batches
from attnmt.search.beam import beam_search
from attnmt.search.greedy import greedy_search
from attnmt.search.hypothesis import Hypothesis
from attnmt.search.options import SearchOptions, length_penalty
from tests.conftest import tiny_model

A, B_, C = 4, 5, 6  # token ids of the fake vocabulary (size 8)
V = 8


class FakeCache:
    def __init__(self, rows: int):
        self.prefixes = [() for _ in range(rows)]

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]


class FakeModel:
    """Next-token distributions looked up by the prefix generated so far (BOS excluded)."""

    def __init__(self, table: dict[tuple, dict[int, float]], default: dict[int, float]):
        self.table, self.default = table, default
        self.config = SimpleNamespace(max_positions=100, decoder_start_id=BOS_ID)
        self.pad_id = PAD_ID

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1), (src != PAD_ID)[:, None, None, :], None

    def init_cache(self):
        return None  # created lazily with the row count

    def decode_step(self, tokens, memory, src_mask, cache):
        rows = tokens.size(0)
        out = torch.full((rows, V), -30.0)  # tokens a distribution leaves out: log-prob -30
        for r, tok in enumerate(tokens[:, 0].tolist()):
            if tok != BOS_ID:
                self._cache.prefixes[r] = self._cache.prefixes[r] + (tok,)
            dist = self.table.get(self._cache.prefixes[r], self.default)
            for t, p in dist.items():
                out[r, t] = math.log(p)
        return out


def run_beam(model: FakeModel, src, **kwargs):
    cache = FakeCache(src.size(0) * kwargs.get("beam_size", 5))
    model._cache = cache
    model.init_cache = lambda: cache
    return beam_search(model, src, SearchOptions(**kwargs))


SRC = torch.tensor([[7, 7, EOS_ID]])


def test_length_penalty_values():
    assert length_penalty(1, 0.6, 5) == pytest.approx(1.0)
    assert length_penalty(10, 0.6, 5) == pytest.approx((15 / 6) ** 0.6)
    assert length_penalty(7, 0.0, 5) == 1.0


def test_early_finisher_is_not_final_while_an_open_hypothesis_can_win():
    # [EOS] finishes first (p 0.4) but [A, EOS] (0.6 * 0.9 = 0.54) is better.
    model = FakeModel({(): {A: 0.6, EOS_ID: 0.4}, (A,): {EOS_ID: 0.9, B_: 0.1}}, default={EOS_ID: 1.0})
    (hyps,) = run_beam(model, SRC, beam_size=2, length_penalty=0.0, nbest=2)
    assert [h.tokens for h in hyps] == [[A, EOS_ID], [EOS_ID]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.54), abs=1e-5)
    assert hyps[0].token_log_probs == pytest.approx([math.log(0.6), math.log(0.9)], abs=1e-5)
    assert hyps[1].score == pytest.approx(math.log(0.4), abs=1e-5)


def test_length_penalty_changes_the_winner():
    table = {(): {A: 0.5, EOS_ID: 0.45, B_: 0.05}, (A,): {EOS_ID: 0.8, C: 0.2}}
    (short,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=0.0)
    assert short[0].tokens == [EOS_ID]  # log 0.45 > log 0.4
    (longer,) = run_beam(FakeModel(table, {EOS_ID: 1.0}), SRC, beam_size=2, length_penalty=1.0, length_penalty_k=5.0)
    assert longer[0].tokens == [A, EOS_ID]  # log(0.4) / (7/6) > log(0.45) / 1
    assert longer[0].score == pytest.approx(math.log(0.4) / (7 / 6), abs=1e-5)


def test_max_length_cuts_without_eos():
    model = FakeModel({}, default={A: 0.9, B_: 0.1})  # EOS never proposed (log-prob -30)
    (hyps,) = run_beam(model, SRC, beam_size=2, length_penalty=0.0, max_len_a=0.0, max_len_b=3)
    assert hyps[0].tokens == [A, A, A]
    assert hyps[0].token_log_probs == pytest.approx([math.log(0.9)] * 3, abs=1e-5)


def test_nbest_out_of_range():
    with pytest.raises(ValueError):
        run_beam(FakeModel({}, {EOS_ID: 1.0}), SRC, beam_size=2, nbest=3)


def _random_sources(seed: int, rows: int, length: int, short_row: int, short_length: int) -> torch.Tensor:
    """(rows, length) random ids of the tiny models' vocabulary (4..39) ending with EOS; row
    ``short_row`` has ``short_length`` tokens (EOS included), then padding."""
    torch.manual_seed(seed)
    src = torch.randint(4, 40, (rows, length))
    src[:, -1] = EOS_ID
    src[short_row, short_length:] = PAD_ID
    src[short_row, short_length - 1] = EOS_ID
    return src


@pytest.mark.cuda
def test_beam_size_one_equals_greedy_and_batching_is_invisible(device):
    model = tiny_model(seed=3, vocab=40, device=device)
    src = _random_sources(seed=1, rows=4, length=9, short_row=1, short_length=5).to(device)
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=5)
    beam = beam_search(model, src, SearchOptions(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=5))
    assert [g.tokens for g in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        assert g.log_prob == pytest.approx(b[0].log_prob, abs=1e-4)
    batched = beam_search(model, src, SearchOptions(beam_size=4, max_len_a=1.0, max_len_b=5, nbest=2))
    for i in range(4):
        alone = beam_search(model, src[i: i + 1], SearchOptions(beam_size=4, max_len_a=1.0, max_len_b=5,
                                                                nbest=2))[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-4)


def test_the_first_step_decodes_one_row_per_sentence_then_k():
    """Every sentence starts with one hypothesis (BOS): the first step runs on B rows, not B x K,
    and the K beams of each sentence come from its 2K best first tokens."""
    model = tiny_model(seed=3, vocab=40)
    src = _random_sources(seed=1, rows=4, length=9, short_row=1, short_length=5)
    rows: list[int] = []
    step = model.decode_step

    def counting_step(tokens, memory, src_mask, cache):
        rows.append(tokens.size(0))
        return step(tokens, memory, src_mask, cache)

    model.decode_step = counting_step
    result = beam_search(model, src, SearchOptions(beam_size=3, max_len_a=1.0, max_len_b=5, nbest=3))
    assert rows[0] == 4 and rows[1] == 4 * 3
    assert all(r % 3 == 0 for r in rows[1:])
    for hyps in result:  # three distinct hypotheses: the K beams did not start as copies of one
        assert len({tuple(h.tokens) for h in hyps}) == 3


def test_hypothesis_scores_are_consistent():
    model = tiny_model(seed=4, vocab=40)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID]])
    for h in beam_search(model, src, SearchOptions(beam_size=4, length_penalty=0.6, nbest=3))[0]:
        assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)
        assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens), 0.6, 5.0), abs=1e-4)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.cuda
def test_fused_and_explicit_attention_give_the_same_search(beam_size, device):
    # decode.attention chooses either kernel: the cached steps, with source keys/values shared
    # by each sentence's beams, must agree.
    model = tiny_model(seed=5, vocab=40, device=device)
    src = _random_sources(seed=2, rows=3, length=8, short_row=2, short_length=4).to(device)
    results = []
    for fused in (True, False):
        model.set_fused_attention(encoder=fused, decoder=fused)
        results.append(beam_search(model, src, SearchOptions(beam_size=beam_size, max_len_a=1.0, max_len_b=6,
                                                             nbest=beam_size)))
    for fused_hyps, explicit_hyps in zip(*results):
        assert [h.tokens for h in fused_hyps] == [h.tokens for h in explicit_hyps]
        assert [h.log_prob for h in fused_hyps] == pytest.approx([h.log_prob for h in explicit_hyps], abs=1e-4)


@pytest.mark.parametrize("a, b", [(1.5, 10), (1.4, 0), (0.7, 3), (2.3, 1), (2.0, 0), (1.2, -5)])
def test_length_limits_without_pytorch_equal_the_searchs(a, b):
    """The engines without PyTorch (CTranslate2) limit each sentence as the native search does,
    in the same float32 arithmetic (1.4 x 45 floors to 62 in float64, to 63 in float32)."""
    from attnmt.search.hypothesis import max_output_lengths, output_length_limits

    lengths = list(range(1, 300))
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = 7
    assert output_length_limits(lengths, a, b, 255) == max_output_lengths(src, PAD_ID, a, b, 255).tolist()


def _echo_search(seen_threads: set, barrier: threading.Barrier | None):
    """A search that returns each source as its output, noting its thread; with a barrier, a
    batch waits there until another batch is searched at the same time."""

    def search(batch, options):
        seen_threads.add(threading.get_ident())
        if barrier is not None:
            barrier.wait()
        return [[Hypothesis(list(src), [], -float(len(src)), 0.0)] for src in batch]

    return search


def test_batches_in_parallel_run_at_the_same_time_and_keep_the_input_order():
    sources = [[5] * n + [EOS_ID] for n in (3, 1, 4, 1, 5, 9, 2, 6)]  # 4 batches of 2
    threads: set = set()
    barrier = threading.Barrier(2, timeout=20)  # a lone batch times out: BrokenBarrierError
    got = search_in_batches(sources, SearchOptions(), 2, _echo_search(threads, barrier), workers=2)
    assert [hyps[0].tokens for hyps in got] == sources
    assert len(threads) == 2 and threading.get_ident() not in threads
    with pytest.raises(ValueError, match="workers must be at least 1"):
        search_in_batches(sources, SearchOptions(), 2, _echo_search(set(), None), workers=0)


def test_streaming_searches_one_batch_at_a_time():
    """``on_step`` callbacks come from the caller's thread, in order, whatever ``workers`` says."""
    sources = [[5] * n + [EOS_ID] for n in (3, 1, 4, 1)]
    threads: set = set()
    options = SearchOptions(on_step=lambda i, tokens: False)
    got = search_in_batches(sources, options, 1, _echo_search(threads, None), workers=2)
    assert threads == {threading.get_ident()}
    assert [hyps[0].tokens for hyps in got] == sources


def test_a_failing_batch_stops_the_batches_not_yet_started():
    """An error (or Ctrl-C) in one batch ends the call without searching the queued batches."""
    sources = [[5, EOS_ID]] * 40  # 40 batches of 1
    calls = []

    def search(batch, options):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("engine failed")
        time.sleep(0.05)
        return [[Hypothesis(list(src), [], -1.0, 0.0)] for src in batch]

    with pytest.raises(RuntimeError, match="engine failed"):
        search_in_batches(sources, SearchOptions(), 1, search, workers=2)
    assert len(calls) < 10
