"""Encoding and filtering chunks of pairs, in worker processes.

The filters are a preparation's (``attnmt.data.prepare``'s docstring) but ``duplicate``, which
the main process applies to each chunk's pair hashes (:class:`HashSet64`).

The text travels to the workers as bytes of whole lines (``attnmt.data.text.TextChunk``); a
worker decodes, encodes and filters a chunk and returns the kept pairs' ids as flat arrays
(:class:`Chunk`). SentencePiece processors do not pickle: the workers rebuild the tokenizers
from a description (:func:`_recipe`) once, in the pool's initializer.

Library: numpy, hashlib (BLAKE2b), multiprocessing (``attnmt.data.workers``).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from attnmt.data.text import TextChunk, decode_lines
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer
from attnmt.data.workers import imap

FILTERS = ("empty", "too_long", "length_ratio", "copies", "duplicate")
# codes of the per-chunk filters (0: kept)
_EMPTY = 1
_TOO_LONG = 2
_RATIO = 3
_COPIES = 4


@dataclass(frozen=True)
class Filters:
    """The filter settings of one split (module docstring)."""

    max_len: int
    max_length_ratio: float | None = None
    copies: bool = False
    dedup: bool = False
    prefix: tuple[int, ...] = ()  # ids put in front of every source: a multilingual model's tag (counted in max_len)


@dataclass
class Chunk:
    """What a worker returns for a chunk of pairs: the kept pairs' ids and lengths, why the
    others were dropped, and (with dedup) each kept pair's 64-bit hash."""

    src: np.ndarray
    src_len: np.ndarray
    tgt: np.ndarray
    tgt_len: np.ndarray
    kept: np.ndarray  # positions in the chunk of the kept pairs
    dropped: np.ndarray  # counts per filter code (index 0 unused)
    hashes: np.ndarray | None = None


def pair_hash(src: str, tgt: str) -> int:
    """64-bit BLAKE2b hash of a pair's exact text (the side boundary is part of the hashed text)."""
    data = f"{len(src)}:{src}{tgt}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def encode_chunk(src_lines: list[str], tgt_lines: list[str], src_tok, tgt_tok, filters: Filters,
                 dtype: np.dtype) -> Chunk:
    """Encode and filter one chunk of pairs (every filter but ``duplicate``, which needs all
    chunks: the caller applies it to :attr:`Chunk.hashes`)."""
    if all(src_lines) and all(tgt_lines):  # the usual chunk: no empty line, nothing to pick out
        nonempty = np.arange(len(src_lines), dtype=np.int64)
        sources = src_lines
        targets = tgt_lines
    else:
        nonempty = np.array([i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s and t], dtype=np.int64)
        sources = [src_lines[i] for i in nonempty]
        targets = [tgt_lines[i] for i in nonempty]
    if src_tok is tgt_tok:  # a joint vocabulary: both sides in one call
        both = src_tok.encode_batch(sources + targets)
        src_ids = both[: len(sources)]
        tgt_ids = both[len(sources):]
    else:
        src_ids = src_tok.encode_batch(sources)
        tgt_ids = tgt_tok.encode_batch(targets)
    if filters.prefix:
        src_ids = [[*filters.prefix, *ids] for ids in src_ids]
    src_len = np.fromiter(map(len, src_ids), np.int64, len(nonempty))
    tgt_len = np.fromiter(map(len, tgt_ids), np.int64, len(nonempty))
    reason = np.zeros(len(nonempty), np.int8)
    reason[(src_len > filters.max_len) | (tgt_len > filters.max_len)] = _TOO_LONG
    if filters.max_length_ratio is not None:
        with np.errstate(divide="ignore"):
            ratio = np.maximum(src_len, tgt_len) / np.minimum(src_len, tgt_len)
        reason[(reason == 0) & ~(ratio < filters.max_length_ratio)] = _RATIO
    if filters.copies:
        same = np.fromiter((src_lines[i] == tgt_lines[i] for i in nonempty), bool, len(nonempty))
        reason[(reason == 0) & same] = _COPIES
    keep = reason == 0
    dropped = np.bincount(reason, minlength=5)
    dropped[0] = 0
    dropped[_EMPTY] = len(src_lines) - len(nonempty)
    kept = nonempty[keep]
    hashes = np.array([pair_hash(src_lines[i], tgt_lines[i]) for i in kept], np.uint64) if filters.dedup else None
    return Chunk(_flat(src_ids, keep, src_len, dtype), src_len[keep], _flat(tgt_ids, keep, tgt_len, dtype),
                 tgt_len[keep], kept, dropped, hashes)


def _flat(ids: list[list[int]], keep: np.ndarray, lengths: np.ndarray, dtype: np.dtype) -> np.ndarray:
    kept = ids if keep.all() else itertools.compress(ids, keep)
    return np.fromiter(itertools.chain.from_iterable(kept), dtype, int(lengths[keep].sum()))


class HashSet64:
    """A set of 64-bit hashes as sorted numpy runs merged like a log-structured merge tree:
    8 bytes per hash, no Python object per entry."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """Add ``hashes``; returns a boolean mask of those not seen before (in earlier calls or
        earlier in this one)."""
        new = np.zeros(len(hashes), bool)
        new[np.unique(hashes, return_index=True)[1]] = True
        for run in self.runs:
            pos = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            new &= run[pos] != hashes
        if new.any():
            self.runs.append(np.sort(hashes[new]))
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]))
        return new


# Worker processes: the tokenizers and settings are set once per process by the pool's initializer.
_WORKER: dict = {}


def _recipe(tok):
    """A picklable description of a tokenizer (SentencePiece processors do not pickle)."""
    if isinstance(tok, VocabTokenizer):
        return ("vocab", tok.model_proto, tok.vocab)
    if isinstance(tok, Tokenizer):
        return ("spm", tok.model_proto)
    return ("word", tok)


def _rebuild(recipe):
    kind = recipe[0]
    if kind == "vocab":
        return VocabTokenizer(*recipe[1:])
    if kind == "spm":
        return Tokenizer(recipe[1])
    return recipe[1]


def _init_worker(src_recipe, tgt_recipe, joint: bool, filters: Filters, dtype: str) -> None:
    src = _rebuild(src_recipe)
    tgt = src if joint else _rebuild(tgt_recipe)
    for tok in (src, tgt):
        if isinstance(tok, Tokenizer):
            tok.threads = 1  # a process a core: more threads would only contend
    _WORKER.update(src=src, tgt=tgt, filters=filters, dtype=np.dtype(dtype))


def _worker_chunk(job: TextChunk) -> Chunk:
    w = _WORKER
    return encode_chunk(*decode_pairs(job), w["src"], w["tgt"], w["filters"], w["dtype"])


def decode_pairs(job: TextChunk) -> tuple[list[str], list[str]]:
    """The source and target lines of a chunk of text, decoded and stripped (long lines cut,
    with a warning naming file and line).

    Raises:
        DataError: invalid UTF-8 (file and line).
    """
    return ([s.strip() for s in decode_lines(job.src, job.src_path, first=job.first)],
            [t.strip() for t in decode_lines(job.tgt, job.tgt_path, first=job.first)])


def encode_stream(jobs: Iterator[TextChunk], src_tok, tgt_tok, filters: Filters, dtype: np.dtype,
                  workers: int = 1) -> Iterator[tuple[Chunk, TextChunk]]:
    """Decode and encode chunks of text in order, in ``workers`` processes (1: in this
    process); yields each :class:`Chunk` with its text. The text travels to the workers as
    bytes, whole lines, so this process does no work per line. At most ``2 x workers`` chunks
    are held (:func:`attnmt.data.workers.imap`), so memory stays bounded however long the
    stream."""
    if workers <= 1:
        for job in jobs:
            yield encode_chunk(*decode_pairs(job), src_tok, tgt_tok, filters, dtype), job
        return
    initargs = (_recipe(src_tok), _recipe(tgt_tok), src_tok is tgt_tok, filters, dtype.str)
    sent: collections.deque = collections.deque()  # the jobs in flight, in order

    def calls() -> Iterator[tuple]:
        for job in jobs:
            sent.append(job)
            yield (job,)

    for chunk in imap(_worker_chunk, calls(), workers, _init_worker, initargs):
        yield chunk, sent.popleft()
