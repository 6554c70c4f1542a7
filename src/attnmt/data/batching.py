"""Length-bucketed batches with a token budget (or a sentence count), and their padded tensors.

Sentences of similar length go together so that little of a batch is padding. A batch's size
is counted in padded tokens: ``number of pairs x the longest side (source or target, with BOS
or EOS)`` stays within ``batch_tokens``. The order is a pure function of ``(seed, epoch)``, so a
resumed run rebuilds it and goes on from the batch it had reached. The training loop plans a
whole epoch with ``attnmt.data.plan`` (linear in the corpus, each rank keeping its share);
the functions here give the same batches as lists, for the validation set and small corpora.

Shapes: B batch, S source length, T target length (+1 for BOS/EOS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnmt.data.plan import Buckets, epoch_plan
from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.device import to_device


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
    """:func:`make_batch` from id arrays (numpy, any integer dtype, e.g. a shard's pairs):
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


def length_batches(src_len: np.ndarray, tgt_len: np.ndarray, batch_tokens: int | None = None,
                   batch_sentences: int | None = None, seed: int | None = None, epoch: int = 0) -> list[np.ndarray]:
    """Length-bucketed batches of example indices, in the epoch's order (``attnmt.data.plan``:
    sorted by target then source length, in a random order of ``(seed, epoch)`` inside each
    (target, source) length bucket, cut within ``batch_tokens`` padded tokens or into
    ``batch_sentences`` examples, the batches shuffled). ``seed`` None keeps the plain length
    order (for evaluation).

    Args:
        src_len, tgt_len: (N,) int lengths with specials (source + EOS, BOS + target).
    Returns:
        Arrays of example indices, one per batch.
    """
    plan = epoch_plan(Buckets.of(src_len, tgt_len), None, batch_tokens, batch_sentences, seed, epoch)
    return list(plan.share())


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
        Lists of example indices. With a seed, examples are sorted by length, in a random order
        inside each (target, source) length bucket, cut into batches, and the batches shuffled;
        an example longer than the budget gets a batch of its own.
    """
    src_len, tgt_len = _columns(lengths)
    return [b.tolist() for b in length_batches(src_len, tgt_len, batch_tokens=batch_tokens, seed=seed, epoch=epoch)]


def _columns(lengths: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    table = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    return table[:, 0], table[:, 1]
