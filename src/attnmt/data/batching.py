"""Length-bucketed batches with a token budget (or a sentence count), and their padded tensors.

Sentences of similar length go together so that little of a batch is padding. A batch's size
is counted in padded tokens: ``number of pairs x the longest side (source or target, with BOS
or EOS)`` stays within ``batch_tokens``. The order is a pure function of ``(seed, epoch)``, so a
resumed run sees the same batches as an uninterrupted one.

Shapes: B batch, S source length, T target length (+1 for BOS/EOS).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

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


def _length_order(lengths: list[tuple[int, int]], rng: random.Random, shuffle: bool) -> list[int]:
    """Example indices sorted by (target, source) length, ties broken at random when shuffling."""
    keys = list(range(len(lengths)))
    noise = [rng.random() for _ in keys] if shuffle else [0.0] * len(keys)
    keys.sort(key=lambda i: (lengths[i][1], lengths[i][0], noise[i]))
    return keys


def sentence_batches(lengths: list[tuple[int, int]], batch_sentences: int, seed: int | None = None,
                     epoch: int = 0) -> list[list[int]]:
    """Group example indices into batches of ``batch_sentences`` examples (the last may be
    smaller), length-bucketed and shuffled like :func:`token_batches` (same arguments)."""
    rng = random.Random(None if seed is None else seed * 1_000_003 + epoch)
    keys = _length_order(lengths, rng, seed is not None)
    batches = [keys[i: i + batch_sentences] for i in range(0, len(keys), batch_sentences)]
    if seed is not None:
        rng.shuffle(batches)
    return batches


def token_batches(lengths: list[tuple[int, int]], batch_tokens: int, seed: int | None = None,
                  epoch: int = 0) -> list[list[int]]:
    """Group example indices into batches within a padded-token budget.

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
    rng = random.Random(None if seed is None else seed * 1_000_003 + epoch)
    keys = _length_order(lengths, rng, seed is not None)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in keys:
        n = max(lengths[i])
        if current and (len(current) + 1) * max(longest, n) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    if seed is not None:
        rng.shuffle(batches)
    return batches
