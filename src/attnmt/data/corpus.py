"""The dataset registry, and encoding a parallel corpus held in memory.

Reading the text files is ``attnmt.data.text``'s. The registry knows where the
Multi30k task-1 files live (github.com/multi30k/dataset, data/task1/raw/, or a mirror named by
``ATTNMT_MULTI30K_URL``) and their SHA-256, and reads them from a local directory when one is
given (``--data-dir`` or ``ATTNMT_DATA``): that directory holds a ``multi30k/`` folder with
``train.de.gz`` and so on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from attnmt import environment
from attnmt.config.language_codes import canonical_language, canonical_pair, known_as
from attnmt.errors import DataError

DATA_ENV = environment.DATA.name


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: file layout, download location and checksums."""

    name: str
    url: str  # base URL; a file is url + filename
    pairs: tuple[str, ...]
    splits: tuple[str, ...]
    sha256: dict[str, str]  # filename -> hex digest
    url_env: str | None = None  # environment variable naming a mirror's base URL instead of url

    def filename(self, split: str, lang: str) -> str:
        return f"{split}.{lang}.gz"


# Checksums of the files in github.com/multi30k/dataset at data/task1/raw/ (computed from copies).
MULTI30K = DatasetSpec(
    name="multi30k",
    url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
    pairs=("de-en", "en-de", "en-fr", "fr-en", "en-cs", "cs-en"),
    splits=("train", "val", "test_2016_flickr"),
    url_env="ATTNMT_MULTI30K_URL",
    sha256={
        "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
        "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
        "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
        "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
        "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
        "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
        "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
        "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
        "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
        "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
        "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
        "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    },
)

DATASETS: dict[str, DatasetSpec] = {MULTI30K.name: MULTI30K}


def dataset_spec(name: str) -> DatasetSpec:
    """The registered dataset ``name`` names, in any case ('MULTI30K').

    Raises:
        DataError: no registered dataset has that name (the message names those there are).
    """
    known = known_as(name, DATASETS)
    if known is None:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[known]


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_url(spec: DatasetSpec) -> str:
    """The base URL of a dataset's files: ``$<spec.url_env>`` (a mirror, with or without its
    final slash) where set, else the upstream ``spec.url``."""
    mirror = environment.url(environment.VARIABLES[spec.url_env]) if spec.url_env else None
    if not mirror:
        return spec.url
    return mirror if mirror.endswith("/") else mirror + "/"


def cache_dir(name: str) -> Path:
    """Where downloaded files of dataset ``name`` are kept: ``$XDG_CACHE_HOME/attnmt/<name>/``,
    else ``~/.cache/attnmt/<name>/``."""
    return environment.cache_home() / "attnmt" / name


def dataset_file(name: str, split: str, lang: str, data_dir: str | Path | None = None) -> Path:
    """Path of one file of a registered dataset, downloading it if no local copy is given.

    The local directory is ``data_dir``, else ``$ATTNMT_DATA``; it holds ``<name>/<split>.<lang>.gz``
    (a directory that is itself the dataset folder works too). Without either, the file is
    downloaded once into :func:`cache_dir` from :func:`base_url` and its SHA-256 checked
    (``attnmt.data.download.fetch``); a local copy is trusted as it is.

    Raises:
        DataError: unknown dataset, split or language; the file is missing from the local
            directory; the download fails or its checksum differs.
    """
    spec = dataset_spec(name)
    name = spec.name
    known_split = known_as(split, spec.splits)
    if known_split is None:
        raise DataError(f"dataset {name!r} has no split {split!r}; known: {', '.join(spec.splits)}")
    langs = sorted({code for pair in spec.pairs for code in pair.split("-")})
    known_lang = known_as(lang, langs, canonical_language)
    if known_lang is None:
        raise DataError(f"dataset {name!r} has no language {lang!r}; known: {', '.join(langs)}")
    filename = spec.filename(known_split, known_lang)
    root = data_dir if data_dir is not None else environment.path(environment.DATA)
    if root:
        root = Path(root)
        for candidate in (root / name / filename, root / filename):
            if candidate.is_file():
                return candidate
        raise DataError(f"{root / name / filename}: no such file (local data directory {root})")
    cached = cache_dir(name) / filename
    if not cached.is_file():
        from attnmt.data.download import fetch  # here: urllib's import would slow every command's start

        fetch(base_url(spec) + filename, cached, spec.sha256[filename])
    return cached


def dataset_pair_files(
    name: str, pair: str, split: str, data_dir: str | Path | None = None
) -> tuple[Path, Path]:
    """(source file, target file) of a registered dataset's ``pair`` such as ``de-en``.

    Raises:
        DataError: an unknown pair, or see :func:`dataset_file`.
    """
    spec = dataset_spec(name)
    known = known_as(pair, spec.pairs, canonical_pair)
    if known is None:
        raise DataError(f"dataset {spec.name!r} has no pair {pair!r}; known: {', '.join(spec.pairs)}")
    src_lang, tgt_lang = known.split("-")
    return dataset_file(name, split, src_lang, data_dir), dataset_file(name, split, tgt_lang, data_dir)


@dataclass
class EncodedCorpus:
    """Subword ids of the kept pairs, and how many pairs were dropped and why."""

    src: list[list[int]]
    tgt: list[list[int]]
    dropped_empty: int = 0
    dropped_long: int = 0

    def lengths(self) -> list[tuple[int, int]]:
        """(source, target) lengths with the EOS/BOS each side gets."""
        return [(len(s) + 1, len(t) + 1) for s, t in zip(self.src, self.tgt)]


def encode_corpus(src_lines: list[str], tgt_lines: list[str], encode_src, encode_tgt,
                  max_len: int | None = None) -> EncodedCorpus:
    """Encode line pairs with ``encode_src``/``encode_tgt`` (list[str] -> list[list[int]]).

    Pairs with an empty side are dropped, and with ``max_len`` pairs where a side has more than
    ``max_len`` subwords; the counts are in the result (the trainer logs them).
    """
    keep = [i for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if s and t]
    src_ids = encode_src([src_lines[i] for i in keep])
    tgt_ids = encode_tgt([tgt_lines[i] for i in keep])
    out = EncodedCorpus([], [], dropped_empty=len(src_lines) - len(keep))
    for s, t in zip(src_ids, tgt_ids):
        if max_len is not None and (len(s) > max_len or len(t) > max_len):
            out.dropped_long += 1
            continue
        out.src.append(s)
        out.tgt.append(t)
    return out
