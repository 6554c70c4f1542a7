"""The data a run trains on: a prepared directory, opened on every process, and each epoch's
batches.

With ``data.prepared: DATA_DIR`` a run reads that directory (made by ``attnmt prepare``) and no
text; text keys beside it must name what it was prepared from. Otherwise rank 0 prepares the
configured text into ``RUN_DIR/data`` first (``attnmt.data.prepare``), so a restart or a resume
never tokenises again; on a resume it checks that the text, the filters and the weights are
still those the directory was made from. The other processes wait for rank 0 without a
practical time limit (``distributed.broadcast_data``: preparing a large corpus takes hours).
Every process then reads the same directory (``attnmt.data.shards``); a process that
cannot see rank 0's directory (another machine, text configuration) prepares its own copy with
rank 0's tokenizers, which is the same, since preparation is deterministic. Before the first
update every process checks that all read the same data (:func:`check_same_data`: fingerprint,
shard count, pair count).

Each epoch's batches are planned from the shards' lengths (:func:`epoch_share`), and a
process keeps only its share of them. The run's checkpoint stores :func:`signature`: the
manifest's fingerprint, the corpus weights, the batching settings and the batch planner. A
resume whose signature differs stops with a one-line :class:`~attnmt.errors.ConfigError`
naming what changed, unless ``allow_change`` (``attnmt train --resume --allow-data-change``)
says to go on with the new data or settings, at the saved epoch and batch position.

Library: torch.distributed (through ``attnmt.train.distributed``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnmt import rundir
from attnmt.config import Config
from attnmt.data import sentence_model, shards
from attnmt.data.corpus import EncodedCorpus
from attnmt.data.manifest import MANIFEST, CorpusEntry, Manifest
from attnmt.data.plan import GENERATOR, Buckets, Share, epoch_plan, epoch_size, sample_pairs
from attnmt.data.prepare import prepare
from attnmt.data.sources import names_text, training_corpora
from attnmt.data.staleness import changed_inputs
from attnmt.data.tokenizers import Tokenizer, WordTokenizer
from attnmt.errors import ConfigError, DataError
from attnmt.languages import temperature_weights
from attnmt.train import distributed

log = logging.getLogger(__name__)

RUN_DATA = "data"  # RUN_DIR/data: where a run prepares its text
SMALL_INPUT_BYTES = 16 << 20  # inputs below this are encoded in-process (a worker pool costs more)


@dataclass
class ValidSet:
    """One validation set: its name (a multilingual model's direction, 'de-en'; else the
    direction or 'valid'), its encoded pairs (sources with their language tag, if any) and
    the raw target lines of the kept pairs (the references of BLEU)."""

    name: str
    pairs: EncodedCorpus
    refs: list[str]


@dataclass
class CorpusData:
    """The prepared training pairs (read where needed), the validation sets and the tokenizers."""

    src_tok: Tokenizer | WordTokenizer
    tgt_tok: Tokenizer | WordTokenizer
    train: shards.ShardedCorpus
    valid_sets: list[ValidSet] = field(default_factory=list)  # one per direction of a multilingual model
    manifest: Manifest | None = None
    directory: Path | None = None


def open_training_data(config: Config, run_dir: Path, resume: bool, data_dir: str | None = None,
                       ranks: distributed.Ranks = distributed.Ranks(), allow_change: bool = False,
                       progress: bool = False) -> CorpusData:
    """The run's data on this process (module docstring); rank 0 prepares text if needed and
    writes the tokenizers into a new run's directory. The other processes wait for it as long
    as it takes (``distributed.broadcast_data``), then every process checks that all read the
    same data (:func:`check_same_data`) before the first update.

    Raises:
        DataError: unreadable corpus or prepared directory, or processes reading different
            data. ConfigError: no usable pair, or (resume) the text changed since the run's data
            was prepared, without ``allow_change``.
    """
    found = None
    if ranks.is_main:
        directory = _main_directory(config, run_dir, resume, data_dir, allow_change, progress)
        src_tok, tgt_tok = rundir.read_tokenizers(directory)
        manifest = Manifest.load(directory)
        found = (str(directory.resolve()), manifest.fingerprint, _protos(src_tok, tgt_tok, ranks))
    found = distributed.broadcast_data(found)
    if not ranks.is_main:
        directory = _rank_directory(config, found, data_dir, ranks)
        src_tok, tgt_tok = rundir.read_tokenizers(directory)
        manifest = Manifest.load(directory)
    data = _open(directory, manifest, src_tok, tgt_tok)
    check_same_data(distributed.gather_data(_what_is_read(data)))
    return data


def _main_directory(config: Config, run_dir: Path, resume: bool, data_dir: str | None, allow_change: bool,
                    progress: bool) -> Path:
    """Rank 0: the prepared directory to read, preparing ``RUN_DIR/data`` when needed."""
    if config.data.prepared is not None:
        directory = Path(config.data.prepared)
        manifest = Manifest.load(directory)  # a clear error for a wrong path
        _check_prepared_from(config, directory, manifest, data_dir)
        if config.train.init_from and not resume:
            _check_same_tokenizers(directory, manifest, Path(config.train.init_from))
        return directory
    directory = run_dir / RUN_DATA
    tokenizers, replace = None, False
    for stale in run_dir.glob(f".{RUN_DATA}.*.tmp"):  # left by a process killed while preparing
        shutil.rmtree(stale, ignore_errors=True)
    if (directory / MANIFEST).is_file():  # a resume, or a start killed before its first checkpoint
        change = changed_inputs(config, Manifest.load(directory), data_dir)
        if change is None:
            return directory
        if resume and not allow_change:
            raise ConfigError(f"{directory}: the training data changed since this run prepared it ({change}); "
                              "pass --allow-data-change to continue on the new data")
        log.warning("%s: the training data changed (%s): preparing it again", directory, change)
        replace = True
    if resume:
        tokenizers = rundir.read_tokenizers(run_dir)
    elif config.train.init_from:  # fine-tuning: the starting model's tokenizers
        tokenizers = rundir.read_tokenizers(config.train.init_from)
    prepare(config, directory, tokenizers, workers=_workers(config, data_dir), data_dir=data_dir,
            progress=progress, replace=replace)
    return directory


def _check_prepared_from(config: Config, directory: Path, manifest: Manifest, data_dir: str | None) -> None:
    """``data.prepared`` beside text keys (``attnmt train CONFIG --set data.prepared=DIR`` with
    the configuration DIR was prepared with): the text files, filters and weights must be those
    of DIR's manifest (its files' sizes and modification times, else their SHA-256).

    Raises:
        ConfigError: they differ (one line naming the first difference).
    """
    if not names_text(config):
        return
    change = changed_inputs(config, manifest, data_dir)
    if change is not None:
        raise ConfigError(f"{directory} was not prepared from the data this configuration names ({change}); "
                          "prepare it again, or give data.prepared without the text keys")


def _check_same_tokenizers(directory: Path, manifest: Manifest, model_dir: Path) -> None:
    """Fine-tuning from a prepared directory: its tokenizer files must be the starting model's.

    Raises:
        ConfigError: they differ (or one side has files the other lacks).
    """
    theirs = {name: shards.sha256_file(model_dir / name) for name in manifest.tokenizers
              if (model_dir / name).is_file()}
    if theirs != manifest.tokenizers:
        raise ConfigError(f"{directory} was prepared with other tokenizers than {model_dir}'s; prepare it with "
                          f"'attnmt prepare CONFIG --output DIR --tokenizers-from {model_dir}'")


def _workers(config: Config, data_dir: str | None) -> int:
    size = sum(p.stat().st_size for c in training_corpora(config, data_dir) for p in (c.src, c.tgt) if p.is_file())
    return 1 if size < SMALL_INPUT_BYTES else max(1, os.cpu_count() or 1)


def _protos(src_tok, tgt_tok, ranks: distributed.Ranks) -> tuple | None:
    """SentencePiece models for processes that must prepare their own copy of the text."""
    if not ranks.distributed or not all(type(t) is Tokenizer for t in (src_tok, tgt_tok)):
        return None
    return src_tok.model_proto, None if tgt_tok is src_tok else tgt_tok.model_proto


def _rank_directory(config: Config, found: tuple, data_dir: str | None, ranks: distributed.Ranks) -> Path:
    """A process other than rank 0: rank 0's directory if this machine sees it (the same
    fingerprint), else its own preparation of the text in the temporary directory
    (``TMPDIR``), ``attnmt-rank{rank}-{fingerprint}/data``, kept for a restart."""
    path, fingerprint, protos = found
    if config.data.prepared is not None:  # a copy on this machine; check_same_data compares it with rank 0's
        if not (Path(path) / MANIFEST).is_file():
            raise DataError(f"{path}: no such prepared directory on the machine of rank {ranks.rank}; copy it there")
        return Path(path)
    if (Path(path) / MANIFEST).is_file() and Manifest.load(path).fingerprint == fingerprint:
        return Path(path)
    if protos is None:
        raise ConfigError("word-level or MarianMT vocabularies under torchrun need a prepared directory on every "
                          "machine (attnmt prepare, then data.prepared)")
    src_tok = Tokenizer(protos[0])
    tgt_tok = src_tok if protos[1] is None else Tokenizer(protos[1])
    # one place per rank and data, so that a restart (torchrun's --max-restarts) finds its copy
    directory = Path(tempfile.gettempdir()) / f"attnmt-rank{ranks.rank}-{fingerprint[:16]}" / RUN_DATA
    if (directory / MANIFEST).is_file() and Manifest.load(directory).fingerprint == fingerprint:
        return directory
    log.warning("rank %d: %s is not on this machine; preparing a private copy in %s", ranks.rank, path, directory)
    prepare(config, directory, (src_tok, tgt_tok), data_dir=data_dir, replace=True)
    return directory


def _what_is_read(data: CorpusData) -> dict:
    """What a process says of the training data it has opened, for :func:`check_same_data`."""
    return {"directory": str(data.directory), "fingerprint": data.manifest.fingerprint,
            "shards": len(data.manifest.train.shards), "pairs": len(data.train)}


def check_same_data(found: list[dict]) -> None:
    """Every process must read the data rank 0 reads (``found``: what each said, in rank
    order): the same fingerprint, shard count and pair count. Each process runs the check on
    the same list, so all stop together.

    Raises:
        DataError: one line naming the first rank and field that differ.
    """
    for rank, theirs in enumerate(found[1:], start=1):
        for key in ("fingerprint", "shards", "pairs"):
            if theirs[key] != found[0][key]:
                raise DataError(f"rank {rank} reads other training data than rank 0: {key} {_short(theirs[key])} "
                                f"in {theirs['directory']}, {_short(found[0][key])} in rank 0's "
                                f"{found[0]['directory']}")


def _open(directory: Path, manifest: Manifest, src_tok, tgt_tok) -> CorpusData:
    train = shards.ShardedCorpus(directory, "train", manifest)
    data = CorpusData(src_tok, tgt_tok, train, manifest=manifest, directory=directory)
    log.info("training data %s: %d pairs in %d shard(s) (%s tokens; dropped when prepared: %s)", directory,
             len(train), len(manifest.train.shards), manifest.token_dtype,
             ", ".join(f"{n} {k}" for k, n in train.dropped.items() if n) or "none")
    named = [(v.name, v.split) for v in manifest.valid_sets or []]
    if not named and manifest.valid is not None:
        named = [("valid", "valid")]
    for name, split in named:
        valid = shards.ShardedCorpus(directory, split, manifest)
        src, tgt = valid.pairs(range(len(valid)))
        pairs = EncodedCorpus([s.tolist() for s in src], [t.tolist() for t in tgt],
                              dropped_empty=valid.dropped["empty"], dropped_long=valid.dropped["too_long"])
        text = (directory / shards.refs_file(split)).read_text(encoding="utf-8")
        data.valid_sets.append(ValidSet(name, pairs, text.split("\n")[:-1] if text else []))
    return data


def write_run_tokenizers(config: Config, data: CorpusData, run_dir: Path) -> None:
    """Copy a new run's tokenizer files and learned sentence splitter (where there is one) into
    its directory, byte for byte: the starting model's when fine-tuning (``train.init_from``),
    else the prepared directory's."""
    rundir.copy_tokenizers(config.train.init_from or data.directory, run_dir)
    sentence_model.copy(config.train.init_from or data.directory, run_dir)


def buckets(corpus: shards.ShardedCorpus) -> Buckets:
    """The length buckets of a prepared split, from its length files (specials added:
    source + EOS, BOS + target)."""
    return Buckets.from_chunks(lambda: ((src + 1, tgt + 1) for src, tgt in corpus.length_chunks()))


def epoch_share(config: Config, data: CorpusData, epoch: int, ranks: distributed.Ranks, start: int = 0) -> Share:
    """This process's batches of ``epoch`` from the epoch's batch ``start`` on: the epoch's
    plan (``attnmt.data.plan``, from the lengths alone, the same on every process), of which
    the process keeps its share; the rest is freed on return."""
    tc = config.train
    plan = epoch_plan(buckets(data.train), sampled_corpora(config, data), tc.batch_tokens, tc.batch_sentences,
                      tc.seed, epoch)
    return plan.share(ranks.rank, ranks.world_size, start)


def epoch_length(config: Config, data: CorpusData, epoch: int) -> int:
    """The number of batches of ``epoch`` (all processes), without planning it."""
    tc = config.train
    return epoch_size(buckets(data.train), sampled_corpora(config, data), tc.batch_tokens, tc.batch_sentences,
                      tc.seed, epoch)


def sampled_corpora(config: Config, data: CorpusData) -> list[CorpusEntry]:
    """The training corpora with the weights the epoch's sample uses: their ``weight`` under
    ``data.sampling_temperature`` (``attnmt.languages.temperature_weights``; T = 1: as given)."""
    corpora = data.train.corpora
    temperature = config.data.sampling_temperature
    if temperature == 1.0 or len(corpora) < 2:
        return corpora
    weights = temperature_weights([c.pairs for c in corpora], [c.weight for c in corpora], temperature)
    return [dataclasses.replace(c, weight=w) for c, w in zip(corpora, weights)]


def check_epoch_sample(config: Config, data: CorpusData, world_size: int = 1) -> None:
    """Before training: an epoch must give every one of ``world_size`` processes a batch, else
    training would plan empty epochs forever.

    Raises:
        ConfigError: the corpus weights (after ``data.sampling_temperature``) sample no pair,
            or the epoch holds fewer batches than there are processes (one line naming the keys).
    """
    corpora = sampled_corpora(config, data)
    if sum(sample_pairs(c) for c in corpora) == 0:
        weights = ", ".join(f"{c.name} {c.weight:g} x {c.pairs} pairs" for c in corpora)
        tempered = " (after data.sampling_temperature)" if config.data.sampling_temperature != 1.0 else ""
        raise ConfigError(f"data.train: the weights{tempered} sample no training pair per epoch ({weights}); "
                          "raise the weight of at least one data.train entry (1 takes each pair once)")
    if world_size > 1:
        batches = epoch_length(config, data, 0)
        if batches < world_size:
            raise ConfigError(f"an epoch holds {batches} batch(es), fewer than the {world_size} processes: lower "
                              "train.batch_tokens (or train.batch_sentences), raise the data.train weights, or "
                              "start fewer processes")


def signature(config: Config, data: CorpusData) -> dict:
    """What a resume must find unchanged: the data's fingerprint, the corpus weights, the
    batching and subword-sampling settings and what draws the batches (``attnmt.data.plan.GENERATOR``: the
    planner's algorithm and the random stream it reads) (not the world size nor accum_steps:
    the batch order does not depend on them)."""
    tc = config.train
    fingerprint = None
    if data.manifest is not None:
        fingerprint = data.manifest.fingerprint
    return {"fingerprint": fingerprint,
            "weights": [c.weight for c in sampled_corpora(config, data)], "train.seed": tc.seed,
            "train.batch_tokens": None if tc.batch_sentences else tc.batch_tokens,
            "train.batch_sentences": tc.batch_sentences, "batch_plan": GENERATOR,
            "train.subword_alpha": tc.subword_alpha, "train.subword_nbest": tc.subword_nbest if tc.subword_alpha else None}


_WHAT = {"fingerprint": "the prepared training data (fingerprint)",
         "batch_plan": "the batch planner (its algorithm or random stream: the batches would differ)"}


def check_signature(saved: dict | None, current: dict, run_dir: Path, allow_change: bool) -> None:
    """Refuse a resume whose data or batching differ from the checkpoint's (module docstring).

    Raises:
        ConfigError: one line naming the first difference, unless ``allow_change``.
    """
    if saved is None:  # a checkpoint from before the signature existed
        return
    for key, value in current.items():
        if saved.get(key) == value:
            continue
        what = _WHAT.get(key, key)
        if allow_change:
            log.warning("resuming with a changed %s (%s -> %s), as asked", what, saved.get(key), value)
            continue
        raise ConfigError(f"{run_dir}: cannot resume: {what} changed since the checkpoint "
                          f"({_short(saved.get(key))} -> {_short(value)}); pass --allow-data-change to continue "
                          "anyway")


def _short(value) -> str:
    return value[:12] if isinstance(value, str) and len(value) == 64 else str(value)
