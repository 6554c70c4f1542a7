"""Which text a configuration names: its training corpora and validation sets, each a pair of
files with a weight and languages (``attnmt.config``'s ``data`` section resolved to paths).

A corpus comes from a registered dataset (``data.dataset``, its ``data.pairs`` or ``data.pair``;
``attnmt.data.corpus``), from ``data.train``'s entries or from the single
``train_src``/``train_tgt`` pair; a path may name environment variables
(``$ATTNMT_DATA/multi30k/train.cs.gz``). :func:`file_record` is a file's fingerprint in the
manifest (``attnmt.data.manifest``).

Library: none beyond the standard library (hashing: ``attnmt.data.corpus``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from attnmt.config import Config
from attnmt.data.corpus import dataset_pair_files, sha256_file
from attnmt.data.manifest import FileRecord
from attnmt.errors import ConfigError, DataError


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
    d = config.data
    src_lang, tgt_lang = config.languages()
    limits = d.max_pairs or {}
    root = data_dir or d.data_dir
    if d.pairs is not None:
        corpora = []
        for pair in d.pairs:
            src, tgt = dataset_pair_files(d.dataset, pair, d.train_split, root)
            pair_src, pair_tgt = pair.split("-")
            corpora.append(Corpus(f"{d.dataset}.{d.train_split}.{pair}", src, tgt, 1.0, pair_src, pair_tgt,
                                  limits.get(pair)))
        return corpora
    if d.dataset is not None:
        src, tgt = dataset_pair_files(d.dataset, d.pair, d.train_split, root)
        return [Corpus(f"{d.dataset}.{d.train_split}", src, tgt, 1.0, src_lang, tgt_lang, limits.get(d.pair))]
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
    d = config.data
    src_lang, tgt_lang = config.languages()
    if d.dataset is not None and d.valid_split is not None:
        sets = []
        for pair in d.pairs or [d.pair]:
            src, tgt = dataset_pair_files(d.dataset, pair, d.valid_split, data_dir or d.data_dir)
            pair_src, pair_tgt = pair.split("-")
            sets.append(Corpus(pair, src, tgt, 1.0, pair_src, pair_tgt))
        return sets
    if d.valid is not None:
        return [Corpus(f"{e.src_lang}-{e.tgt_lang}", data_path(e.src), data_path(e.tgt), 1.0, e.src_lang,
                       e.tgt_lang) for e in d.valid]
    if d.valid_src is not None:
        name = "valid"
        if src_lang and tgt_lang:
            name = f"{src_lang}-{tgt_lang}"
        return [Corpus(name, data_path(d.valid_src), data_path(d.valid_tgt), 1.0, src_lang, tgt_lang)]
    return []


def valid_split(index: int, several: bool) -> str:
    """The shard split of validation set ``index``: 'valid' (a model's only set), else 'valid.N'
    (a multilingual model's sets, or several sets of one target language)."""
    return f"valid.{index}" if several else "valid"


def check_readable(paths: list[Path]) -> None:
    """Open each file once, before any long work.

    Raises:
        DataError: a missing or unreadable file (named).
    """
    for path in paths:
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            raise DataError(f"{path}: no such file") from None
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e.strerror}") from None


def file_record(path: Path) -> FileRecord:
    """Path, size, modification time and SHA-256 of an input file (the manifest's fingerprint)."""
    stat = path.stat()
    return FileRecord(str(path), stat.st_size, stat.st_mtime_ns, sha256_file(path))
