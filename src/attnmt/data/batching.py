"""Length-bucketed batches with a token budget (or a sentence count), and their padded tensors.

Sentences of similar length go together so that little of a batch is padding. A batch's size
is counted in padded tokens: ``number of pairs x the longest side (source or target, with BOS
or EOS)`` stays within ``batch_tokens``. The order is a pure function of ``(seed, epoch)``, so a
resumed run rebuilds it and goes on from the batch it had reached. Batches are planned with
numpy over length arrays (millions of pairs in a fraction of a second, no Python object per
pair); several corpora with weights are sampled anew each epoch (:func:`weighted_sample`).

Shapes: B batch, S source length, T target length (+1 for BOS/EOS).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np
import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.device import to_device

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """Padded tensors of one batch (all int64).

    src: (B, S) source ids + EOS, padded with PAD_ID.
    tgt_in: (B, T) the decoder start id (BOS) + target ids (decoder input), padded.
    tgt_out: (B, T) target ids + EOS (labels), padded.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor

    @property
    def num_tgt_tokens(self) -> int:
        """Real (non-pad) target tokens, EOS included."""
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device) -> "Batch":
        """This batch on ``device`` (for CUDA pinned and copied without blocking,
        ``attnmt.device.to_device``); itself where it is there already."""
        return Batch(to_device(self.src, device), to_device(self.tgt_in, device), to_device(self.tgt_out, device))


def pad_sequences(seqs: list[list[int]], pad: int = PAD_ID) -> torch.Tensor:
    """Right-pad id lists into a (B, max_len) int64 tensor."""
    out = torch.full((len(seqs), max((len(s) for s in seqs), default=0)), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def make_batch(src_ids: list[list[int]], tgt_ids: list[list[int]], start_id: int = BOS_ID) -> Batch:
    """Build a :class:`Batch` from unpadded source and target ids (without specials);
    ``start_id`` is the id the decoder input starts with (``model.decoder_start_id``, the id
    greedy and beam search start from: BOS unless the model says otherwise)."""
    return Batch(
        src=pad_sequences([s + [EOS_ID] for s in src_ids]),
        tgt_in=pad_sequences([[start_id] + t for t in tgt_ids]),
        tgt_out=pad_sequences([t + [EOS_ID] for t in tgt_ids]),
    )


def batch_from_arrays(src_ids: list, tgt_ids: list, start_id: int = BOS_ID) -> Batch:
    """:func:`make_batch` from id arrays (numpy, any integer dtype, e.g. memory-mapped shards):
    the same tensors, built with numpy instead of per-token Python lists."""
    def padded(rows: list, before: int | None, after: int | None) -> torch.Tensor:
        first, lengths = int(before is not None), np.fromiter(map(len, rows), np.int64, len(rows))
        out = np.full((len(rows), int(lengths.max(initial=0)) + first + (after is not None)), PAD_ID, np.int64)
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        starts = np.cumsum(lengths) - lengths  # where each row begins in flat
        row = np.repeat(np.arange(len(rows)), lengths)
        out[row, np.arange(len(flat)) - np.repeat(starts, lengths) + first] = flat
        if before is not None:
            out[:, 0] = before
        if after is not None:
            out[np.arange(len(rows)), first + lengths] = after
        return torch.from_numpy(out)

    return Batch(src=padded(src_ids, None, EOS_ID), tgt_in=padded(tgt_ids, start_id, None),
                 tgt_out=padded(tgt_ids, None, EOS_ID))


def _random_keys(rng: random.Random, n: int) -> np.ndarray:
    """``n`` draws of ``rng.random()`` as the 53-bit integers ``random() * 2**53`` (same order),
    leaving ``rng`` where ``n`` calls of ``random()`` would: CPython's ``random()`` is
    ``(a >> 5) * 2**26 + (b >> 6)`` over two 32-bit outputs a, b, and ``randbytes(8 n)`` returns
    those 2n outputs in order, little-endian."""
    pairs = np.frombuffer(rng.randbytes(8 * n), dtype="<u8")  # a | b << 32, a the earlier output
    keys = pairs & np.uint64(0xFFFF_FFFF)
    keys >>= np.uint64(5)
    keys <<= np.uint64(26)
    for start in range(0, n, 1 << 20):  # (b >> 6), a million at a time: no second n-sized temporary
        keys[start: start + (1 << 20)] |= pairs[start: start + (1 << 20)] >> np.uint64(38)
    return keys


def length_batches(src_len: np.ndarray, tgt_len: np.ndarray, batch_tokens: int | None = None,
                   batch_sentences: int | None = None, seed: int | None = None, epoch: int = 0) -> list[np.ndarray]:
    """Length-bucketed batches of example indices, with numpy (no Python object per example).

    Examples are sorted by (target length, source length) with a random tie-break drawn from
    ``random.Random(seed * 1_000_003 + epoch)``, cut into batches of ``batch_sentences``
    examples or, else, within ``batch_tokens`` padded tokens (``len(batch) x`` the longest side;
    an example longer than the budget gets a batch of its own), and the batches shuffled with
    the same generator. ``seed`` None keeps the plain length order (for evaluation). The
    batches equal those of the per-example Python version this replaced (the tie-break keys
    are the same ``random()`` draws), so a corpus batches as it did before.

    Args:
        src_len, tgt_len: (N,) int lengths with specials (source + EOS, BOS + target).
    Returns:
        int64 arrays of example indices, one per batch.
    """
    rng = random.Random(None if seed is None else seed * 1_000_003 + epoch)
    n = len(src_len)
    noise = _random_keys(rng, n) if seed is not None else None
    # Sort by (target, source) length, ties by the noise: stable sorts of the noise order by the
    # source, then the target length (np.lexsort gives the same order, several times slower;
    # numpy sorts 16-bit keys stably by radix, in linear time).
    # int32 indices below 2**31 examples: the plan's memory is 4 bytes a pair, not 8
    index_type = np.int32 if n < 2**31 else np.int64
    order = (np.argsort(noise, kind="stable") if seed is not None else np.arange(n)).astype(index_type)
    del noise
    key_type = np.uint16 if n == 0 or max(int(src_len.max()), int(tgt_len.max())) < 2**16 else np.int64
    for key in (src_len, tgt_len):
        order = order[np.argsort(np.asarray(key, key_type)[order], kind="stable")]
    if batch_sentences:
        batches = [order[i: i + batch_sentences] for i in range(0, n, batch_sentences)]
    else:
        batches = _cut_by_tokens(order, np.maximum(src_len, tgt_len)[order], batch_tokens)
    if seed is not None:
        places = list(range(len(batches)))
        rng.shuffle(places)  # the same swaps as shuffling the list of batches itself
        batches = [batches[j] for j in places]
    return batches


def _cut_by_tokens(order: np.ndarray, longest: np.ndarray, budget: int) -> list[np.ndarray]:
    """Cut ``order`` into maximal runs of k examples with ``k x max(longest of the run) <=
    budget`` (at least one example each): ``k x`` the running maximum only grows with k, so
    each run's length is a count over a window of at most ``budget // longest[start]``."""
    batches, start, n = [], 0, len(order)
    while start < n:
        window = longest[start: start + max(1, budget // max(int(longest[start]), 1))]
        fits = np.arange(1, len(window) + 1) * np.maximum.accumulate(window) <= budget
        k = max(1, int(np.count_nonzero(fits)))
        batches.append(order[start: start + k])
        start += k
    return batches


def sentence_batches(lengths: list[tuple[int, int]], batch_sentences: int, seed: int | None = None,
                     epoch: int = 0) -> list[list[int]]:
    """Group example indices into batches of ``batch_sentences`` examples (the last may be
    smaller), length-bucketed and shuffled like :func:`token_batches` (same arguments)."""
    src_len, tgt_len = _columns(lengths)
    return [b.tolist() for b in length_batches(src_len, tgt_len, batch_sentences=batch_sentences, seed=seed,
                                               epoch=epoch)]


def token_batches(lengths: list[tuple[int, int]], batch_tokens: int, seed: int | None = None,
                  epoch: int = 0) -> list[list[int]]:
    """Group example indices into batches within a padded-token budget (:func:`length_batches`).

    Args:
        lengths: (source length, target length) of each example, specials included.
        batch_tokens: maximum of ``len(batch) * max(longest source, longest target)``.
        seed: shuffle seed; None keeps a deterministic length order (for evaluation).
        epoch: mixed into the seed so that each epoch has its own order.
    Returns:
        Lists of example indices. With a seed, examples are sorted by length after a random
        tie-break, cut into batches, and the batches shuffled; an example longer than the budget
        gets a batch of its own.
    """
    src_len, tgt_len = _columns(lengths)
    return [b.tolist() for b in length_batches(src_len, tgt_len, batch_tokens=batch_tokens, seed=seed, epoch=epoch)]


def _columns(lengths: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    table = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    return table[:, 0], table[:, 1]


def weighted_sample(corpora: list[dict], seed: int, epoch: int) -> np.ndarray | None:
    """The example indices of one epoch over corpora with weights (``data.train``): corpus c
    (``start``, ``pairs``, ``weight`` w) gives ``floor(w)`` copies of each of its pairs plus
    ``round(frac(w) x pairs)`` pairs drawn without replacement, anew each epoch (numpy's
    generator seeded with ``(seed, epoch)``). None when every weight is 1: each pair once, the
    plain corpus."""
    if all(c["weight"] == 1 for c in corpora):
        return None
    rng = np.random.default_rng([seed, epoch])
    parts = []
    for c in corpora:
        whole, extra = int(c["weight"]), round((c["weight"] - int(c["weight"])) * c["pairs"])
        parts += [np.arange(c["start"], c["start"] + c["pairs"])] * whole
        if extra:
            parts.append(c["start"] + np.sort(rng.choice(c["pairs"], extra, replace=False)))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def epoch_batches(src_len: np.ndarray, tgt_len: np.ndarray, corpora: list[dict], batch_tokens: int,
                  batch_sentences: int | None, seed: int, epoch: int) -> list[np.ndarray]:
    """The training batches (global example indices) of ``epoch``: the epoch's weighted sample
    of the corpora (:func:`weighted_sample`) batched by :func:`length_batches`."""
    sample = weighted_sample(corpora, seed, epoch) if corpora else None
    if sample is None:
        return length_batches(src_len, tgt_len, batch_tokens, batch_sentences, seed, epoch)
    counts = np.bincount(np.searchsorted([c["start"] for c in corpora], sample, side="right") - 1,
                         minlength=len(corpora))
    log.info("epoch %d mix: %s", epoch + 1, ", ".join(f"{c['name']} {n} pairs (weight {c['weight']:g})"
                                                     for c, n in zip(corpora, counts)))
    batches = length_batches(src_len[sample], tgt_len[sample], batch_tokens, batch_sentences, seed, epoch)
    return [sample[b] for b in batches]
