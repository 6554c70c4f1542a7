"""Preparing a corpus once: stream the text, train the tokenizers on a sample, filter, encode
in worker processes and write token shards (``attnmt.data.shards``).

``attnmt prepare CONFIG --output DATA_DIR`` and ``attnmt train`` (into ``RUN_DIR/data``, when
the configuration names text files) both call :func:`prepare`. The steps:

1. Every input file (plain or gzip) is checked to be readable before any long work.
2. Unless ready-made tokenizers are given (a fine-tuned model's, a resumed run's), one pass over
   each side of the training text fills a seeded reservoir (:class:`Reservoir`, Vitter's
   algorithm R) of at most ``tokenizer.max_sentences`` lines (with several workers the sides, or
   a multilingual model's languages, are read at once, in processes of their own), and the
   tokenizers are trained on its non-empty lines (``attnmt.data.sampling``,
   ``attnmt.data.tokenizer_training``). A side within that size is sampled whole and
   in order, so the tokenizers equal those trained on all of it. A bilingual model also learns
   where sentences start from the source sample (``attnmt.data.sentence_model``, for
   translating documents; ``tokenizer.sentence_splitter``), kept as a folder beside the
   tokenizers.
3. A second pass reads the pairs in chunks of whole lines, as bytes (``attnmt.data.text``:
   blocks of a mebibyte, cut with numpy, no Python object per line), taking each file's
   SHA-256 as it reads; ``workers`` processes decode, encode and filter the chunks (in order;
   ``attnmt.data.encoding``);
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
(``attnmt.data.sampling.sample_by_language``) with the tags reserved; every source starts with the tag of its
corpus' target language (counted in ``data.max_len``); and each direction's validation set is
a split of its own (``valid.0``, ``valid.1``, ... listed in the manifest's ``valid_sets``).

Which files a configuration names is ``attnmt.data.sources``'; the record written last is
``attnmt.data.manifest``'s :class:`~attnmt.data.manifest.Manifest`.

Library: numpy, tqdm (the progress bar).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from attnmt import languages
from attnmt.config import Config
from attnmt.data import sentence_model, shards
from attnmt.data.encoding import FILTERS, Chunk, Filters, HashSet64, decode_pairs, encode_chunk, encode_stream
from attnmt.data.manifest import CorpusEntry, FileRecord, Manifest, SplitRecord, TrainRecord, ValidSet
from attnmt.data.sampling import no_pair, sample_by_language, sample_lines
from attnmt.data.sources import Corpus, check_readable, file_record, training_corpora, valid_split, validation_sets
from attnmt.data.text import HashedReader, pair_chunks
from attnmt.data.tokenizer_training import save_tokenizers, train_tokenizers
from attnmt.errors import ConfigError
from attnmt.signals import stop_point

log = logging.getLogger(__name__)

CHUNK_PAIRS = 4000  # pairs per worker task


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
    chunk.src_len = chunk.src_len[new]
    chunk.tgt_len = chunk.tgt_len[new]
    chunk.kept = chunk.kept[new]
    return int((~new).sum())


def _write_training_split(staging: Path, corpora: list[Corpus], tokenizers, filters: Filters, dtype: np.dtype,
                          workers: int, shard_pairs: int, progress: bool, prefixes: dict[str, tuple[int, ...]]
                          ) -> TrainRecord:
    writer = shards.ShardWriter(staging, "train", dtype, shard_pairs)
    total = SplitStats()
    seen = HashSet64()
    entries = []
    t0 = time.monotonic()
    done = 0  # bytes of the corpora read whole
    size = sum(p.stat().st_size for c in corpora for p in (c.src, c.tgt))
    bar = tqdm(total=size, unit="B", unit_scale=True, dynamic_ncols=True, desc="prepare",
               disable=None if progress else True)  # bytes of the input files read: its ETA
    with bar:
        for corpus in corpora:
            stats = SplitStats()
            start = total.pairs
            readers = (HashedReader(corpus.src), HashedReader(corpus.tgt))
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
            entries.append(_corpus_entry(corpus, start, stats, readers, bool(prefixes[corpus.name])))
            log.info("%s: %d of %d pairs kept; dropped %s", corpus.name, stats.pairs, stats.lines,
                     ", ".join(f"{n} {k}" for k, n in stats.dropped.items() if n) or "none")
    return TrainRecord(total.lines, total.pairs, total.dropped, writer.close(), entries)


def _corpus_entry(corpus: Corpus, start: int, stats: SplitStats, readers: tuple[HashedReader, HashedReader],
                  tagged: bool) -> CorpusEntry:
    """A corpus' manifest entry: its languages only where its sources are tagged (a
    multilingual model); its files as read whole (their hashes taken while reading), else
    hashed again."""
    if corpus.max_pairs is None:
        src = FileRecord.from_dict(readers[0].record())
        tgt = FileRecord.from_dict(readers[1].record())
    else:
        src = file_record(readers[0].path)
        tgt = file_record(readers[1].path)
    entry = CorpusEntry(corpus.name, corpus.weight, start, stats.lines, stats.pairs, stats.dropped, src, tgt,
                        max_pairs=corpus.max_pairs)
    if tagged:
        entry.src_lang = corpus.src_lang
        entry.tgt_lang = corpus.tgt_lang
    return entry


def _write_validation_split(staging: Path, split: str, files: Corpus, tokenizers, max_len: int, limit: int | None,
                            dtype: np.dtype, prefix: tuple[int, ...]) -> SplitRecord:
    writer = shards.ShardWriter(staging, split, dtype)
    stats = SplitStats()
    refs = []
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
    return SplitRecord(writer.close(), stats.lines, stats.pairs, stats.dropped, file_record(files.src),
                       file_record(files.tgt))


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


def prepare(config: Config, output: str | Path, tokenizers: tuple | None = None, workers: int = 1,
            data_dir: str | None = None, shard_pairs: int = shards.SHARD_PAIRS, progress: bool = False,
            replace: bool = False, dtype: np.dtype | None = None) -> Manifest:
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
    t0 = time.monotonic()
    config = languages.resolve(config)
    d = config.data
    multilingual = bool(config.tokenizer.target_languages)
    corpora = training_corpora(config, data_dir)
    valid_sets = validation_sets(config, data_dir)
    check_readable([p for c in corpora + valid_sets for p in (c.src, c.tgt)])
    if tokenizers is None and multilingual:
        lines = sample_by_language(corpora, config.tokenizer.max_sentences, config.train.seed, workers)
        tokenizers = train_tokenizers(config, lines, [])
    learned = None
    if tokenizers is None and not multilingual:
        src_lines, tgt_lines = sample_lines(corpora, config.tokenizer.max_sentences, config.train.seed, workers)
        tokenizers = train_tokenizers(config, src_lines, tgt_lines)
        learned = _sentence_model(config, src_lines)
    prefixes = _prefixes(config, corpora + valid_sets, tokenizers[0])
    t_tokenizers = time.monotonic() - t0
    dtype = np.dtype(dtype or shards.token_dtype(max(len(tokenizers[0]), len(tokenizers[1]))))
    filters = Filters(d.max_len, d.filter.max_length_ratio, d.filter.copies, d.filter.dedup)
    with shards.staging_dir(output, replace) as staging:
        hashes = save_tokenizers(staging, *tokenizers)
        if learned is not None:
            sentence_model.save(learned, staging)
        train = _write_training_split(staging, corpora, tokenizers, filters, dtype, workers, shard_pairs, progress,
                                      prefixes)
        _check_kept(corpora, train)
        manifest = Manifest(dtype.name, hashes,
                            {"max_len": d.max_len, **d.filter.model_dump(mode="json"),
                             "valid_max_sentences": d.valid_max_sentences},
                            {"data": d.model_dump(mode="json"), "tokenizer": config.tokenizer.model_dump(mode="json")},
                            train)
        several = multilingual or len(valid_sets) > 1
        for i, valid in enumerate(valid_sets):
            split = valid_split(i, several)
            record = _write_validation_split(staging, split, valid, tokenizers, d.max_len, d.valid_max_sentences,
                                             dtype, prefixes[valid.name])
            if not several:
                manifest.valid = record
                continue
            manifest.splits[split] = record
            if manifest.valid_sets is None:
                manifest.valid_sets = []
            manifest.valid_sets.append(ValidSet(valid.name, split, valid.src_lang, valid.tgt_lang))
        manifest.fingerprint = manifest.compute_fingerprint()
        manifest.seconds = round(time.monotonic() - t0, 3)
        manifest.seconds_tokenizers = round(t_tokenizers, 3)  # the sampling pass and training, if any
        manifest.save(staging)
    log.info("prepared %d of %d pairs (dropped: %s) in %.1f s (tokenizers %.1f s, encoding %.0f pairs/s), into %s",
             train.pairs, train.lines, ", ".join(f"{n} {k}" for k, n in train.dropped.items() if n) or "none",
             manifest.seconds, t_tokenizers, train.lines / max(manifest.seconds - t_tokenizers, 1e-9), output)
    return manifest


def _sentence_model(config: Config, src_lines: list[str]):
    """The sentence splitter learned from the source sample (``attnmt.data.sentence_model``), or
    None: ``tokenizer.sentence_splitter`` rules, or spaCy not installed (said in the log)."""
    if config.tokenizer.sentence_splitter != "learned":
        return None
    if not sentence_model.available():
        log.info("sentence splitter: rules only (spaCy, of the documents extra, is not installed)")
        return None
    t0 = time.monotonic()
    learned = sentence_model.train(src_lines, config.languages()[0], config.train.seed)
    log.info("learned where sentences start from %d source lines in %.1f s (for documents)",
             min(len(src_lines), sentence_model.MAX_LINES), time.monotonic() - t0)
    return learned


def _check_kept(corpora: list[Corpus], train: TrainRecord) -> None:
    if train.dropped["empty"] == train.lines:
        no_pair(corpora)
    if train.pairs == 0:
        raise ConfigError(f"{corpora[0].src}: no usable training pairs (dropped: {train.dropped})")
