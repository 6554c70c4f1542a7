"""The epoch's batch plan (attnmt.data.plan): the cuts equal the per-example rule, every rank
builds the same plan and the ranks' shares deal out the epoch as the trainer's updates do, the
keyed permutations are bijections and look uniform, the batches are pinned (a known answer),
and the planner takes more than 2**25 examples in linear time."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from attnmt.data import plan


def _lengths(n, seed=0, top=80):
    rng = np.random.default_rng(seed)
    return rng.integers(1, top, n), rng.integers(1, top, n)


def _greedy_starts(longest, budget):
    """Where batches begin under the per-example rule over the sorted examples: close the
    open batch when one more example would take it past the budget (the specification)."""
    starts, size, top = [], 0, 0
    for i, n in enumerate(longest.tolist()):
        if size and (size + 1) * max(top, n) > budget:
            size, top = 0, 0
        if size == 0:
            starts.append(i)
        size, top = size + 1, max(top, n)
    return starts


@pytest.mark.parametrize("budget", [40, 300, 4096])
@pytest.mark.parametrize("seed", [None, 7])
def test_cuts_follow_the_per_example_rule_over_the_bucket_order(budget, seed):
    src, tgt = _lengths(3000, seed=budget)
    p = plan.epoch_plan(plan.Buckets.of(src, tgt), None, budget, None, seed, 3)
    order = p.order
    assert np.array_equal(np.sort(order), np.arange(3000))
    key = tgt[order] * 1000 + src[order]
    assert (np.diff(key) >= 0).all()  # sorted by target, then source length
    if seed is None:  # the plain length order: corpus order inside a bucket
        assert all(order[i] < order[i + 1] for i in range(2999) if key[i] == key[i + 1])
    longest = np.maximum(src, tgt)
    assert p.bounds.tolist() == _greedy_starts(longest[order], budget) + [3000]
    batches = list(p.share())
    assert sorted(np.concatenate(batches).tolist()) == list(range(3000))
    assert all(len(b) == 1 or len(b) * longest[b].max() <= budget for b in batches)


def test_sentence_batches_and_an_example_longer_than_the_budget():
    src, tgt = _lengths(103)
    p = plan.epoch_plan(plan.Buckets.of(src, tgt), None, None, 10, 1, 0)
    assert sorted(len(b) for b in p.share()) == [3] + [10] * 10
    src, tgt = np.array([5, 50, 5, 6]), np.array([5, 60, 6, 5])
    batches = plan.epoch_plan(plan.Buckets.of(src, tgt), None, 40, None, None, 0).share()
    assert [b.tolist() for b in batches] == [[0, 3, 2], [1]]  # 60 tokens > 40: alone
    empty = plan.epoch_plan(plan.Buckets.of(np.zeros(0, int), np.zeros(0, int)), None, 40, None, 1, 0)
    assert len(empty) == 0 and len(empty.share()) == 0


def _updates(share, width):
    """The batches a rank gets, update by update, as the trainer walks the epoch."""
    got, position = [], share.start
    while (group := share.update(position, width)) is not None:
        got.append([b.tolist() for b in group])
        position += min(width, share.total - position)
    return got


@pytest.mark.parametrize("world,accum,start", [(1, 1, 0), (2, 1, 0), (3, 2, 0), (2, 3, 4), (4, 1, 8)])
def test_ranks_build_the_same_plan_and_deal_out_the_epoch_without_overlap(world, accum, start):
    src, tgt = _lengths(2000, seed=1)
    whole = [b.tolist() for b in plan.epoch_plan(plan.Buckets.of(src, tgt), None, 200, None, 9, 2).share()]
    # each rank plans on its own, as a torchrun process does
    shares = [plan.epoch_plan(plan.Buckets.of(src, tgt), None, 200, None, 9, 2).share(r, world, start)
              for r in range(world)]
    assert {s.total for s in shares} == {len(whole)}
    per_rank = [_updates(s, world * accum) for s in shares]
    assert len({len(u) for u in per_rank}) == 1  # every rank makes the same updates
    taken = []
    for u in range(len(per_rank[0])):
        group = whole[start + u * world * accum: start + (u + 1) * world * accum]
        for r in range(world):
            assert per_rank[r][u] == group[r::world]  # attnmt.train.distributed.share
            taken += per_rank[r][u]
    rest = (len(whole) - start) % (world * accum)
    skipped = rest if rest < world else 0  # the documented tail: too few batches to give every rank one
    assert sorted(map(tuple, taken)) == sorted(map(tuple, whole[start: len(whole) - skipped]))
    flat = [i for b in taken for i in b]
    assert len(flat) == len(set(flat))  # no example twice
    assert all(sum(len(b) for b in s) == len(s.indices) for s in shares)  # a rank holds only its share


def test_a_share_starting_elsewhere_refuses_positions_off_its_grid():
    src, tgt = _lengths(500)
    share = plan.epoch_plan(plan.Buckets.of(src, tgt), None, 200, None, 1, 0).share(0, 2, 4)
    with pytest.raises(ValueError, match="does not begin an update"):
        share.update(5, 2)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 65536, 70001])
def test_keyed_permutations_are_bijections(n):
    for seed in (0, 1):
        keys = plan.round_keys(seed, 4, 1)[0]
        assert sorted(plan.permute(np.arange(n), n, keys).tolist()) == list(range(n))
    sizes = np.array([1, 2, 3, 7, 7, 1000])  # one domain per element
    ranks = np.array([0, 1, 2, 6, 0, 999])
    assert (plan.permute(ranks, sizes, keys) < sizes).all()


def test_keyed_permutations_look_uniform():
    """Where a few elements of [0, 10000) land over 5,000 keys: uniform over ten bins (a
    chi-square below its 99.9% point of 27.9 for 9 degrees of freedom; deterministic)."""
    n, places = 10_000, np.array([0, 1, 5000, 9999])
    counts = np.zeros((len(places), 10))
    for seed in range(5000):
        landed = plan.permute(places, n, plan.round_keys(seed, 0, 1)[0])
        counts[np.arange(len(places)), landed * 10 // n] += 1
    chi2 = ((counts - 500) ** 2 / 500).sum(axis=1)
    assert (chi2 < 27.9).all(), chi2


def test_batches_within_a_bucket_mix_anew_each_epoch():
    """One bucket of 10,000 equal pairs in batches of 100: neighbours in the corpus share a
    batch about as often as random grouping makes them (99/9999), and the groups change."""
    src = tgt = np.full(10_000, 10)
    buckets = plan.Buckets.of(src, tgt)
    groups = []
    for epoch in range(3):
        order = plan.epoch_plan(buckets, None, 1000, None, 1, epoch).order
        batch_of = np.empty(10_000, np.int64)
        batch_of[order] = np.arange(10_000) // 100
        assert 0.004 < np.mean(batch_of[1:] == batch_of[:-1]) < 0.02
        groups.append(batch_of)
    together = [np.mean(groups[e][:-1] == groups[e][1:]) for e in range(3)]
    assert not np.array_equal(groups[0], groups[1]) and len(set(together)) > 1


def test_the_plan_is_pinned():
    """A known answer: the batches of (seed 3, epoch 1) over 12 examples. The plan depends on
    numpy's Philox stream (which numpy keeps across versions) and this module's arithmetic
    alone; a change of either changes these batches and ``plan.GENERATOR``, which a resume
    compares."""
    src = np.array([3, 5, 3, 4, 9, 3, 5, 4, 3, 2, 7, 3])
    tgt = np.array([4, 5, 4, 4, 8, 4, 5, 4, 4, 3, 6, 4])
    batches = [b.tolist() for b in plan.epoch_plan(plan.Buckets.of(src, tgt), None, 16, None, 3, 1).share()]
    assert batches == [[10], [4], [9, 8, 5, 2], [11, 0, 7, 3], [6, 1]]
    assert plan.round_keys(3, 1, 2).tolist() == [[57340, 53396, 62538, 48502], [54283, 34191, 12182, 55597]]
    assert plan.GENERATOR == "attnmt-plan-2 philox4x64 02F4BA6408E4D89B"  # Philox's first word under key 0


def test_weighted_sample_draws_without_replacement_and_anew():
    corpora = [SimpleNamespace(name="a", start=0, pairs=100, weight=2.5),
               SimpleNamespace(name="b", start=100, pairs=40, weight=0.25)]
    draws = []
    for epoch in (0, 1):
        sample = plan.weighted_sample(corpora, 5, epoch)
        a, b = sample[sample < 100], sample[sample >= 100]
        assert np.array_equal(np.bincount(a, minlength=100) >= 2, np.ones(100, bool))  # two copies of each
        assert len(a) == 250 and len(b) == 10 == len(set(b.tolist()))
        draws.append(b.tolist())
    assert draws[0] != draws[1]
    assert plan.weighted_sample([SimpleNamespace(**{**vars(corpora[0]), "weight": 1})], 5, 0) is None


def test_planning_more_than_2_25_examples_in_linear_time():
    """The planner drew 2**25 keys with one ``randbytes`` call before, which overflows a C int
    on CPython 3.11 and 3.12: 33,554,432 examples and more failed before the first update."""
    n = 2**25 + 3
    pattern_src, pattern_tgt = _lengths(4099, seed=3, top=60)
    src = np.resize(pattern_src.astype(np.uint16), n)
    tgt = np.resize(pattern_tgt.astype(np.uint16), n)
    t0 = time.process_time()
    buckets = plan.Buckets.of(src, tgt)
    p = plan.epoch_plan(buckets, None, 4096, None, 1, 0)
    seconds = time.process_time() - t0
    assert p.order.dtype == np.int32 and len(p.order) == n
    seen = np.zeros(n, bool)
    seen[p.order] = True
    assert seen.all()
    sorted_keys = buckets.keys[p.order]
    assert (sorted_keys[1:] >= sorted_keys[:-1]).all()
    share = p.share(3, 4)
    assert len(share) == len(range(3, len(p), 4))
    assert seconds < 60, seconds  # about 4 s of CPU on a 2-core EPYC
