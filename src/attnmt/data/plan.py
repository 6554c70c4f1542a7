"""An epoch's batch plan, in time and memory linear in the corpus: length buckets, a keyed
random order inside each bucket, batch cuts within a token budget, and each rank's share.

The plan of epoch e is a pure function of ``(seed, e)``, the same on every process:

1. Every example falls into the bucket of its (target length, source length), specials
   included (:class:`Buckets`); buckets are numbered in that lexicographic order.
2. The examples are put in bucket order by a counting sort, and inside each bucket in a random
   order: the i-th example of a bucket of n (in corpus order) goes to place ``P(i)`` of the
   bucket, P a keyed permutation of ``[0, n)`` (:func:`permute`: a four-round Feistel network
   on the smallest power of two holding n, applied again to values past n), :data:`CHUNK`
   examples at a time: no temporary grows with the corpus.
3. The sorted examples are cut into batches (:func:`token_cuts`): maximal runs of k examples
   with ``k x the longest side of the run <= batch_tokens`` (an example longer than the budget
   alone), or runs of ``batch_sentences``. The cuts depend on the buckets' sizes only, not on
   the random order, so they are computed per bucket, not per example.
4. The epoch takes the batches in the order of another keyed permutation of their count.

The permutations' round keys are the only random draws: a few words of numpy's Philox
counter-based generator keyed on ``(seed, epoch)``, whose stream numpy guarantees across
versions; everything else is integer arithmetic. So a numpy upgrade keeps the batches, and
:data:`GENERATOR` (in the resume signature) names the algorithm and fingerprints the stream.

Several corpora with weights (``data.train``) are sampled anew each epoch
(:func:`weighted_sample`) with the same permutations, then planned like one corpus.

Under torchrun a rank keeps only its batches (:meth:`Plan.share`): the whole plan (4 bytes an
example) exists while the epoch is planned, the rank's share (4 bytes an example of its
batches) while it trains.

Library: numpy (``numpy.random.Philox``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from attnmt.data.manifest import CorpusEntry

log = logging.getLogger(__name__)

CHUNK = 1 << 16  # examples handled at a time: bounds every temporary
_MULTIPLIERS = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F], np.uint32)  # odd, one a round


def _stream_probe() -> str:
    return f"{int(np.random.Philox(key=np.zeros(2, np.uint64)).random_raw(1)[0]):016X}"


# What draws the batches: this algorithm and the Philox stream (its first word under key 0),
# so that a resume notices a change of either (attnmt.train.data.signature).
GENERATOR = f"attnmt-plan-2 philox4x64 {_stream_probe()}"


def round_keys(seed: int, epoch: int, streams: int) -> np.ndarray:
    """(streams, 4) 16-bit Feistel round keys of epoch ``epoch``: one 64-bit word of Philox
    keyed on ``(seed, epoch)`` per stream (0: the order inside buckets, 1: the batch order,
    2 + c: corpus c's weighted sample)."""
    key = np.array([seed % 2**64, epoch % 2**64], np.uint64)
    words = np.random.Philox(key=key).random_raw(streams).astype("<u8")
    return words.view("<u2").reshape(streams, 4).astype(np.uint32)


def _feistel(x: np.ndarray, width: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A keyed bijection of ``[0, 2**width)`` (uint32 ``width`` one for all, or one per
    element, 1 to 32): four rounds that swap the high and low bits of x, adding to one part a
    32-bit multiplicative hash of the other part and the round key. (numpy scalars throughout:
    a Python int operand takes numpy's slow path.)"""
    one, sixteen = np.uint32(1), np.uint32(16)
    high = width >> one
    low = width - high
    masks = ((one << high) - one, (one << low) - one)  # the part a round changes: the high bits, then the low
    left, right = x >> low, x & masks[1]
    for r, (key, multiplier) in enumerate(zip(keys, _MULTIPLIERS)):
        mixed = right ^ key
        mixed *= multiplier
        mixed >>= sixteen
        mixed ^= left
        mixed &= masks[r % 2]
        left, right = right, mixed
    left <<= low
    left |= right
    return left


_POWERS_OF_TWO = 2 ** np.arange(33, dtype=np.int64)


def bit_width(n) -> np.ndarray:
    """Bits of the smallest power of two holding ``n`` values (at least 1), element-wise
    (in integers: no floating-point logarithm that a platform could round otherwise)."""
    return np.maximum(1, np.searchsorted(_POWERS_OF_TWO, n)).astype(np.uint32)


def permute(x: np.ndarray, n, keys: np.ndarray, width=None) -> np.ndarray:
    """``P(x)`` (uint32) for a keyed permutation P of ``[0, n)`` (``n`` one for all, or one
    per element, below 2**32): the Feistel bijection of ``[0, 2**bit_width(n))``, applied again
    to the values it takes to n or beyond until they fall below n ("cycle walking": still a
    bijection of ``[0, n)``, under two applications an element on average). ``CHUNK`` elements
    at a time."""
    n = np.asarray(n, np.uint32)
    width = bit_width(n) if width is None else np.asarray(width, np.uint32)
    out = np.empty(len(x), np.uint32)
    for first in range(0, len(x), CHUNK):
        part = slice(first, first + CHUNK)
        n_part, width_part = (n, width) if n.ndim == 0 else (n[part], width[part])
        y = _feistel(np.asarray(x[part], np.uint32), width_part, keys)
        walk = np.flatnonzero(y >= n_part)
        while len(walk):
            y[walk] = _feistel(y[walk], width_part if n.ndim == 0 else width_part[walk], keys)
            walk = walk[y[walk] >= (n_part if n.ndim == 0 else n_part[walk])]
        out[part] = y
    return out


# ---- buckets -------------------------------------------------------------------------------------

@dataclass
class Buckets:
    """The (target length, source length) bucket of every example, buckets numbered in that
    lexicographic order over the grid of the lengths that occur on each side.

    Attributes:
        keys: (N,) each example's bucket, uint16 when there are at most 65,536 buckets.
        longest: (K,) the longer side of each bucket's examples (the width a batch pads to).
    """

    keys: np.ndarray
    longest: np.ndarray

    @classmethod
    def of(cls, src_len: np.ndarray, tgt_len: np.ndarray) -> "Buckets":
        """The buckets of length arrays (specials included; in memory or memory-mapped arrays)."""
        n = len(src_len)
        return cls.from_chunks(lambda: ((src_len[i: i + CHUNK], tgt_len[i: i + CHUNK]) for i in range(0, n, CHUNK)))

    @classmethod
    def from_chunks(cls, read: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]) -> "Buckets":
        """The buckets of the lengths that ``read()`` yields chunk by chunk, as (source, target)
        arrays with specials. Two reads: one finds the lengths that occur on each side, the
        other writes the keys."""
        tallies = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
        for chunk in read():
            tallies = [_tally(tally, lengths) for tally, lengths in zip(tallies, chunk)]
        values = [np.flatnonzero(t) for t in tallies]  # the source and target lengths that occur
        ranks = [np.cumsum(t > 0) - 1 for t in tallies]
        dtype = np.uint16 if len(values[0]) * len(values[1]) <= 2**16 else np.uint32
        keys, done = np.empty(int(tallies[0].sum()), dtype), 0
        for src, tgt in read():
            keys[done: done + len(src)] = ranks[1][tgt] * len(values[0]) + ranks[0][src]
            done += len(src)
        return cls(keys, np.maximum.outer(values[1], values[0]).ravel())

    def __len__(self) -> int:
        return len(self.longest)

    def counts(self, keys: np.ndarray | None = None) -> np.ndarray:
        """(K,) int64 examples per bucket, of these buckets' keys or of ``keys``."""
        keys = self.keys if keys is None else keys
        counts = np.zeros(len(self), np.int64)
        for start in range(0, len(keys), CHUNK):
            counts += np.bincount(keys[start: start + CHUNK], minlength=len(self))
        return counts


def _tally(tally: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``tally`` (counts by length) plus the counts of ``lengths``."""
    found = np.bincount(np.asarray(lengths, np.int64))
    tally = np.pad(tally, (0, max(0, len(found) - len(tally))))
    tally[: len(found)] += found
    return tally


# ---- sorting and cutting -------------------------------------------------------------------------

def bucket_order(keys: np.ndarray, counts: np.ndarray, rounds: np.ndarray | None) -> np.ndarray:
    """Positions ``0..len(keys)-1`` sorted by bucket (a counting sort); inside a bucket of n
    the i-th in position order goes to its place ``permute(i, n)`` (``rounds`` None:
    to place i, a stable sort). int32 below 2**31 positions."""
    n = len(keys)
    order = np.empty(n, np.int32 if n < 2**31 else np.int64)
    starts, placed = np.cumsum(counts) - counts, np.zeros(len(counts), np.int64)
    widths = bit_width(counts)
    for first in range(0, n, CHUNK):
        part = keys[first: first + CHUNK]
        moves = np.argsort(part, kind="stable")  # a radix sort for uint16 keys
        bucket = part[moves]
        runs = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])  # where each bucket's run begins
        run_of = np.repeat(runs, np.diff(runs, append=len(bucket)))
        rank = placed[bucket] + np.arange(len(bucket)) - run_of  # place among the bucket's examples so far
        placed[bucket[runs]] += np.diff(runs, append=len(bucket))
        if rounds is not None:
            rank = permute(rank, counts[bucket], rounds, widths[bucket])
        order[starts[bucket] + rank] = moves + first
    return order


def token_cuts(counts: np.ndarray, longest: np.ndarray, budget: int) -> np.ndarray:
    """(batches + 1,) int64 where each batch begins in bucket order, and the end: the greedy
    cut into maximal runs of k examples with ``k x max(longest of the run) <= budget`` (one
    example at least), bucket by bucket. Inside a bucket the longest side is fixed, so past
    the batch it shares with the bucket before, a bucket of n examples of longest side L cuts
    into batches of ``budget // L``: one step per bucket, not per batch."""
    # runs of batches: the first batch's start, the batches' size, how many batches
    firsts = []
    sizes = []
    numbers = []
    place = size = top = 0  # where the bucket begins; examples and longest side of the open batch
    for n, length in zip(counts[counts > 0].tolist(), longest[counts > 0].tolist()):
        joins = min(n, max(0, budget // max(top, length) - size)) if size else 0
        size, top = size + joins, max(top, length) if joins else top
        rest = n - joins
        if rest:
            capacity = max(1, budget // length)
            number = -(-rest // capacity)
            firsts.append(place + joins)
            sizes.append(capacity)
            numbers.append(number)
            size, top = rest - capacity * (number - 1), length
        place += n
    return _runs(firsts, sizes, numbers, place)


def sentence_cuts(total: int, batch_sentences: int) -> np.ndarray:
    """(batches + 1,) int64 starts of runs of ``batch_sentences`` examples (the last may be
    smaller), and the end."""
    return _runs([0] if total else [], [batch_sentences], [-(-total // batch_sentences)] if total else [], total)


def _runs(firsts: list[int], sizes: list[int], numbers: list[int], end: int) -> np.ndarray:
    numbers_ = np.asarray(numbers, np.int64)
    step = np.arange(int(numbers_.sum())) - np.repeat(np.cumsum(numbers_) - numbers_, numbers_)
    starts = np.repeat(np.asarray(firsts, np.int64), numbers_) + np.repeat(np.asarray(sizes, np.int64), numbers_) * step
    return np.append(starts, end).astype(np.int64)


# ---- the plan ------------------------------------------------------------------------------------

@dataclass
class Share:
    """One rank's batches of an epoch of ``total`` batches, from batch ``start`` on: the j-th
    batch of the epoch is this rank's when ``j - start`` is ``rank`` modulo ``world``, which
    is what an update gives it (its group of the next ``world x accum_steps`` batches, of which
    rank r takes every world-th from the r-th: ``attnmt.train.distributed.share``).

    Attributes:
        indices: the example indices of this rank's batches, end to end.
        offsets: (batches + 1,) where each of them begins in ``indices``.
    """

    total: int
    start: int
    rank: int
    world: int
    indices: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, k: int) -> np.ndarray:
        return self.indices[self.offsets[k]: self.offsets[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[k] for k in range(len(self)))

    def update(self, position: int, width: int) -> list[np.ndarray] | None:
        """This rank's batches of the update made of the epoch's batches ``position`` to
        ``position + width`` (fewer at the end); None when fewer than ``world`` remain (the
        epoch's last few batches, skipped: one for each rank or none)."""
        size = min(width, self.total - position)
        if size < self.world:
            return None
        if (position - self.start) % self.world:
            raise ValueError(f"batch {position} does not begin an update of this share (from {self.start})")
        first = (position - self.start) // self.world
        return [self[first + k] for k in range(len(range(self.rank, size, self.world)))]


@dataclass
class Plan:
    """One epoch's batches, whole: sorted batch b is ``order[bounds[b]:bounds[b+1]]`` (item
    positions; the examples are ``sample`` at those positions for weighted corpora), and the
    epoch's j-th batch is sorted batch ``permute(j, len(self), shuffle)`` (None: batch j)."""

    order: np.ndarray
    bounds: np.ndarray
    shuffle: np.ndarray | None = None
    sample: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def sorted_batches(self, positions: np.ndarray) -> np.ndarray:
        """Which sorted batch the epoch takes at each of ``positions``."""
        if self.shuffle is None or len(positions) == 0:
            return np.asarray(positions, np.int64)
        return permute(positions, len(self), self.shuffle).astype(np.int64)

    def share(self, rank: int = 0, world: int = 1, start: int = 0) -> Share:
        """Rank ``rank`` of ``world``'s batches from the epoch's batch ``start`` on (:class:`Share`),
        copied out, so that the plan can be freed."""
        batches = self.sorted_batches(np.arange(start + rank, len(self), world))
        sizes = self.bounds[batches + 1] - self.bounds[batches]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        source = self.order if self.sample is None else self.sample
        indices = np.empty(int(offsets[-1]), source.dtype)
        cuts = np.searchsorted(offsets, np.arange(0, offsets[-1], CHUNK), side="right") - 1
        for a, b in zip(cuts, np.append(cuts[1:], len(batches))):  # about CHUNK items at a time
            if b <= a:
                continue
            within = np.arange(offsets[a], offsets[b]) - np.repeat(offsets[a:b], sizes[a:b])
            items = self.order[np.repeat(self.bounds[batches[a:b]], sizes[a:b]) + within]
            indices[offsets[a]: offsets[b]] = items if self.sample is None else self.sample[items]
        return Share(len(self), start, rank, world, indices, offsets)


def weighted_sample(corpora: list[CorpusEntry], seed: int, epoch: int) -> np.ndarray | None:
    """The example indices of one epoch over corpora with weights (``data.train``): corpus c
    (``start``, ``pairs``, ``weight`` w) gives ``floor(w)`` copies of each of its pairs plus
    the ``round(frac(w) x pairs)`` pairs that a keyed permutation of its pairs puts first
    (drawn without replacement, anew each epoch), in corpus order. None when every weight is
    1: each pair once, the plain corpus."""
    if all(c.weight == 1 for c in corpora):
        return None
    keys = round_keys(seed, epoch, 2 + len(corpora))[2:]
    dtype = np.int32 if max(c.start + c.pairs for c in corpora) < 2**31 else np.int64
    parts = []
    for c, k in zip(corpora, keys):
        parts += [np.arange(c.start, c.start + c.pairs, dtype=dtype)] * int(c.weight)
        drawn = permute(np.arange(_extra(c), dtype=np.uint32), c.pairs, k)
        drawn.sort()
        parts.append(c.start + drawn.astype(dtype))
    return np.concatenate(parts)


def _extra(corpus: CorpusEntry) -> int:
    """Pairs of a corpus drawn for the fraction of its weight."""
    return round((corpus.weight - int(corpus.weight)) * corpus.pairs)


def sample_pairs(corpus: CorpusEntry) -> int:
    """How many pairs :func:`weighted_sample` takes of ``corpus`` (``pairs``, ``weight``) in
    every epoch: ``floor(w) x pairs + round(frac(w) x pairs)``, the same for all epochs."""
    return int(corpus.weight) * corpus.pairs + _extra(corpus)


def epoch_plan(buckets: Buckets, corpora: list[CorpusEntry] | None, batch_tokens: int | None,
               batch_sentences: int | None, seed: int | None, epoch: int) -> Plan:
    """The batches of ``epoch`` (module docstring): the epoch's weighted sample of the corpora
    (:func:`weighted_sample`), by ``batch_sentences`` when set, else within ``batch_tokens``;
    ``seed`` None keeps the plain length order (for evaluation)."""
    sample, keys = _epoch_items(buckets, corpora, seed, epoch)
    if sample is not None:
        _log_mix(corpora, epoch)
    counts = buckets.counts(keys)
    rounds = None if seed is None else round_keys(seed, epoch, 2)
    order = bucket_order(keys, counts, None if rounds is None else rounds[0])
    bounds = _cuts(buckets, counts, batch_tokens, batch_sentences)
    return Plan(order, bounds, None if rounds is None else rounds[1], sample)


def epoch_size(buckets: Buckets, corpora: list[CorpusEntry] | None, batch_tokens: int | None,
               batch_sentences: int | None, seed: int, epoch: int) -> int:
    """How many batches :func:`epoch_plan` makes, from the buckets' sizes alone (no order)."""
    _, keys = _epoch_items(buckets, corpora, seed, epoch)
    return len(_cuts(buckets, buckets.counts(keys), batch_tokens, batch_sentences)) - 1


def _epoch_items(buckets: Buckets, corpora: list[CorpusEntry] | None, seed: int | None, epoch: int
                 ) -> tuple[np.ndarray | None, np.ndarray]:
    """The epoch's weighted sample (None: each example once) and the bucket of each item."""
    sample = weighted_sample(corpora, seed, epoch) if corpora and seed is not None else None
    return sample, buckets.keys if sample is None else _gather(buckets.keys, sample)


def _cuts(buckets: Buckets, counts: np.ndarray, batch_tokens: int | None, batch_sentences: int | None) -> np.ndarray:
    if batch_sentences:
        return sentence_cuts(int(counts.sum()), batch_sentences)
    return token_cuts(counts, buckets.longest, batch_tokens)


def _gather(keys: np.ndarray, items: np.ndarray) -> np.ndarray:
    out = np.empty(len(items), keys.dtype)
    for start in range(0, len(items), CHUNK):
        out[start: start + CHUNK] = keys[items[start: start + CHUNK]]
    return out


def _log_mix(corpora: list[CorpusEntry], epoch: int) -> None:
    log.info("epoch %d mix: %s", epoch + 1, ", ".join(
        f"{c.name} {sample_pairs(c)} pairs (weight {c.weight:g})" for c in corpora))
