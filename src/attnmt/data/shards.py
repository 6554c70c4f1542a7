"""Prepared corpora on disk: flat token arrays with offsets, memory-mapped for training.

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
    DATA_DIR/spm.model (or src./tgt. models, or word vocabularies)   the tokenizers

Opening a directory (:class:`ShardedCorpus`) reads the manifest only; lengths, token arrays
and offsets are memory-mapped, so a process touches just the pages it reads (the lengths when
it plans an epoch, the pairs it batches), processes on one machine share them through the
page cache, and after each batch the pages are unmapped from the process again
(:meth:`ShardedCorpus.release`). A directory is
written under a temporary name beside its destination and renamed into place when complete
(:func:`staging_dir`), so a crash never leaves a half-written one.

Library: numpy (``np.memmap``, ``np.load(mmap_mode='r')``).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from attnmt.data.corpus import sha256_file  # noqa: F401  (re-exported: the manifest's hashes)
from attnmt.errors import DataError, WriteError

MANIFEST = "manifest.json"
FORMAT = "attnmt-prepared-1"
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
        self.directory, self.split, self.dtype, self.shard_pairs = Path(directory), split, dtype, shard_pairs
        self.shards: list[dict] = []
        self._files: tuple | None = None
        self._lengths: list[np.ndarray] = []
        self._count = 0

    def add(self, src: np.ndarray, src_len: np.ndarray, tgt: np.ndarray, tgt_len: np.ndarray) -> None:
        """Append pairs given as flat id arrays and their per-pair lengths (int arrays)."""
        src_off, tgt_off = _starts(src_len), _starts(tgt_len)
        done, n = 0, len(src_len)
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
        self._lengths, self._count = [], 0

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
def staging_dir(output: str | Path, replace: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``output`` that becomes ``output`` (renamed, atomic on one
    filesystem) when the block ends without an error, and is removed otherwise. With
    ``replace`` an existing ``output`` is swapped out and deleted after the rename.

    Raises:
        WriteError: ``output`` exists (without ``replace``), or cannot be written.
    """
    output = Path(output)
    if output.exists() and not replace:
        raise WriteError(f"{output}: exists; choose another directory or delete it")
    new_parent = not output.parent.exists()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    except OSError as e:
        raise WriteError(f"{output}: cannot write: {e.strerror}") from None
    done = False
    try:
        yield tmp
        old = None
        if output.exists():
            old = output.with_name(f".{output.name}.old.{os.getpid()}")
            os.replace(output, old)
        os.replace(tmp, output)
        done = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise WriteError(f"{output}: cannot write: {e.strerror}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if new_parent and not done:  # leave no empty directory behind (a run directory, say)
            with contextlib.suppress(OSError):
                output.parent.rmdir()


def write_manifest(directory: Path, manifest: dict) -> None:
    (Path(directory) / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n",
                                            encoding="utf-8")


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a prepared directory.

    Raises:
        DataError: no manifest (not a prepared directory, or an unfinished one), or not ours.
    """
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing; is {directory} a directory written by 'attnmt prepare'?") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a manifest of format {FORMAT}")
    return manifest


@dataclass
class Shard:
    src: np.ndarray  # memory-mapped ids
    src_idx: np.ndarray  # memory-mapped int64 offsets
    tgt: np.ndarray
    tgt_idx: np.ndarray


class ShardedCorpus:
    """The pairs of one split of a prepared directory, memory-mapped.

    Attributes:
        corpora: the manifest's corpora of this split: name, first global index, pairs, weight.
        dropped: pairs dropped by each filter when the split was prepared.
        starts: (shards + 1,) the global index of each shard's first pair, and the pair count.
    Raises:
        DataError: a missing or truncated shard file (named).
    """

    def __init__(self, directory: str | Path, split: str = "train", manifest: dict | None = None):
        self.directory = Path(directory)
        manifest = manifest if manifest is not None else read_manifest(directory)
        info = manifest[split]
        self.dtype = np.dtype(manifest["token_dtype"])
        self.corpora, self.dropped = info.get("corpora", []), info["dropped"]
        self.shards: list[Shard] = []
        self._mmaps: list[mmap.mmap] = []
        self._lengths: list[tuple[np.ndarray, mmap.mmap | None]] = []  # each shard's (pairs, 2) lengths, mapped
        for entry in info["shards"]:
            shard_lengths = self._load(f"{entry['name']}.len.npy", mapped=True, keep=False)
            if len(shard_lengths) != entry["pairs"]:
                raise DataError(f"{self.directory / entry['name']}.len.npy: {len(shard_lengths)} pairs, the "
                                f"manifest says {entry['pairs']}")
            self._lengths.append((shard_lengths.view(np.ndarray), getattr(shard_lengths, "_mmap", None)))
            self.shards.append(Shard(*self._sides(entry["name"])))
        self.starts = np.cumsum([0] + [e["pairs"] for e in info["shards"]])

    def _load(self, name: str, mapped: bool = False, keep: bool = True) -> np.ndarray:
        try:
            array = np.load(self.directory / name, mmap_mode="r" if mapped else None)
            return self._keep(array) if mapped and keep else array
        except (OSError, ValueError) as e:
            raise DataError(f"{self.directory / name}: unreadable shard file: {e}") from None

    def _map(self, name: str, side: str) -> np.ndarray:
        path = self.directory / f"{name}.{side}.bin"
        try:
            if path.stat().st_size == 0:
                return np.zeros(0, self.dtype)
            return self._keep(np.memmap(path, dtype=self.dtype, mode="r"))
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: unreadable shard file: {e}") from None

    def _keep(self, array: np.memmap) -> np.ndarray:
        """``array`` as a plain ndarray view (it slices faster), its mapping kept for :meth:`release`."""
        if hasattr(array._mmap, "madvise"):
            self._mmaps.append(array._mmap)
        return array.view(np.ndarray)

    def _sides(self, name: str) -> list[np.ndarray]:
        src, tgt = self._map(name, "src"), self._map(name, "tgt")
        src_idx, tgt_idx = self._load(f"{name}.src.idx.npy", True), self._load(f"{name}.tgt.idx.npy", True)
        if src_idx[-1] != len(src) or tgt_idx[-1] != len(tgt):
            raise DataError(f"{self.directory / name}: token files and offsets disagree (truncated shard?)")
        return [src, src_idx, tgt, tgt_idx]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def length_chunks(self, size: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The source and target lengths (int32, no specials) of every pair in order, ``size``
        pairs at a time (copies), read from the memory-mapped length files; each file's pages
        are unmapped again once read (:meth:`release`), so that reading all the lengths, as an
        epoch's plan does, leaves this process no larger."""
        for lengths, mapping in self._lengths:
            for start in range(0, len(lengths), size):
                part = np.array(lengths[start: start + size])
                yield part[:, 0], part[:, 1]
            if mapping is not None and hasattr(mapping, "madvise"):
                mapping.madvise(mmap.MADV_DONTNEED)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and target ids of pair ``i`` (global index), as arrays of the token dtype."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        s, j = self.shards[k], int(i - self.starts[k])
        return s.src[s.src_idx[j]: s.src_idx[j + 1]], s.tgt[s.tgt_idx[j]: s.tgt_idx[j + 1]]

    def pairs(self, indices) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Source and target id arrays of the pairs at ``indices``, in that order (copies).

        The pages read are then unmapped from this process again (:meth:`release`), so a
        process's RSS does not grow with the share of the corpus it has read.
        """
        found = [(s.copy(), t.copy()) for s, t in (self.pair(int(i)) for i in indices)]
        self.release()
        return [s for s, _ in found], [t for _, t in found]

    def release(self) -> None:
        """Unmap the pages of the token and offset files that this process has touched
        (``madvise(MADV_DONTNEED)``; a shared, read-only file mapping loses nothing: the pages
        stay in the page cache and fault in again when read). Without it each batch's scattered
        pairs would map about 64 KiB per pair and file (the kernel's fault-around) for good,
        and a long run would map most of the corpus into every process. Nothing where the
        platform has no ``madvise``."""
        for m in self._mmaps:
            m.madvise(mmap.MADV_DONTNEED)
