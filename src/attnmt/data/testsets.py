"""Named test sets of the dataset registry, as sacreBLEU's ``-t``: ``multi30k:test_2016_flickr``.

A test set is a split of a registered dataset (``attnmt.data.corpus.DATASETS``); its source and
reference files are those of one direction (``de-en``), read from the local copy (``--data-dir``
or ``ATTNMT_DATA``, trusted as it is) or downloaded once and checked against their SHA-256.
The direction is the model's own where it has one source and one target language; a model of
several takes it from ``--src-lang`` and ``--tgt-lang``.
"""

from __future__ import annotations

from pathlib import Path

from attnmt.config.language_codes import canonical_pair, known_as
from attnmt.data.corpus import DATASETS, dataset_pair_files
from attnmt.languages import spelling
from attnmt.errors import DataError


def parse_testset(text: str) -> tuple[str, str]:
    """(dataset, split) of a test set's name ``DATASET:SPLIT``, as the registry spells them (the
    name is compared in any case: ``MULTI30K:Test_2016_Flickr``).

    Raises:
        DataError: not of that form, an unknown dataset, or a split the dataset lacks (the
            message names those it has).
    """
    name, colon, split = text.partition(":")
    if not colon or not name or not split:
        raise DataError(f"--testset {text!r}: expected DATASET:SPLIT, e.g. multi30k:test_2016_flickr")
    known = known_as(name, DATASETS)
    if known is None:
        raise DataError(f"--testset {text}: unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    spec = DATASETS[known]
    known_split = known_as(split, spec.splits)
    if known_split is None:
        raise DataError(f"--testset {text}: {known} has no set {split!r}; it has {', '.join(spec.splits)}")
    return known, known_split


def _language(side: str, known: list[str], given: str | None, option: str) -> str:
    """The model's one ``side`` language, or ``given`` (checked against ``known``)."""
    if given is not None:
        if not known:
            return given
        own = spelling(given, known)
        if own is None:
            raise DataError(f"{option} {given}: this model's {side} languages are {', '.join(known)}")
        return own
    if len(known) == 1:
        return known[0]
    if not known:
        raise DataError(f"this model's configuration names no {side} language: give {option} for --testset")
    raise DataError(f"this model has several {side} languages ({', '.join(known)}): choose one with {option} "
                    f"for --testset")


def direction(sources: list[str], targets: list[str], src_lang: str | None, tgt_lang: str | None) -> tuple[str, str]:
    """The (source, target) languages of a test set for a model reading ``sources`` and writing
    ``targets`` (``attnmt.languages.served_languages``; [] where unknown).

    Raises:
        DataError: a side of several languages (or none known) without its option, or an
            option naming a language the model does not have.
    """
    return _language("source", sources, src_lang, "--src-lang"), _language("target", targets, tgt_lang, "--tgt-lang")


def resolve_testset(text: str, src_lang: str, tgt_lang: str,
                    data_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(source file, reference file) of test set ``text`` (``DATASET:SPLIT``) in the direction
    ``src_lang``-``tgt_lang``, from the local copy or downloaded (``dataset_file``).

    Raises:
        DataError: see :func:`parse_testset`; a direction the dataset lacks (the message names
            those it has); a missing local file or a failed download.
    """
    name, split = parse_testset(text)
    pairs = DATASETS[name].pairs
    pair = known_as(f"{src_lang}-{tgt_lang}", pairs, canonical_pair)
    if pair is None:
        raise DataError(f"--testset {text}: {name} has no direction {src_lang}-{tgt_lang}; it has {', '.join(pairs)}")
    return dataset_pair_files(name, pair, split, data_dir)
