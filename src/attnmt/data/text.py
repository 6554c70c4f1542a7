"""Reading text files: the one reader of plain or gzip UTF-8 text, line by line or in large
blocks of whole lines, and the one check that two parallel files are line-aligned.

A parallel corpus is two UTF-8 text files (plain, or gzip by its magic bytes, of any number of
members) where line N of one translates line N of the other. Lines are split at ``\\n`` only (a
CR before it is dropped); a last line without a newline is a line; line numbers count from 1.
A line longer than :data:`MAX_LINE_CHARS` characters is cut to it, with a warning naming file
and line. Errors name the file, the line and the problem.

``attnmt prepare`` reads every input once or twice (the tokenizer sample, the encoding), and a
corpus of a hundred million pairs must not cost a Python object per line in the process that
reads it. A :class:`HashedReader` reads a file in blocks of a mebibyte, takes the SHA-256 of
the file as stored while it reads, and inflates gzip; :func:`whole_lines` turns its blocks into
blocks of whole lines with numpy's positions of their newlines, and :func:`pair_chunks` cuts two
line-aligned files into chunks of a fixed number of lines, as bytes, for worker processes to
decode (:func:`decode_lines`). :func:`read_lines`, :func:`iter_lines`, :func:`iter_pairs` and
:func:`read_parallel` read the same blocks for the commands that want lines.

Library: hashlib, zlib (or python-isal's ``isal_zlib``, the same interface, where installed), numpy.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from attnmt.errors import DataError

log = logging.getLogger(__name__)

inflate_lib = zlib
try:  # speed: ISA-L's inflate (python-isal), the same stream about twice as fast as zlib's
    from isal import isal_zlib as inflate_lib  # noqa: F811
except ImportError:
    pass

READ_BYTES = 1 << 20  # bytes of the file read at a time
INFLATED_BYTES = 4 << 20  # at most this much text inflated from gzip at a time

# Lines longer than this many characters are cut to it, with a warning naming file and line, so
# that a hostile input (a 10 MB line) costs bounded memory and time downstream (SentencePiece,
# the model). Far above any sentence: training drops pairs longer than data.max_len subwords
# anyway, and translation cuts sources to the model's max_positions.
MAX_LINE_CHARS = 20_000


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
        inflate = inflate_lib.decompressobj(wbits=31)
        inside = False  # a gzip member begun, not ended
        try:
            for piece in _chain(first, pieces):
                while piece:
                    inside = True
                    yield inflate.decompress(piece, INFLATED_BYTES)
                    if inflate.eof:  # another member may follow
                        piece = inflate.unused_data
                        inside = False
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
    pending = []  # the text since the last cut
    count = 0  # its lines
    for data, ends in whole_lines(blocks):
        start = 0
        for end in ends[lines - count - 1:: lines].tolist():  # the line that completes each chunk
            pending.append(data[start:end])
            yield b"".join(pending), lines
            pending = []
            start = end
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
    src_chunks = line_chunks(src.blocks(), lines)
    tgt_chunks = line_chunks(tgt.blocks(), lines)
    first = 1
    for (s, n_src), (t, n_tgt) in itertools.zip_longest(src_chunks, tgt_chunks, fillvalue=(b"", 0)):
        if n_src != n_tgt:  # a short or missing chunk: one file ends here, and the totals differ
            check_aligned(src.path, first - 1 + n_src + sum(n for _, n in src_chunks),
                          tgt.path, first - 1 + n_tgt + sum(n for _, n in tgt_chunks))
        if limit is not None and first - 1 + n_src >= limit:
            yield _head(TextChunk(s, t, n_src, first, str(src.path), str(tgt.path)), limit - first + 1)
            return
        yield TextChunk(s, t, n_src, first, str(src.path), str(tgt.path))
        first += n_src


def _head(chunk: TextChunk, lines: int) -> TextChunk:
    """The chunk's first ``lines`` lines."""
    def cut(text: bytes) -> bytes:
        ends = np.flatnonzero(np.frombuffer(text, np.uint8) == 10) + 1
        return text[: int(ends[lines - 1])] if lines <= len(ends) else text
    return TextChunk(cut(chunk.src), cut(chunk.tgt), min(lines, chunk.lines), chunk.first, chunk.src_path,
                     chunk.tgt_path)


def check_aligned(src: str | Path, n_src: int, tgt: str | Path, n_tgt: int) -> None:
    """Check that two parallel files have as many lines each (the one place that says so).

    Raises:
        DataError: the counts differ (both files named, with their counts).
    """
    if n_src != n_tgt:
        raise DataError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: parallel files must be line-aligned")


# ---- lines ---------------------------------------------------------------------------------------

def decode_lines(data: bytes, name: str, max_chars: int = MAX_LINE_CHARS, first: int = 1,
                 warn: bool = True) -> list[str]:
    """Split UTF-8 bytes into lines at ``\\n`` only (no newlines; a final newline does not add an
    empty line; a CR before the newline is dropped). A line longer than ``max_chars``
    characters is cut to that length, with a warning naming ``name:line`` unless ``warn`` is
    false (``first``: the number of the first line, for a part of a file).

    Raises:
        DataError: a line is not valid UTF-8 (``name:line``).
    """
    try:  # the whole text at once; only a text with an invalid byte or an overlong line goes line by line
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = None
    if lines is not None:
        if lines and lines[-1] == "":
            lines.pop()
        if b"\r" in data:
            lines = [line.rstrip("\r") for line in lines]
        if not lines or max(map(len, lines)) <= max_chars:
            return lines
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=first):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{name}:{number}: invalid UTF-8 at byte {e.start} of the line") from None
        text = text.rstrip("\r")
        if len(text) > max_chars:
            if warn:
                log.warning("%s:%d: line of %d characters cut to %d", name, number, len(text), max_chars)
            text = text[:max_chars]
        lines.append(text)
    return lines


def sample_line(raw: bytes) -> str:
    """One line of a tokenizer sample, as bytes with or without its newline, decoded and
    stripped; an invalid byte becomes U+FFFD (the encoding pass names it, with its line) and a
    line over :data:`MAX_LINE_CHARS` is cut without a warning (the encoding pass warns)."""
    return raw.decode("utf-8", "replace").removesuffix("\n").rstrip("\r")[:MAX_LINE_CHARS].strip()


def read_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (plain, or gzip by its magic bytes) into lines without newlines.

    Raises:
        DataError: the file is missing, unreadable, corrupt gzip, or a line is not valid UTF-8
            (file and line).
    """
    return decode_lines(b"".join(HashedReader(path).blocks()), str(path))


def iter_lines(path: str | Path, warn: bool = True) -> Iterator[str]:
    """Lines of a UTF-8 text file (plain, or gzip by its magic bytes), streamed in blocks,
    without the line break and surrounding whitespace; a line longer than ``MAX_LINE_CHARS``
    characters is cut, with a warning unless ``warn`` is false.

    Raises:
        DataError: missing or unreadable file, corrupt gzip data, invalid UTF-8 (``file:line``).
    """
    number = 1
    for data, ends in whole_lines(HashedReader(path).blocks()):
        for text in decode_lines(data, str(path), first=number, warn=warn):
            yield text.strip()
        number += len(ends)


def iter_pairs(src_path: str | Path, tgt_path: str | Path, warn: bool = True) -> Iterator[tuple[str, str]]:
    """(source, target) lines of two line-aligned files, streamed (``warn``: see :func:`iter_lines`).

    Raises:
        DataError: see :func:`iter_lines`; or different line counts (:func:`check_aligned`).
    """
    src = iter_lines(src_path, warn)
    tgt = iter_lines(tgt_path, warn)
    n = 0
    for n, pair in enumerate(itertools.zip_longest(src, tgt), start=1):
        if pair[0] is None or pair[1] is None:
            check_aligned(src_path, n - 1 + (pair[0] is not None) + sum(1 for _ in src),
                          tgt_path, n - 1 + (pair[1] is not None) + sum(1 for _ in tgt))
        yield pair


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Read two line-aligned files.

    Returns:
        (source lines, target lines), equally long, whitespace-stripped.
    Raises:
        DataError: a file error (see :func:`read_lines`) or different line counts (:func:`check_aligned`).
    """
    src = read_lines(src_path)
    tgt = read_lines(tgt_path)
    check_aligned(src_path, len(src), tgt_path, len(tgt))
    return [s.strip() for s in src], [t.strip() for t in tgt]
