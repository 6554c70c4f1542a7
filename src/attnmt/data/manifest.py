"""The manifest of a prepared directory (``DATA_DIR/manifest.json``): what was prepared, from
what, and how, as dataclasses read through their attributes.

``attnmt prepare`` builds a :class:`Manifest` and saves it (:meth:`Manifest.save`, atomically);
a training run, a resume and the staleness check (``attnmt.data.staleness``) load it
(:meth:`Manifest.load`). The JSON layout, with its keys in this order::

    format, token_dtype, tokenizers      shard format, token dtype, tokenizer file -> SHA-256
    filters, config                      the filter settings, the data and tokenizer sections
    train                                lines, pairs, dropped, shards, corpora (CorpusEntry)
    valid                                a model's only validation split (SplitRecord), or null
    valid.0, valid_sets, valid.1, ...    several validation splits and their list (ValidSet)
    fingerprint, seconds, seconds_tokenizers

Library: json; the write is ``attnmt.atomic.atomic_write``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from attnmt import ranges
from attnmt.atomic import atomic_write
from attnmt.errors import DataError

FORMAT = "attnmt-prepared-1"  # the on-disk layout of a prepared directory (attnmt.data.shards)
MANIFEST = "manifest.json"
TOKEN_DTYPES = ("uint16", "uint32")  # attnmt.data.shards.token_dtype's
# the fields of a shard's record (attnmt.data.shards.ShardWriter) that are read back, checked when a
# manifest is read (its token counts are written for the reader's information only)
SHARD_FIELDS = {"name": str, "pairs": ranges.COUNT}


@dataclass
class FileRecord:
    """An input file as it was read: path, size in bytes, modification time (ns), SHA-256."""

    path: str
    bytes: int
    mtime_ns: int = field(metadata={"range": ranges.TIME_NS})
    sha256: str

    @classmethod
    def from_dict(cls, d: dict) -> FileRecord:
        return cls(d["path"], d["bytes"], d["mtime_ns"], d["sha256"])

    def to_dict(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "mtime_ns": self.mtime_ns, "sha256": self.sha256}


@dataclass
class CorpusEntry:
    """One training corpus in the train split: its pairs are ``start`` .. ``start + pairs - 1``.

    Attributes:
        lines: pairs read; pairs: pairs kept; dropped: pairs dropped by each filter.
        src_lang, tgt_lang: the languages of a corpus whose sources carry a target-language
            tag (a multilingual model; written only then), else None.
        max_pairs: the pairs it reads from the start of its files (None: all; then not written).
    """

    name: str
    weight: float = field(metadata={"range": ranges.CORPUS_WEIGHT})
    start: int
    lines: int
    pairs: int
    dropped: dict[str, int]
    src: FileRecord
    tgt: FileRecord
    src_lang: str | None = None
    tgt_lang: str | None = None
    max_pairs: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> CorpusEntry:
        return cls(d["name"], d["weight"], d["start"], d["lines"], d["pairs"], d["dropped"],
                   FileRecord.from_dict(d["src"]), FileRecord.from_dict(d["tgt"]), d.get("src_lang"),
                   d.get("tgt_lang"), d.get("max_pairs"))

    @property
    def tagged(self) -> bool:
        """Whether its sources carry a target-language tag (``attnmt.languages``)."""
        return self.tgt_lang is not None

    def to_dict(self) -> dict:
        out = {"name": self.name, "weight": self.weight, "start": self.start, "lines": self.lines,
               "pairs": self.pairs, "dropped": self.dropped, "src": self.src.to_dict(), "tgt": self.tgt.to_dict()}
        if self.tagged:
            out["src_lang"] = self.src_lang
            out["tgt_lang"] = self.tgt_lang
        if self.max_pairs is not None:
            out["max_pairs"] = self.max_pairs
        return out


@dataclass
class TrainRecord:
    """The train split: pairs read (``lines``) and kept, drops by filter, its shards
    (``attnmt.data.shards.ShardWriter.close``'s records) and its corpora in order."""

    lines: int
    pairs: int
    dropped: dict[str, int]
    shards: list[dict] = field(metadata={"items": SHARD_FIELDS})
    corpora: list[CorpusEntry]

    @classmethod
    def from_dict(cls, d: dict) -> TrainRecord:
        return cls(d["lines"], d["pairs"], d["dropped"], d["shards"], [CorpusEntry.from_dict(c) for c in d["corpora"]])

    def to_dict(self) -> dict:
        return {"lines": self.lines, "pairs": self.pairs, "dropped": self.dropped, "shards": self.shards,
                "corpora": [c.to_dict() for c in self.corpora]}


@dataclass
class SplitRecord:
    """A validation split: its shards, pairs read and kept, drops by filter and its two files."""

    shards: list[dict] = field(metadata={"items": SHARD_FIELDS})
    lines: int
    pairs: int
    dropped: dict[str, int]
    src: FileRecord
    tgt: FileRecord

    @classmethod
    def from_dict(cls, d: dict) -> SplitRecord:
        return cls(d["shards"], d["lines"], d["pairs"], d["dropped"], FileRecord.from_dict(d["src"]),
                   FileRecord.from_dict(d["tgt"]))

    def to_dict(self) -> dict:
        return {"shards": self.shards, "lines": self.lines, "pairs": self.pairs, "dropped": self.dropped,
                "src": self.src.to_dict(), "tgt": self.tgt.to_dict()}


@dataclass
class ValidSet:
    """One of several validation sets: its name (a direction, 'de-en'), split and languages."""

    name: str
    split: str
    src_lang: str | None
    tgt_lang: str | None

    def to_dict(self) -> dict:
        return {"name": self.name, "split": self.split, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang}


@dataclass
class Manifest:
    """A prepared directory's record (module docstring).

    Attributes:
        valid: the only validation split ('valid'), or None (none, or several).
        splits: the several validation splits by name ('valid.0', ...), in order.
        valid_sets: the several validation sets, or None where there are not several.
        seconds: wall time of the preparation; seconds_tokenizers: of its sampling pass and
            tokenizer training (None in a manifest that lacks them).
    """

    token_dtype: str
    tokenizers: dict[str, str]
    filters: dict
    config: dict
    train: TrainRecord
    valid: SplitRecord | None = None
    splits: dict[str, SplitRecord] = field(default_factory=dict)
    valid_sets: list[ValidSet] | None = None
    fingerprint: str = ""
    seconds: float | None = None
    seconds_tokenizers: float | None = None
    format: str = FORMAT

    def split(self, name: str) -> TrainRecord | SplitRecord:
        """The record of split ``name`` ('train', 'valid', 'valid.N').

        Raises:
            DataError: the manifest has no such split.
        """
        if name == "train":
            return self.train
        record = self.splits.get(name)
        if name == "valid":
            record = self.valid
        if record is None:
            raise DataError(f"{MANIFEST}: no split {name!r}")
        return record

    def to_dict(self) -> dict:
        """The JSON object, its keys in the order of the module docstring."""
        out = {"format": self.format, "token_dtype": self.token_dtype, "tokenizers": self.tokenizers,
               "filters": self.filters, "config": self.config, "train": self.train.to_dict(),
               "valid": None if self.valid is None else self.valid.to_dict()}
        for index, (name, record) in enumerate(self.splits.items()):
            out[name] = record.to_dict()
            if index == 0 and self.valid_sets is not None:  # written after the first split's record
                out["valid_sets"] = [v.to_dict() for v in self.valid_sets]
        out["fingerprint"] = self.fingerprint
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.seconds_tokenizers is not None:
            out["seconds_tokenizers"] = self.seconds_tokenizers
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        """Raises: KeyError, TypeError, AttributeError: a key missing or of the wrong kind."""
        splits = {k: SplitRecord.from_dict(v) for k, v in d.items() if k.startswith("valid.")}
        sets = d.get("valid_sets")
        return cls(d["token_dtype"], d["tokenizers"], d["filters"], d["config"], TrainRecord.from_dict(d["train"]),
                   None if d.get("valid") is None else SplitRecord.from_dict(d["valid"]), splits,
                   None if sets is None else [ValidSet(v["name"], v["split"], v.get("src_lang"), v.get("tgt_lang"))
                                              for v in sets],
                   d["fingerprint"], d.get("seconds"), d.get("seconds_tokenizers"), d["format"])

    def save(self, directory: str | Path) -> None:
        """Write ``directory/manifest.json`` atomically (``attnmt.atomic.atomic_write``: a temporary
        file, fsynced and renamed onto it).

        Raises:
            WriteError: it cannot be written (named).
        """
        path = Path(directory) / MANIFEST
        text = json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """The manifest of a prepared directory.

        Raises:
            DataError: no manifest (not a prepared directory, or an unfinished one), or not ours.
        """
        path = Path(directory) / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"{path}: missing; is {directory} a directory written by 'attnmt prepare'?") from None
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: unreadable: {e}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DataError(f"{path}: not a manifest of format {FORMAT}")
        try:
            manifest = cls.from_dict(data)
        except (KeyError, TypeError, AttributeError) as e:
            raise DataError(f"{path}: not a manifest of format {FORMAT} (missing or malformed {e})") from None
        try:
            ranges.check_record(manifest, "")
            if manifest.token_dtype not in TOKEN_DTYPES:
                raise ValueError(f"token_dtype {manifest.token_dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
        except ValueError as e:
            raise DataError(f"{path}: {e}; prepare the directory again ('attnmt prepare')") from None
        return manifest

    def compute_fingerprint(self) -> str:
        """SHA-256 of what determines the prepared pairs: the input files' contents (a corpus'
        first ``max_pairs`` pairs, where it reads those), the filter settings, the tokenizer files
        and the token dtype (not the corpus weights, a sampling setting); for several validation
        sets, every set's files and every corpus' languages (a multilingual model's tags)."""
        inputs = []
        for c in self.train.corpora:
            limit = [] if c.max_pairs is None else [c.max_pairs]
            inputs.append((c.src.sha256, c.tgt.sha256, *limit))
        valid = None
        if self.valid is not None:
            valid = (self.valid.src.sha256, self.valid.tgt.sha256)
        key = {"inputs": inputs, "valid": valid, "filters": self.filters, "tokenizers": self.tokenizers,
               "dtype": self.token_dtype}
        if self.valid_sets:
            key["valid_sets"] = [(v.name, self.split(v.split).src.sha256, self.split(v.split).tgt.sha256)
                                 for v in self.valid_sets]
            key["directions"] = [(c.src_lang, c.tgt_lang) for c in self.train.corpora]
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
