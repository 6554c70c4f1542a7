"""The tokenizer sample: one pass over each side (or each language) of the training text fills
a seeded reservoir of at most ``tokenizer.max_sentences`` lines.

:class:`Reservoir` is Vitter's algorithm R. A side within that size is sampled whole and in
order, so the tokenizers equal those trained on all of it. With several workers the sides, or a
multilingual model's languages (:func:`sample_by_language`), are read at once, in processes of
their own (:func:`attnmt.data.workers.imap`); the samples are the same.

Library: numpy (Philox), multiprocessing (``attnmt.data.workers``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from attnmt.data.sources import Corpus
from attnmt.data.text import HashedReader, check_aligned, head_lines, sample_line, whole_lines
from attnmt.data.workers import imap
from attnmt.errors import DataError

log = logging.getLogger(__name__)


class Reservoir:
    """A uniform random sample of at most ``capacity`` lines of a stream of blocks of whole
    lines (Vitter's algorithm R, vectorised over each block): the first ``capacity`` lines fill
    the slots in order (a stream of at most ``capacity`` lines is kept whole and in order), and
    line t (counting from 1) then takes slot ``floor(u_t x t)`` when that is below ``capacity``,
    u_t uniform from numpy's Philox generator keyed on ``(seed, stream)``. Lines are kept as
    bytes and decoded at the end, so the lines that pass through cost no Python object."""

    def __init__(self, capacity: int, seed: int, stream: int):
        self.capacity = capacity
        self.seen = 0
        self.slots = []
        self._bits = np.random.Philox(key=np.array([seed % 2**64, stream], np.uint64))

    def add(self, data: bytes, ends: np.ndarray) -> None:
        """Offer the lines of ``data`` (``ends``: the positions just past each line)."""
        starts = np.concatenate([[0], ends[:-1]]).tolist()
        fill = max(0, min(len(ends), self.capacity - self.seen))  # lines that take empty slots, in order
        self.slots += [data[a:b] for a, b in zip(starts[:fill], ends[:fill].tolist())]
        if fill < len(ends):
            place = self.seen + fill + np.arange(1, len(ends) - fill + 1)  # t of each further line
            uniform = (self._bits.random_raw(len(place)) >> np.uint64(11)).astype(np.float64) * 2.0**-53
            hits = np.flatnonzero((uniform * place).astype(np.int64) < self.capacity)
            slots = (uniform[hits] * place[hits]).astype(np.int64)
            # the last line to take a slot keeps it, as replacing one line at a time would leave it
            taken, last = np.unique(slots[::-1], return_index=True)
            for slot, line in zip(taken.tolist(), (fill + hits[::-1][last]).tolist()):
                self.slots[slot] = data[starts[line]: int(ends[line])]
        self.seen += len(ends)

    def lines(self) -> list[str]:
        """The sample, decoded and stripped (:func:`attnmt.data.text.sample_line`), without its
        empty lines."""
        lines = (sample_line(raw) for raw in self.slots)
        return [line for line in lines if line]


def sample_lines(corpora: list[Corpus], capacity: int, seed: int, workers: int = 1) -> tuple[list[str], list[str]]:
    """Seeded samples (:class:`Reservoir`) of at most ``capacity`` lines per side of all the
    corpora, in one pass over each side, without their empty lines. With ``workers`` > 1 the
    two sides are read at once, in two processes (the same samples).

    Raises:
        DataError: see :class:`~attnmt.data.text.HashedReader`; files of a corpus with
            different line counts; or a side with no non-empty line.
    """
    sides = _in_parallel(_sample_side, [(corpora, capacity, seed, side) for side in (0, 1)], workers)
    src, src_counts = sides[0]
    tgt, tgt_counts = sides[1]
    for corpus, n_src, n_tgt in zip(corpora, src_counts, tgt_counts):
        check_aligned(corpus.src, n_src, corpus.tgt, n_tgt)
    if not (src and tgt):
        no_pair(corpora)
    return src, tgt


def _sample_side(corpora: list[Corpus], capacity: int, seed: int, side: int) -> tuple[list[str], list[int]]:
    """One side's sample (source 0, target 1) and its line count in each corpus."""
    reservoir = Reservoir(capacity, seed, side)
    counts = []
    for corpus in corpora:
        seen = reservoir.seen
        path = corpus.tgt if side else corpus.src
        for data, ends in head_lines(whole_lines(HashedReader(path).blocks()), corpus.max_pairs):
            reservoir.add(data, ends)
        counts.append(reservoir.seen - seen)
    if reservoir.seen > capacity:
        log.info("tokenizer sample: %d of %d %s lines", len(reservoir.slots), reservoir.seen,
                 ("source", "target")[side])
    return reservoir.lines(), counts


def sample_by_language(corpora: list[Corpus], capacity: int, seed: int, workers: int = 1) -> list[str]:
    """A multilingual model's tokenizer sample, balanced across languages: for each language
    (in order of first appearance) a seeded sample (:class:`Reservoir`) of at most
    ``capacity / languages`` of its lines, from every distinct file in that language (a file
    several corpora share is read once), without empty lines. With ``workers`` > 1 that many
    languages are read at once, each in a process of its own (the same sample).

    Raises:
        DataError: see :class:`~attnmt.data.text.HashedReader`; or no non-empty line.
    """
    files: dict[str, dict[Path, int | None]] = {}  # language -> its files, each with the lines to read
    for corpus in corpora:
        for lang, path in ((corpus.src_lang, corpus.src), (corpus.tgt_lang, corpus.tgt)):
            paths = files.setdefault(lang, {})
            known = paths.get(path, 0)  # a file several corpora share is read once, as far as the farthest
            if None in (known, corpus.max_pairs):
                paths[path] = None
            else:
                paths[path] = max(known, corpus.max_pairs)
    share = max(1, capacity // len(files))
    samples = _in_parallel(_sample_language, [(lang, paths, share, seed, stream)
                                              for stream, (lang, paths) in enumerate(files.items())], workers)
    lines = [line for sample in samples for line in sample]
    if not lines:
        no_pair(corpora)
    return lines


def _sample_language(lang: str, paths: dict[Path, int | None], capacity: int, seed: int, stream: int) -> list[str]:
    reservoir = Reservoir(capacity, seed, stream)
    for path, lines in paths.items():
        for data, ends in head_lines(whole_lines(HashedReader(path).blocks()), lines):
            reservoir.add(data, ends)
    log.info("tokenizer sample: %d of %d %s lines", len(reservoir.slots), reservoir.seen, lang)
    return reservoir.lines()


def _in_parallel(function, calls: list[tuple], workers: int) -> list:
    """``[function(*args) for args in calls]``, in up to ``workers`` forked processes where the
    platform forks (the results in order; an exception in one is raised here)."""
    return list(imap(function, calls, min(workers, len(calls))))


def no_pair(corpora: list[Corpus]) -> None:
    """Raises: DataError: always, naming every file of ``corpora`` (no usable pair in them)."""
    names = " and ".join(f"{c.src} and {c.tgt}" for c in corpora)
    raise DataError(f"{names}: no training pair with both sides non-empty")
