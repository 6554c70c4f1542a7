"""Text files read in large blocks of whole lines, hashed as they are read.

``attnmt prepare`` reads every input once or twice (the tokenizer sample, the encoding), and a
corpus of a hundred million pairs must not cost a Python object per line in the process that
reads it. A :class:`HashedReader` reads a file (plain, or gzip by its magic bytes, of any number
of members) in blocks of a mebibyte, takes the SHA-256 of the file as stored while it reads,
and inflates gzip; :func:`whole_lines` turns its blocks into blocks of whole lines with numpy's
positions of their newlines, and :func:`pair_chunks` cuts two line-aligned files into chunks of
a fixed number of lines, as bytes, for worker processes to decode.

Lines are split at ``\\n`` only; a last line without a newline is a line; line numbers count
from 1.

Library: hashlib, zlib (or python-isal's ``isal_zlib``, the same interface, where installed), numpy.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from attnmt.errors import DataError

inflate_lib = zlib
try:  # speed: ISA-L's inflate (python-isal), the same stream about twice as fast as zlib's
    from isal import isal_zlib as inflate_lib  # noqa: F811
except ImportError:
    pass

READ_BYTES = 1 << 20  # bytes of the file read at a time
INFLATED_BYTES = 4 << 20  # at most this much text inflated from gzip at a time


class HashedReader:
    """The bytes of one text file, in blocks (:meth:`blocks`), and its record (:meth:`record`:
    path, size, modification time and SHA-256 of the file as stored, hashed while it is read).

    Attributes:
        read_bytes: bytes of the file read so far (for a progress bar).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.read_bytes = 0
        self._sha256 = hashlib.sha256()
        try:
            self._stat = self.path.stat()
        except FileNotFoundError:
            raise DataError(f"{self.path}: no such file") from None
        except OSError as e:
            raise DataError(f"{self.path}: cannot read: {e.strerror}") from None

    @property
    def size(self) -> int:
        return self._stat.st_size

    def blocks(self) -> Iterator[bytes]:
        """The file's text, inflated if it is gzip, in blocks (cut anywhere).

        Raises:
            DataError: unreadable file, corrupt or truncated gzip data.
        """
        pieces = self._pieces()
        first = next(pieces, b"")
        if first[:2] != b"\x1f\x8b":
            yield from _chain(first, pieces)
            return
        inflate, inside = inflate_lib.decompressobj(wbits=31), False  # inside: a gzip member begun, not ended
        try:
            for piece in _chain(first, pieces):
                while piece:
                    inside = True
                    yield inflate.decompress(piece, INFLATED_BYTES)
                    if inflate.eof:  # another member may follow
                        piece, inside = inflate.unused_data, False
                        inflate = inflate_lib.decompressobj(wbits=31)
                    else:
                        piece = inflate.unconsumed_tail
            if inside:
                raise EOFError("the file ends inside a gzip member")
        except (EOFError, zlib.error, inflate_lib.error) as e:
            raise DataError(f"{self.path}: corrupt gzip file: {e}") from None

    def _pieces(self) -> Iterator[bytes]:
        try:
            with open(self.path, "rb") as f:
                while piece := f.read(READ_BYTES):
                    self._sha256.update(piece)
                    self.read_bytes += len(piece)
                    yield piece
        except OSError as e:
            raise DataError(f"{self.path}: cannot read: {e.strerror}") from None

    def record(self) -> dict:
        """Path, size, modification time and SHA-256 of the file (once it has been read whole)."""
        return {"path": str(self.path), "bytes": self._stat.st_size, "mtime_ns": self._stat.st_mtime_ns,
                "sha256": self._sha256.hexdigest()}


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def whole_lines(blocks: Iterable[bytes]) -> Iterator[tuple[bytes, np.ndarray]]:
    """Blocks of whole lines, each with the positions just past its lines' ends (int64, one a
    line; the last line of the text may lack its newline)."""
    carry = b""
    for block in blocks:
        data = carry + block if carry else block
        ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1
        if len(ends) == 0:
            carry = data
            continue
        carry = data[int(ends[-1]):]
        yield data[: int(ends[-1])], ends
    if carry:
        yield carry, np.array([len(carry)], np.int64)


def head_lines(blocks: Iterable[tuple[bytes, np.ndarray]], lines: int | None) -> Iterator[tuple[bytes, np.ndarray]]:
    """The first ``lines`` lines of :func:`whole_lines`' blocks (None: all of them)."""
    if lines is None:
        yield from blocks
        return
    for data, ends in blocks:
        if len(ends) >= lines:
            yield data[: int(ends[lines - 1])], ends[:lines]
            return
        lines -= len(ends)
        yield data, ends


def line_chunks(blocks: Iterable[bytes], lines: int) -> Iterator[tuple[bytes, int]]:
    """The text cut into chunks of ``lines`` whole lines (the last may have fewer), as
    (bytes, number of lines)."""
    pending, count = [], 0  # the text since the last cut, and its lines
    for data, ends in whole_lines(blocks):
        start = 0
        for end in ends[lines - count - 1:: lines].tolist():  # the line that completes each chunk
            pending.append(data[start:end])
            yield b"".join(pending), lines
            pending, start = [], end
        count = (count + len(ends)) % lines
        if start < len(data):
            pending.append(data[start:])
    if pending:
        yield b"".join(pending), count


@dataclass
class TextChunk:
    """``lines`` line-aligned lines of two files, as bytes; ``first`` is the number of the
    chunk's first line in its files."""

    src: bytes
    tgt: bytes
    lines: int
    first: int
    src_path: str
    tgt_path: str


def pair_chunks(src: HashedReader, tgt: HashedReader, lines: int, limit: int | None = None) -> Iterator[TextChunk]:
    """Two line-aligned files in chunks of ``lines`` pairs (at most ``limit`` pairs in all).

    Raises:
        DataError: the files have different numbers of lines (both named, with their counts),
            and see :meth:`HashedReader.blocks`.
    """
    src_chunks, tgt_chunks = line_chunks(src.blocks(), lines), line_chunks(tgt.blocks(), lines)
    first = 1
    for (s, n_src), (t, n_tgt) in zip(src_chunks, tgt_chunks):
        if n_src != n_tgt:
            _misaligned(src, tgt, first - 1 + n_src + sum(n for _, n in src_chunks),
                        first - 1 + n_tgt + sum(n for _, n in tgt_chunks))
        if limit is not None and first - 1 + n_src >= limit:
            yield _head(TextChunk(s, t, n_src, first, str(src.path), str(tgt.path)), limit - first + 1)
            return
        yield TextChunk(s, t, n_src, first, str(src.path), str(tgt.path))
        first += n_src
    rest_src, rest_tgt = sum(n for _, n in src_chunks), sum(n for _, n in tgt_chunks)
    if rest_src or rest_tgt:
        _misaligned(src, tgt, first - 1 + rest_src, first - 1 + rest_tgt)


def _head(chunk: TextChunk, lines: int) -> TextChunk:
    """The chunk's first ``lines`` lines."""
    def cut(text: bytes) -> bytes:
        ends = np.flatnonzero(np.frombuffer(text, np.uint8) == 10) + 1
        return text[: int(ends[lines - 1])] if lines <= len(ends) else text
    return TextChunk(cut(chunk.src), cut(chunk.tgt), min(lines, chunk.lines), chunk.first, chunk.src_path,
                     chunk.tgt_path)


def _misaligned(src: HashedReader, tgt: HashedReader, n_src: int, n_tgt: int) -> None:
    raise DataError(f"{src.path} has {n_src} lines but {tgt.path} has {n_tgt}: parallel files must be line-aligned")
