"""Whether a prepared directory still holds what a configuration names (``attnmt.data.prepare``).

A resumed run (``RUN_DIR/data``) and a run given ``data.prepared`` beside its text keys compare
the configuration with the directory's manifest before they read it. Only what determines the
prepared pairs is compared, each in the form both sides share, so that a resume of an unchanged
run is never refused:

- the files by content (size and modification time, else SHA-256), never by the path they were
  reached through (``$ATTNMT_DATA``, ``--data-dir``, a relative or a resolved path);
- the filter settings, a key the manifest lacks (written before that filter existed) counting as
  its default;
- each corpus' weight, ``max_pairs`` and, where a source carries a target-language tag (a
  multilingual model, ``attnmt.languages``) then or now, its languages. A bilingual or
  many-to-one model's corpora have no tag: their languages are labels, not data.

Library: none beyond the standard library (hashing: ``attnmt.data.corpus``).
"""

from __future__ import annotations

from pathlib import Path

from attnmt import languages
from attnmt.config import Config, FilterConfig
from attnmt.data.corpus import sha256_file
from attnmt.data.manifest import FileRecord, Manifest
from attnmt.data.sources import training_corpora, validation_sets


def changed_inputs(config: Config, manifest: Manifest, data_dir: str | None = None) -> str | None:
    """What differs between the text a configuration names (files, filter settings, weights,
    a multilingual model's languages) and what a prepared directory was made from, in a few
    words; None if nothing (module docstring).

    Args:
        config: the run's configuration (its target languages are resolved here, as
            ``prepare`` resolves them).
        manifest: the prepared directory's ``manifest.json``.
        data_dir: local dataset directory (for ``data.dataset``).
    Raises:
        ConfigError, DataError: see ``attnmt.languages.resolve`` and ``training_corpora``.
    """
    config = languages.resolve(config)
    corpora = training_corpora(config, data_dir)
    prepared = manifest.train.corpora
    if len(corpora) != len(prepared):
        return f"{len(prepared)} training corpora then, {len(corpora)} now"
    change = _changed_filters(config, manifest.filters)
    if change is not None:
        return change
    tagged = bool(config.tokenizer.target_languages) or any(entry.tagged for entry in prepared)
    for corpus, entry in zip(corpora, prepared):
        if corpus.weight != entry.weight:
            return f"{corpus.name} weight {entry.weight} -> {corpus.weight}"
        if corpus.max_pairs != entry.max_pairs:
            return f"{corpus.name} max_pairs {entry.max_pairs} -> {corpus.max_pairs}"
        if tagged and not (languages.same_language(corpus.src_lang, entry.src_lang)
                           and languages.same_language(corpus.tgt_lang, entry.tgt_lang)):
            return f"{corpus.name} languages {entry.src_lang}-{entry.tgt_lang} -> {corpus.src_lang}-{corpus.tgt_lang}"
        for path, record in ((corpus.src, entry.src), (corpus.tgt, entry.tgt)):
            if _file_changed(path, record):
                return f"{path}: content differs from the prepared {record.path}"
    valid = validation_sets(config, data_dir)
    splits = [v.split for v in manifest.valid_sets or []]
    if not splits and manifest.valid is not None:
        splits = ["valid"]
    if len(valid) != len(splits) or any(_file_changed(path, record) for v, split in zip(valid, splits)
                                        for path, record in ((v.src, manifest.split(split).src),
                                                             (v.tgt, manifest.split(split).tgt))):
        return "the validation files differ"
    return None


def _changed_filters(config: Config, then: dict) -> str | None:
    """The first filter setting (``data.max_len``, ``data.filter.*``, ``data.valid_max_sentences``)
    that differs from the manifest's ``filters``; a key the manifest lacks counts as its default."""
    d = config.data
    now = {"max_len": d.max_len, **d.filter.model_dump(mode="json"), "valid_max_sentences": d.valid_max_sentences}
    defaults = FilterConfig().model_dump(mode="json")
    for key, value in now.items():
        before = then.get(key, defaults.get(key))
        if before != value:
            section = "filter." * (key in FilterConfig.model_fields)
            return f"data.{section}{key} {before} -> {value}"
    return None


def _file_changed(path: Path, record: FileRecord) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return True
    if stat.st_size == record.bytes and stat.st_mtime_ns == record.mtime_ns:
        return False
    return stat.st_size != record.bytes or sha256_file(path) != record.sha256
