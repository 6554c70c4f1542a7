"""Prepared corpora on disk: flat token arrays with offsets, read pair by pair for training.

The layout follows fairseq's ``MMapIndexedDataset`` and nanoGPT's ``uint16`` ``np.memmap``
files: per split (``train``, ``valid``) and shard ``k`` (at most :data:`SHARD_PAIRS` pairs),

    DATA_DIR/train.00000.src.bin       the source ids of every pair, end to end (no specials);
                                       uint16 when the vocabulary has at most 65,536 ids, else uint32
    DATA_DIR/train.00000.src.idx.npy   int64 offsets, shape (pairs + 1,): pair i is bin[idx[i]:idx[i+1]]
    DATA_DIR/train.00000.tgt.bin, .tgt.idx.npy   the same for the target side
    DATA_DIR/train.00000.len.npy       int32 (pairs, 2): source and target lengths (no specials)
    DATA_DIR/valid.ref.txt             the raw target lines of the kept validation pairs (for BLEU)
                                       (a multilingual model: splits valid.0, valid.1, ... one per
                                       direction, listed in the manifest's valid_sets)
    DATA_DIR/manifest.json             counts, filter drops, tokenizer hashes, config, fingerprint
                                       (``attnmt.data.manifest``)
    DATA_DIR/spm.model (or src./tgt. models, or word vocabularies)   the tokenizers

Opening a directory (:class:`ShardedCorpus`) reads the manifest and each file's header only;
lengths, token arrays and offsets are then read where needed by positioned reads (the lengths
when a process plans an epoch, the pairs it batches), never held whole and never mapped, so
the processes of a machine share them through the page cache and none grows with the corpus
it has read (:class:`ShardFile`). A directory is
written under a temporary name beside its destination and renamed into place when complete
(:func:`staging_dir`), so a crash never leaves a half-written one.

Library: numpy (``np.lib.format`` for the ``.npy`` headers), ``os.preadv``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from attnmt.atomic import swap_directory
from attnmt.data.corpus import sha256_file  # noqa: F401  (re-exported: the manifest's hashes)
from attnmt.data.manifest import MANIFEST, Manifest
from attnmt.errors import DataError, WriteError, write_error

AGAIN = "prepare the data again (attnmt prepare, or delete the folder and train)"
SHARD_PAIRS = 2_000_000  # pairs per shard at most: files of a few hundred MB
VALID_REFS = "valid.ref.txt"


def refs_file(split: str) -> str:
    """The file of a validation split's raw target lines: ``valid.ref.txt``, ``valid.1.ref.txt``."""
    return f"{split}.ref.txt"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabulary of at most 65,536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def shard_name(split: str, index: int) -> str:
    return f"{split}.{index:05d}"


class ShardWriter:
    """Appends encoded pairs of one split to shard files in ``directory``, starting a new shard
    every ``shard_pairs`` pairs.

    Args:
        directory: where the files go (the staging directory).
        split: 'train' or 'valid'.
        dtype: token dtype (:func:`token_dtype`).
    """

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_pairs: int = SHARD_PAIRS):
        self.directory = Path(directory)
        self.split = split
        self.dtype = dtype
        self.shard_pairs = shard_pairs
        self.shards: list[dict] = []
        self._files: tuple | None = None
        self._lengths: list[np.ndarray] = []
        self._count = 0

    def add(self, src: np.ndarray, src_len: np.ndarray, tgt: np.ndarray, tgt_len: np.ndarray) -> None:
        """Append pairs given as flat id arrays and their per-pair lengths (int arrays)."""
        src_off = _starts(src_len)
        tgt_off = _starts(tgt_len)
        done = 0
        n = len(src_len)
        while done < n:
            if self._files is None:
                self._open()
            take = min(n - done, self.shard_pairs - self._count)
            end = done + take
            src[src_off[done]: src_off[end]].astype(self.dtype, copy=False).tofile(self._files[0])
            tgt[tgt_off[done]: tgt_off[end]].astype(self.dtype, copy=False).tofile(self._files[1])
            self._lengths.append(np.stack([src_len[done:end], tgt_len[done:end]], axis=1).astype(np.int32))
            self._count += take
            done = end
            if self._count == self.shard_pairs:
                self._close_shard()

    def close(self) -> list[dict]:
        """Finish the last shard; returns each shard's name, pairs and tokens."""
        if self._files is not None:
            self._close_shard()
        return self.shards

    def _open(self) -> None:
        name = shard_name(self.split, len(self.shards))
        self._files = tuple(open(self.directory / f"{name}.{side}.bin", "wb") for side in ("src", "tgt"))
        self._lengths = []
        self._count = 0

    def _close_shard(self) -> None:
        for f in self._files:
            f.close()
        self._files = None
        name = shard_name(self.split, len(self.shards))
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros((0, 2), np.int32)
        np.save(self.directory / f"{name}.len.npy", lengths)
        for column, side in enumerate(("src", "tgt")):
            offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths[:, column], out=offsets[1:])
            np.save(self.directory / f"{name}.{side}.idx.npy", offsets)
        self.shards.append({"name": name, "pairs": int(len(lengths)), "src_tokens": int(lengths[:, 0].sum()),
                            "tgt_tokens": int(lengths[:, 1].sum())})


def _starts(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@contextlib.contextmanager
def staging_dir(output: str | Path, replace: bool = False, empty_ok: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``output`` that becomes ``output`` (renamed, atomic on one
    filesystem: ``attnmt.atomic.swap_directory``) when the block ends without an error, and is
    removed otherwise (with the parent directory it made). With ``replace`` an existing ``output`` is swapped out and deleted after
    the rename; with ``empty_ok`` an empty directory ``output`` is taken as absent.

    Raises:
        WriteError: ``output`` exists (without ``replace``), or cannot be written.
    """
    output = Path(output)
    empty = empty_ok and output.is_dir() and not any(output.iterdir())
    if output.exists() and not (replace or empty):
        raise WriteError(f"{output}: exists; choose another directory or delete it")
    new_parent = not output.parent.exists()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    except OSError as e:
        raise write_error(f"{output}: cannot write: {e.strerror}", e) from None
    done = False
    try:
        yield tmp
        swap_directory(tmp, output)
        done = True
    except OSError as e:
        raise write_error(f"{output}: cannot write: {e.strerror}", e) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if new_parent and not done:  # leave no empty directory behind (a run directory, say)
            with contextlib.suppress(OSError):
                output.parent.rmdir()


class ShardFile:
    """One file of a shard, read by positioned reads (``os.preadv``), never memory-mapped: the
    pages a process reads stay in the page cache, shared by the processes of a machine, and
    never count in its RSS. (A mapping would map whole page-cache folios around each pair read,
    up to megabytes on recent kernels for freshly written files, and a training process's
    peak would grow with them.) An ``.npy`` file's elements begin after its header.

    Attributes:
        path: the file. dtype: its elements' dtype. length: its number of elements.
    Raises:
        DataError: a missing or unreadable file, or an ``.npy`` header of another dtype.
    """

    def __init__(self, path: Path, dtype: np.dtype, npy: bool = False):
        self.path = path
        self.dtype = np.dtype(dtype)
        try:
            self._file = open(path, "rb", buffering=0)
            self.start = 0
            if npy:
                major, _ = np.lib.format.read_magic(self._file)
                header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, _, found = header(self._file)
                if np.dtype(found) != self.dtype:
                    raise ValueError(f"{found} elements, not {self.dtype}")
                self.start = self._file.tell()
            self.length = (os.fstat(self._file.fileno()).st_size - self.start) // self.dtype.itemsize
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: unreadable shard file: {e}") from None

    def read(self, first: int, count: int) -> np.ndarray:
        """Elements ``first`` to ``first + count`` of the file, as a new array.

        Raises:
            DataError: the file ends before them (a truncated shard).
        """
        out = np.empty(count, self.dtype)
        view = memoryview(out).cast("B")
        offset = self.start + first * self.dtype.itemsize
        if hasattr(os, "preadv"):
            got = os.preadv(self._file.fileno(), [view], offset) if count else 0
        else:  # platforms without preadv: seek and read (one reader per file object)
            self._file.seek(offset)
            got = self._file.readinto(view) or 0
        if got != len(view):
            raise DataError(f"{self.path}: the file ends before element {first + count} (truncated shard?)")
        return out


@dataclass
class Shard:
    src: ShardFile  # the source ids, end to end
    src_idx: ShardFile  # int64 offsets
    tgt: ShardFile
    tgt_idx: ShardFile
    lengths: ShardFile  # int32 (source, target) lengths, two elements a pair


class ShardedCorpus:
    """The pairs of one split of a prepared directory, read by positioned reads
    (:class:`ShardFile`; five open files a shard).

    Attributes:
        corpora: the manifest's corpora of this split: name, first global index, pairs, weight.
        dropped: pairs dropped by each filter when the split was prepared.
        starts: (shards + 1,) the global index of each shard's first pair, and the pair count.
    Raises:
        DataError: a missing or truncated shard file (named).
    """

    def __init__(self, directory: str | Path, split: str = "train", manifest: Manifest | None = None):
        self.directory = Path(directory)
        if manifest is None:
            manifest = Manifest.load(directory)
        info = manifest.split(split)
        self.dtype = np.dtype(manifest.token_dtype)
        self.corpora = getattr(info, "corpora", [])
        self.dropped = info.dropped
        for k, entry in enumerate(info.shards):  # the names ShardWriter gives: nothing outside this folder is read
            if entry["name"] != shard_name(split, k):
                raise DataError(f"{self.directory / MANIFEST}: shard {k} of {split} is named {entry['name']!r}, "
                                f"not {shard_name(split, k)!r} (changed since it was written?); {AGAIN}")
        self.shards = [self._open(entry["name"], entry["pairs"],
                                  (entry["src_tokens"], entry["tgt_tokens"]) if "src_tokens" in entry else None)
                       for entry in info.shards]
        self.starts = np.cumsum([0] + [e["pairs"] for e in info.shards])

    def _open(self, name: str, pairs: int, tokens_recorded: tuple[int, int] | None = None) -> Shard:
        path = self.directory / name
        shard = Shard(ShardFile(Path(f"{path}.src.bin"), self.dtype),
                      ShardFile(Path(f"{path}.src.idx.npy"), np.int64, npy=True),
                      ShardFile(Path(f"{path}.tgt.bin"), self.dtype),
                      ShardFile(Path(f"{path}.tgt.idx.npy"), np.int64, npy=True),
                      ShardFile(Path(f"{path}.len.npy"), np.int32, npy=True))
        if shard.lengths.length != 2 * pairs:
            raise DataError(f"{path}.len.npy: {shard.lengths.length // 2} pairs, the manifest says {pairs}; "
                            f"{AGAIN}")
        lengths = shard.lengths.read(0, 2 * pairs).reshape(-1, 2)
        for side, (tokens, offsets) in enumerate(((shard.src, shard.src_idx), (shard.tgt, shard.tgt_idx))):
            name = ("src", "tgt")[side]
            if offsets.length != pairs + 1:
                raise DataError(f"{path}.{name}.idx.npy: {offsets.length} offsets for {pairs} pairs (truncated?); "
                                f"{AGAIN}")
            if offsets.read(pairs, 1)[0] != tokens.length:
                raise DataError(f"{path}.{name}.bin: {tokens.length} tokens, its offsets say "
                                f"{offsets.read(pairs, 1)[0]} (truncated?); {AGAIN}")
            if tokens_recorded is not None and int(lengths[:, side].sum()) != tokens_recorded[side]:
                raise DataError(f"{path}.len.npy: {int(lengths[:, side].sum())} {name} tokens, the manifest says "
                                f"{tokens_recorded[side]} (changed since it was written?); {AGAIN}")
            starts = offsets.read(0, pairs + 1)
            if starts[0] != 0 or not np.array_equal(np.diff(starts), lengths[:, side]):
                raise DataError(f"{path}.{name}.idx.npy: offsets that disagree with {path.name}.len.npy (changed "
                                f"since it was written?); {AGAIN}")
        return shard

    def __len__(self) -> int:
        return int(self.starts[-1])

    def length_chunks(self, size: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The source and target lengths (int32, no specials) of every pair in order, ``size``
        pairs at a time (new arrays, read from the length files)."""
        for shard in self.shards:
            pairs = shard.lengths.length // 2
            for start in range(0, pairs, size):
                part = shard.lengths.read(2 * start, 2 * min(size, pairs - start)).reshape(-1, 2)
                yield part[:, 0], part[:, 1]

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and target ids of pair ``i`` (global index), as new arrays of the token dtype."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        s = self.shards[k]
        j = int(i - self.starts[k])
        sides = []
        for tokens, offsets in ((s.src, s.src_idx), (s.tgt, s.tgt_idx)):
            first, end = offsets.read(j, 2).tolist()
            sides.append(tokens.read(first, end - first))
        return sides[0], sides[1]

    def pairs(self, indices) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Source and target id arrays of the pairs at ``indices``, in that order (new arrays;
        four positioned reads a pair)."""
        found = [self.pair(int(i)) for i in indices]
        return [s for s, _ in found], [t for _, t in found]
