"""Preparing a corpus once: stream the text, train the tokenizers on a sample, filter, encode
in worker processes and write token shards (``attnmt.data.shards``).

``attnmt prepare CONFIG --output DATA_DIR`` and ``attnmt train`` (into ``RUN_DIR/data``, when
the configuration names text files) both call :func:`prepare`. The steps:

1. Every input file (plain or gzip) is checked to be readable before any long work.
2. Unless ready-made tokenizers are given (a fine-tuned model's, a resumed run's), one pass over
   each side of the training text fills a seeded reservoir (:class:`Reservoir`, Vitter's
   algorithm R) of at most ``tokenizer.max_sentences`` lines (with several workers the sides, or
   a multilingual model's languages, are read at once, in processes of their own), and the
   tokenizers are trained on its non-empty lines. A side within that size is sampled whole and
   in order, so the tokenizers equal those trained on all of it.
3. A second pass reads the pairs in chunks of whole lines, as bytes (``attnmt.data.blocks``:
   blocks of a mebibyte, cut with numpy, no Python object per line), taking each file's
   SHA-256 as it reads; ``workers`` processes decode, encode and filter the chunks (in order);
   the main process removes duplicates and appends the kept pairs to the shards. A progress
   bar shows the bytes read (and so the time left) and the pairs per second. Neither pass
   holds more than a few chunks of text in memory.

Filters, each counted in the manifest, applied in this order (a pair is counted once, by the
first that drops it):

- ``empty``: a side is empty after stripping whitespace (always on);
- ``too_long``: a side has more than ``data.max_len`` subwords (always on);
- ``length_ratio``: longer side / shorter side in subwords is not below
  ``data.filter.max_length_ratio`` (opusfilter's ``LengthRatioFilter``, which accepts a pair
  when that ratio is below its threshold, with an empty side giving an infinite ratio; counted
  here in subwords rather than opusfilter's words or characters);
- ``copies``: the source text equals the target text (``data.filter.copies``; opusfilter's
  and Bicleaner's notion of an untranslated pair, exact match);
- ``duplicate``: the exact (source, target) text of a pair kept before, compared by a 64-bit
  BLAKE2b hash of the pair (``data.filter.dedup``; fairseq and Marian leave duplicates in by
  default, and so does attnmt).

The validation pairs (the first ``data.valid_max_sentences``, if set) are prepared too, with
the ``empty`` and ``too_long`` filters only, so that a validation line too long for the model
never reaches it.

A multilingual model (``attnmt.languages``: corpora with several target languages) differs in
three places: its one SentencePiece model is trained on a sample balanced across languages
(:func:`sample_by_language`) with the tags reserved; every source starts with the tag of its
corpus' target language (counted in ``data.max_len``); and each direction's validation set is
a split of its own (``valid.0``, ``valid.1``, ... listed in the manifest's ``valid_sets``).

Library: multiprocessing (worker processes: :mod:`attnmt.data.workers`), hashlib, numpy, tqdm, sentencepiece.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import itertools
import json
import logging
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from attnmt import languages
from attnmt.config import Config
from attnmt.data import shards
from attnmt.data.blocks import HashedReader, TextChunk, head_lines, pair_chunks, whole_lines
from attnmt.data.corpus import MAX_LINE_CHARS, dataset_pair_files, decode_lines
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer, WordTokenizer
from attnmt.data.vectors import vec_words
from attnmt.data.workers import imap
from attnmt.errors import ConfigError, DataError, write_error
from attnmt.signals import stop_point

log = logging.getLogger(__name__)

CHUNK_PAIRS = 4000  # pairs per worker task
FILTERS = ("empty", "too_long", "length_ratio", "copies", "duplicate")
_EMPTY, _TOO_LONG, _RATIO, _COPIES = 1, 2, 3, 4  # codes of the per-chunk filters (0: kept)


# ---- reading -------------------------------------------------------------------------------------

def iter_lines(path: str | Path, warn: bool = True) -> Iterator[str]:
    """Lines of a UTF-8 text file (plain, or gzip by its magic bytes), one at a time, split at
    ``\\n`` only, without the line break and surrounding whitespace; a line longer than
    ``MAX_LINE_CHARS`` characters is cut, with a warning unless ``warn`` is false (as
    ``attnmt.data.corpus.decode_lines``).

    Raises:
        DataError: missing or unreadable file, corrupt gzip data, invalid UTF-8 (``file:line``).
    """
    path = Path(path)
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    number = 0
    try:
        with raw:
            stream = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
            for number, line in enumerate(stream, start=1):
                yield _decode(line, path, number, warn)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}:{number + 1}: corrupt gzip file: {e}") from None


def _decode(line: bytes, path: Path, number: int, warn: bool) -> str:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{number}: invalid UTF-8 at byte {e.start} of the line") from None
    text = text.removesuffix("\n").rstrip("\r")
    if len(text) > MAX_LINE_CHARS:
        if warn:
            log.warning("%s:%d: line of %d characters cut to %d", path, number, len(text), MAX_LINE_CHARS)
        text = text[:MAX_LINE_CHARS]
    return text.strip()


def iter_pairs(src_path: str | Path, tgt_path: str | Path, warn: bool = True) -> Iterator[tuple[str, str]]:
    """(source, target) lines of two line-aligned files, streamed (``warn``: see :func:`iter_lines`).

    Raises:
        DataError: see :func:`iter_lines`; or different line counts (both given).
    """
    src, tgt = iter_lines(src_path, warn), iter_lines(tgt_path, warn)
    n = 0
    for n, pair in enumerate(itertools.zip_longest(src, tgt), start=1):
        if pair[0] is None or pair[1] is None:
            n_src = n - 1 + (pair[0] is not None) + sum(1 for _ in src)
            n_tgt = n - 1 + (pair[1] is not None) + sum(1 for _ in tgt)
            raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: parallel files must be "
                            "line-aligned")
        yield pair


class Reservoir:
    """A uniform random sample of at most ``capacity`` lines of a stream of blocks of whole
    lines (Vitter's algorithm R, vectorised over each block): the first ``capacity`` lines fill
    the slots in order (a stream of at most ``capacity`` lines is kept whole and in order), and
    line t (counting from 1) then takes slot ``floor(u_t x t)`` when that is below ``capacity``,
    u_t uniform from numpy's Philox generator keyed on ``(seed, stream)``. Lines are kept as
    bytes and decoded at the end, so the lines that pass through cost no Python object."""

    def __init__(self, capacity: int, seed: int, stream: int):
        self.capacity, self.seen, self.slots = capacity, 0, []
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
        """The sample, decoded and stripped, without its empty lines."""
        lines = (raw.decode("utf-8", "replace").removesuffix("\n").rstrip("\r")[:MAX_LINE_CHARS].strip()
                 for raw in self.slots)  # an invalid byte is the encoding pass's to name, with its line
        return [line for line in lines if line]


# ---- what to read --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    """One training corpus (``data.train``) or validation set: its files, weight and languages
    (None where the configuration does not say)."""

    name: str
    src: Path
    tgt: Path
    weight: float = 1.0
    src_lang: str | None = None
    tgt_lang: str | None = None
    max_pairs: int | None = None  # read only the first N pairs (None: all)


def training_corpora(config: Config, data_dir: str | None = None) -> list[Corpus]:
    """The training corpora a configuration names: the dataset's train split (of each of
    ``data.pairs``, cut to ``data.max_pairs``), the single ``train_src``/``train_tgt`` pair, or
    the entries of ``data.train``.

    Raises:
        ConfigError: the configuration has only a prepared directory (no text to read).
        DataError: see ``attnmt.data.corpus.dataset_pair_files``.
    """
    d, (src_lang, tgt_lang) = config.data, config.languages()
    limits = d.max_pairs or {}
    if d.pairs is not None:
        return [Corpus(f"{d.dataset}.{d.train_split}.{pair}", *dataset_pair_files(
            d.dataset, pair, d.train_split, data_dir or d.data_dir), 1.0, *pair.split("-"), limits.get(pair))
            for pair in d.pairs]
    if d.dataset is not None:
        return [Corpus(f"{d.dataset}.{d.train_split}", *dataset_pair_files(d.dataset, d.pair, d.train_split,
                                                                           data_dir or d.data_dir), 1.0,
                       src_lang, tgt_lang, limits.get(d.pair))]
    if d.train is not None:
        return [Corpus(f"train[{i}]", data_path(e.src), data_path(e.tgt), e.weight, e.src_lang or src_lang,
                       e.tgt_lang or tgt_lang, e.max_pairs) for i, e in enumerate(d.train)]
    if d.train_src is not None:
        return [Corpus("train", data_path(d.train_src), data_path(d.train_tgt), 1.0, src_lang, tgt_lang)]
    raise ConfigError(f"data.prepared is set ({d.prepared}): this configuration names no text files")


def data_path(path: str) -> Path:
    """A data file named in a configuration, with ``~`` and environment variables expanded
    (``$ATTNMT_DATA/multi30k/train.cs.gz``).

    Raises:
        DataError: the path names an environment variable that is not set.
    """
    expanded = os.path.expanduser(os.path.expandvars(path))
    unset = re.search(r"\$\{?(\w+)", expanded)
    if unset:
        raise DataError(f"{path}: the environment variable {unset.group(1)} is not set; set it (export "
                        f"{unset.group(1)}=DIR) or write the path out")
    return Path(expanded)


def names_text(config: Config) -> bool:
    """Whether the configuration names training text (beside ``data.prepared``, or instead)."""
    d = config.data
    return d.dataset is not None or d.train is not None or d.train_src is not None


def validation_sets(config: Config, data_dir: str | None = None) -> list[Corpus]:
    """The validation sets: the dataset's validation split (of each of ``data.pairs``), the
    ``valid_src``/``valid_tgt`` pair or the entries of ``data.valid``; [] if none. A set is
    named by its direction ('de-en') where the configuration gives its languages.

    Raises:
        DataError: see ``attnmt.data.corpus.dataset_pair_files``.
    """
    d, (src_lang, tgt_lang) = config.data, config.languages()
    if d.dataset is not None and d.valid_split is not None:
        return [Corpus(pair, *dataset_pair_files(d.dataset, pair, d.valid_split, data_dir or d.data_dir), 1.0,
                       *pair.split("-")) for pair in (d.pairs or [d.pair])]
    if d.valid is not None:
        return [Corpus(f"{e.src_lang}-{e.tgt_lang}", data_path(e.src), data_path(e.tgt), 1.0, e.src_lang,
                       e.tgt_lang) for e in d.valid]
    if d.valid_src is not None:
        name = f"{src_lang}-{tgt_lang}" if src_lang and tgt_lang else "valid"
        return [Corpus(name, data_path(d.valid_src), data_path(d.valid_tgt), 1.0, src_lang, tgt_lang)]
    return []


def valid_split(index: int, several: bool) -> str:
    """The shard split of validation set ``index``: 'valid' (a model's only set), else 'valid.N'
    (a multilingual model's sets, or several sets of one target language)."""
    return f"valid.{index}" if several else "valid"


def _check_readable(paths: list[Path]) -> None:
    for path in paths:
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            raise DataError(f"{path}: no such file") from None
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e.strerror}") from None


def file_record(path: Path) -> dict:
    """Path, size, modification time and SHA-256 of an input file (the manifest's fingerprint)."""
    stat = path.stat()
    return {"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": shards.sha256_file(path)}


# ---- tokenizers ----------------------------------------------------------------------------------

def sample_lines(corpora: list[Corpus], capacity: int, seed: int, workers: int = 1) -> tuple[list[str], list[str]]:
    """Seeded samples (:class:`Reservoir`) of at most ``capacity`` lines per side of all the
    corpora, in one pass over each side, without their empty lines. With ``workers`` > 1 the
    two sides are read at once, in two processes (the same samples).

    Raises:
        DataError: see :class:`~attnmt.data.blocks.HashedReader`; files of a corpus with
            different line counts; or a side with no non-empty line.
    """
    (src, src_counts), (tgt, tgt_counts) = _in_parallel(_sample_side, [(corpora, capacity, seed, side)
                                                                        for side in (0, 1)], workers)
    for corpus, n_src, n_tgt in zip(corpora, src_counts, tgt_counts):
        if n_src != n_tgt:
            raise DataError(f"{corpus.src} has {n_src} lines but {corpus.tgt} has {n_tgt}: parallel files must be "
                            "line-aligned")
    if not (src and tgt):
        _no_pair(corpora)
    return src, tgt


def _sample_side(corpora: list[Corpus], capacity: int, seed: int, side: int) -> tuple[list[str], list[int]]:
    """One side's sample (source 0, target 1) and its line count in each corpus."""
    reservoir, counts = Reservoir(capacity, seed, side), []
    for corpus in corpora:
        seen = reservoir.seen
        for data, ends in head_lines(whole_lines(HashedReader((corpus.src, corpus.tgt)[side]).blocks()),
                                     corpus.max_pairs):
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
        DataError: see :class:`~attnmt.data.blocks.HashedReader`; or no non-empty line.
    """
    files: dict[str, dict[Path, int | None]] = {}  # language -> its files, each with the lines to read
    for corpus in corpora:
        for lang, path in ((corpus.src_lang, corpus.src), (corpus.tgt_lang, corpus.tgt)):
            paths = files.setdefault(lang, {})
            known = paths.get(path, 0)  # a file several corpora share is read once, as far as the farthest
            paths[path] = None if None in (known, corpus.max_pairs) else max(known, corpus.max_pairs)
    share = max(1, capacity // len(files))
    samples = _in_parallel(_sample_language, [(lang, paths, share, seed, stream)
                                              for stream, (lang, paths) in enumerate(files.items())], workers)
    lines = [line for sample in samples for line in sample]
    if not lines:
        _no_pair(corpora)
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


def train_tokenizers(config: Config, src_lines: list[str], tgt_lines: list[str]
                     ) -> tuple[Tokenizer | WordTokenizer, Tokenizer | WordTokenizer]:
    """SentencePiece model(s), or word vocabularies (``tokenizer.kind word``), trained on the
    given lines; a joint model is one object for both sides.

    Raises:
        DataError: no non-empty line, or SentencePiece cannot train on the text.
    """
    tc = config.tokenizer
    if tc.target_languages and (tc.kind == "word" or not tc.joint):
        raise ConfigError("a multilingual model needs one SentencePiece vocabulary for all its languages: set "
                          "tokenizer.kind sentencepiece and tokenizer.joint true")
    if tc.kind == "word":
        return _train_word_tokenizers(config, src_lines, tgt_lines)
    options = dict(vocab_size=tc.vocab_size, model_type=tc.model_type, character_coverage=tc.character_coverage,
                   max_sentences=tc.max_sentences, seed=config.train.seed)
    if tc.target_languages:  # multilingual: one model over every language, the tags reserved
        log.info("training a joint SentencePiece %s model (%d pieces) with the tags %s", tc.model_type,
                 tc.vocab_size, " ".join(languages.tags(config)))
        tok = Tokenizer.train(src_lines + tgt_lines, **options, user_symbols=languages.tags(config))
        return tok, tok
    if tc.joint:
        log.info("training a joint SentencePiece %s model (%d pieces)", tc.model_type, tc.vocab_size)
        tok = Tokenizer.train(src_lines + tgt_lines, **options)
        return tok, tok
    log.info("training source and target SentencePiece %s models (%d pieces each)", tc.model_type, tc.vocab_size)
    return Tokenizer.train(src_lines, **options), Tokenizer.train(tgt_lines, **options)


def _train_word_tokenizers(config: Config, src_lines: list[str], tgt_lines: list[str]
                           ) -> tuple[WordTokenizer, WordTokenizer]:
    """Word vocabularies of each side (tokenizer.kind word); with ``require_vectors`` only words
    that have a vector in ``model.src_vectors`` / ``model.tgt_vectors``."""
    tc, mc = config.tokenizer, config.model
    options = dict(lowercase=tc.lowercase, min_freq=tc.min_freq, max_vocab=tc.max_vocab, token_filter=tc.token_filter)
    src_lang, tgt_lang = config.languages()
    src_allowed = vec_words(mc.src_vectors) if tc.require_vectors else None
    tgt_allowed = vec_words(mc.tgt_vectors) if tc.require_vectors else None
    log.info("building word vocabularies (%s, %s) with spaCy's rule-based tokenizer", src_lang, tgt_lang)
    return (WordTokenizer.train(src_lines, src_lang, allowed=src_allowed, **options),
            WordTokenizer.train(tgt_lines, tgt_lang, allowed=tgt_allowed, **options))


def save_tokenizers(directory: Path, src, tgt) -> dict[str, str]:
    """Write the tokenizers in a model directory's layout (``attnmt.rundir.read_tokenizers``
    reads them): ``spm.model`` for a joint model, else ``src.`` and ``tgt.`` files, plus
    ``vocab.json`` for a MarianMT vocabulary. Returns each file's SHA-256.

    Raises:
        WriteError: a file cannot be written (named).
    """
    writes = [(src.FILE, src)] if src is tgt and not isinstance(src, VocabTokenizer) else [
        (f"src.{src.FILE}", src), (f"tgt.{tgt.FILE}", tgt)]
    for name, tok in writes:
        try:
            tok.save(directory / name)
            if isinstance(tok, VocabTokenizer) and name.startswith("src."):
                (directory / "vocab.json").write_text(json.dumps(tok.vocab, ensure_ascii=False), encoding="utf-8")
        except OSError as e:
            raise write_error(f"{directory / name}: cannot write: {e.strerror}", e) from None
    names = ("spm.model", "src.spm.model", "tgt.spm.model", "vocab.json", "src.vocab.json", "tgt.vocab.json")
    return {n: shards.sha256_file(directory / n) for n in names if (directory / n).is_file()}


# ---- encoding and filtering ----------------------------------------------------------------------

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
        nonempty, sources, targets = np.arange(len(src_lines), dtype=np.int64), src_lines, tgt_lines
    else:
        nonempty = np.array([i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s and t], dtype=np.int64)
        sources, targets = [src_lines[i] for i in nonempty], [tgt_lines[i] for i in nonempty]
    if src_tok is tgt_tok:  # a joint vocabulary: both sides in one call
        both = src_tok.encode_batch(sources + targets)
        src_ids, tgt_ids = both[: len(sources)], both[len(sources):]
    else:
        src_ids, tgt_ids = src_tok.encode_batch(sources), tgt_tok.encode_batch(targets)
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
    dropped[0], dropped[_EMPTY] = 0, len(src_lines) - len(nonempty)
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
    return VocabTokenizer(*recipe[1:]) if kind == "vocab" else Tokenizer(recipe[1]) if kind == "spm" else recipe[1]


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


# ---- the whole preparation -----------------------------------------------------------------------

@dataclass
class SplitStats:
    """Counts of one split (or corpus) while it is written."""

    lines: int = 0
    pairs: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILTERS, 0))

    def add(self, chunk: Chunk, lines: int, duplicates: int) -> None:
        self.lines += lines
        self.pairs += len(chunk.src_len)  # the duplicates are gone already
        for code, name in enumerate(FILTERS[:4], start=1):
            self.dropped[name] += int(chunk.dropped[code])
        self.dropped["duplicate"] += duplicates


def _drop_duplicates(chunk: Chunk, seen: HashSet64) -> int:
    """Remove the pairs of ``chunk`` whose hash was seen; returns how many."""
    new = seen.add_new(chunk.hashes)
    if new.all():
        return 0
    chunk.src = chunk.src[np.repeat(new, chunk.src_len)]
    chunk.tgt = chunk.tgt[np.repeat(new, chunk.tgt_len)]
    chunk.src_len, chunk.tgt_len, chunk.kept = chunk.src_len[new], chunk.tgt_len[new], chunk.kept[new]
    return int((~new).sum())


def _write_training_split(staging: Path, corpora: list[Corpus], tokenizers, filters: Filters, dtype: np.dtype,
                          workers: int, shard_pairs: int, progress: bool, prefixes: dict[str, tuple[int, ...]]
                          ) -> tuple[list[dict], list[dict], SplitStats]:
    writer, total, seen = shards.ShardWriter(staging, "train", dtype, shard_pairs), SplitStats(), HashSet64()
    entries, t0, done = [], time.monotonic(), 0  # done: bytes of the corpora read whole
    size = sum(p.stat().st_size for c in corpora for p in (c.src, c.tgt))
    bar = tqdm(total=size, unit="B", unit_scale=True, dynamic_ncols=True, desc="prepare",
               disable=None if progress else True)  # bytes of the input files read: its ETA
    with bar:
        for corpus in corpora:
            stats, start, readers = SplitStats(), total.pairs, (HashedReader(corpus.src), HashedReader(corpus.tgt))
            jobs = pair_chunks(*readers, CHUNK_PAIRS, corpus.max_pairs)
            settings = dataclasses.replace(filters, prefix=prefixes[corpus.name])
            for chunk, job in encode_stream(jobs, *tokenizers, settings, dtype, workers):
                stop_point()  # a stop signal swallowed where Python ignores exceptions
                duplicates = _drop_duplicates(chunk, seen) if filters.dedup else 0
                writer.add(chunk.src, chunk.src_len, chunk.tgt, chunk.tgt_len)
                stats.add(chunk, job.lines, duplicates)
                total.add(chunk, job.lines, duplicates)
                bar.update(done + sum(r.read_bytes for r in readers) - bar.n)
                bar.set_postfix_str(f"{total.lines:,} pairs, {total.lines / (time.monotonic() - t0):,.0f} pairs/s",
                                    refresh=False)
            done += sum(r.read_bytes for r in readers)
            if corpus.max_pairs is not None and stats.lines < corpus.max_pairs:
                log.warning("%s: max_pairs is %d but its files hold %d pairs: all of them are used", corpus.name,
                            corpus.max_pairs, stats.lines)
            records = [r.record() if corpus.max_pairs is None else file_record(r.path) for r in readers]  # whole
            entries.append({"name": corpus.name, "weight": corpus.weight, "start": start, "lines": stats.lines,
                            "pairs": stats.pairs, "dropped": stats.dropped, "src": records[0], "tgt": records[1],
                            **_languages(corpus, prefixes), **_limit(corpus)})
            log.info("%s: %d of %d pairs kept; dropped %s", corpus.name, stats.pairs, stats.lines,
                     ", ".join(f"{n} {k}" for k, n in stats.dropped.items() if n) or "none")
    return writer.close(), entries, total


def _write_validation_split(staging: Path, split: str, files: Corpus, tokenizers, max_len: int, limit: int | None,
                            dtype: np.dtype, prefix: tuple[int, ...]) -> dict:
    writer, stats, refs = shards.ShardWriter(staging, split, dtype), SplitStats(), []
    for job in pair_chunks(HashedReader(files.src), HashedReader(files.tgt), CHUNK_PAIRS, limit):
        stop_point()
        lines = decode_pairs(job)
        chunk = encode_chunk(*lines, *tokenizers, Filters(max_len, prefix=prefix), dtype)
        writer.add(chunk.src, chunk.src_len, chunk.tgt, chunk.tgt_len)
        stats.add(chunk, job.lines, 0)
        refs.extend(lines[1][i] for i in chunk.kept)
    (staging / shards.refs_file(split)).write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    if stats.dropped["too_long"]:
        log.warning("validation %s: %d pairs longer than %d subwords left out", files.name,
                    stats.dropped["too_long"], max_len)
    return {"shards": writer.close(), "lines": stats.lines, "pairs": stats.pairs, "dropped": stats.dropped,
            "src": file_record(files.src), "tgt": file_record(files.tgt)}


def _limit(corpus: Corpus) -> dict:
    """A corpus' ``max_pairs`` for its manifest entry ({} when it reads all its pairs)."""
    return {} if corpus.max_pairs is None else {"max_pairs": corpus.max_pairs}


def _languages(corpus: Corpus, prefixes: dict[str, tuple[int, ...]]) -> dict:
    """A multilingual corpus' languages for its manifest entry ({} for a bilingual model's)."""
    return {"src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang} if prefixes[corpus.name] else {}


def _prefixes(config: Config, sets: list[Corpus], src_tok) -> dict[str, tuple[int, ...]]:
    """Each corpus' or validation set's source prefix, by name: the tag of its target
    language for a multilingual model (``attnmt.languages``), else ().

    Raises:
        ConfigError: a multilingual model's corpus without a target language, or one the
            model does not know.
    """
    if not config.tokenizer.target_languages:
        return {c.name: () for c in sets}
    out = {}
    for c in sets:
        if c.tgt_lang is None:
            raise ConfigError(f"{c.src}: a multilingual model needs the target language of every corpus and "
                              "validation set (tgt_lang, or data.valid entries)")
        out[c.name] = tuple(languages.source_prefix(config, src_tok, c.tgt_lang))
    return out


def fingerprint(manifest: dict) -> str:
    """SHA-256 of what determines the prepared pairs: the input files' contents, the filter
    settings, the tokenizer files and the token dtype (not the corpus weights, a sampling
    setting)."""
    inputs = [(c["src"]["sha256"], c["tgt"]["sha256"], *([c["max_pairs"]] if "max_pairs" in c else []))
              for c in manifest["train"]["corpora"]]  # a corpus' first max_pairs pairs, where it reads those
    valid = manifest.get("valid")
    key = {"inputs": inputs, "valid": valid and (valid["src"]["sha256"], valid["tgt"]["sha256"]),
           "filters": manifest["filters"], "tokenizers": manifest["tokenizers"], "dtype": manifest["token_dtype"]}
    if manifest.get("valid_sets"):  # multilingual: every set's files and every corpus' target language (its tag)
        key["valid_sets"] = [(v["name"], manifest[v["split"]]["src"]["sha256"], manifest[v["split"]]["tgt"]["sha256"])
                             for v in manifest["valid_sets"]]
        key["directions"] = [(c.get("src_lang"), c.get("tgt_lang")) for c in manifest["train"]["corpora"]]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def prepare(config: Config, output: str | Path, tokenizers: tuple | None = None, workers: int = 1,
            data_dir: str | None = None, shard_pairs: int = shards.SHARD_PAIRS, progress: bool = False,
            replace: bool = False, dtype: np.dtype | None = None) -> dict:
    """Prepare the training (and validation) corpora of ``config`` into ``output`` (module
    docstring); the directory appears complete or not at all.

    Args:
        tokenizers: (source, target) tokenizers to use instead of training new ones (the same
            object twice for a joint model): a fine-tuned model's or a resumed run's.
        workers: encoding processes (1: encode in this process).
        data_dir: local dataset directory (for ``data.dataset``).
        shard_pairs: pairs per shard at most.
        replace: replace an existing ``output``.
        dtype: token dtype; default :func:`attnmt.data.shards.token_dtype` of the vocabulary.
    Returns:
        The manifest (also ``output/manifest.json``).
    Raises:
        DataError: unreadable or misaligned files, no pair with both sides non-empty.
        ConfigError: no training pair left after filtering. WriteError: ``output`` exists or
            cannot be written.
    """
    t0, config = time.monotonic(), languages.resolve(config)
    d, multilingual = config.data, bool(config.tokenizer.target_languages)
    corpora, valid_sets = training_corpora(config, data_dir), validation_sets(config, data_dir)
    _check_readable([p for c in corpora + valid_sets for p in (c.src, c.tgt)])
    if tokenizers is None and multilingual:
        lines = sample_by_language(corpora, config.tokenizer.max_sentences, config.train.seed, workers)
        tokenizers = train_tokenizers(config, lines, [])
    elif tokenizers is None:
        tokenizers = train_tokenizers(config, *sample_lines(corpora, config.tokenizer.max_sentences,
                                                            config.train.seed, workers))
    prefixes = _prefixes(config, corpora + valid_sets, tokenizers[0])
    t_tokenizers = time.monotonic() - t0
    dtype = np.dtype(dtype or shards.token_dtype(max(len(tokenizers[0]), len(tokenizers[1]))))
    filters = Filters(d.max_len, d.filter.max_length_ratio, d.filter.copies, d.filter.dedup)
    with shards.staging_dir(output, replace) as staging:
        hashes = save_tokenizers(staging, *tokenizers)
        shard_list, entries, total = _write_training_split(staging, corpora, tokenizers, filters, dtype, workers,
                                                           shard_pairs, progress, prefixes)
        _check_kept(corpora, total)
        manifest = {"format": shards.FORMAT, "token_dtype": dtype.name, "tokenizers": hashes,
                    "filters": {"max_len": d.max_len, **d.filter.model_dump(mode="json"),
                                "valid_max_sentences": d.valid_max_sentences},
                    "config": {"data": d.model_dump(mode="json"), "tokenizer": config.tokenizer.model_dump(mode="json")},
                    "train": {"lines": total.lines, "pairs": total.pairs, "dropped": total.dropped,
                              "shards": shard_list, "corpora": entries},
                    "valid": None}
        several = multilingual or len(valid_sets) > 1
        for i, valid in enumerate(valid_sets):
            split = valid_split(i, several)
            manifest[split] = _write_validation_split(staging, split, valid, tokenizers, d.max_len,
                                                      d.valid_max_sentences, dtype, prefixes[valid.name])
            if several:
                manifest.setdefault("valid_sets", []).append(
                    {"name": valid.name, "split": split, "src_lang": valid.src_lang, "tgt_lang": valid.tgt_lang})
        manifest["fingerprint"] = fingerprint(manifest)
        manifest["seconds"] = round(time.monotonic() - t0, 3)
        manifest["seconds_tokenizers"] = round(t_tokenizers, 3)  # the sampling pass and training, if any
        shards.write_manifest(staging, manifest)
    log.info("prepared %d of %d pairs (dropped: %s) in %.1f s (tokenizers %.1f s, encoding %.0f pairs/s), into %s",
             total.pairs, total.lines, ", ".join(f"{n} {k}" for k, n in total.dropped.items() if n) or "none",
             manifest["seconds"], t_tokenizers, total.lines / max(manifest["seconds"] - t_tokenizers, 1e-9), output)
    return manifest


def _check_kept(corpora: list[Corpus], total: SplitStats) -> None:
    if total.dropped["empty"] == total.lines:
        _no_pair(corpora)
    if total.pairs == 0:
        raise ConfigError(f"{corpora[0].src}: no usable training pairs (dropped: {total.dropped})")


def _no_pair(corpora: list[Corpus]) -> None:
    names = " and ".join(f"{c.src} and {c.tgt}" for c in corpora)
    raise DataError(f"{names}: no training pair with both sides non-empty")
