"""Everything a training run settles before its first update.

:func:`set_up` takes the configuration and the run directory and gives a :class:`Setup`: the
device (``attnmt.device``) and the precision it supports (``attnmt.precision``; ``auto`` timed
on the model, ``attnmt.train.calibration``), torchrun's
ranks (``attnmt.train.distributed``), the checkpoint to resume from (:func:`check_run_dir`),
the prepared data (``attnmt.train.data``, preparing text into ``RUN_DIR/data`` first when the
configuration names text), the Transformer with its starting weights (fine-tuning's
``train.init_from`` and its ``init_from.json`` record; pretrained ``.vec`` vectors) and its
frozen parameters (``train.freeze``), and whether ``train.compile`` can run here
(``attnmt.train.compiling.compiles_here``).

Library: torch, safetensors (through ``attnmt.rundir``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnmt import languages, rundir
from attnmt.atomic import atomic_write
from attnmt.autoprecision import Choice
from attnmt.config import Config
from attnmt.data.corpus import sha256_file
from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.data.vectors import read_vec
from attnmt.device import configure, resolve_device
from attnmt.errors import AttnmtError, CheckpointError, ConfigError
from attnmt.model.transformer import Transformer, count_parameters, load_pretrained_embeddings
from attnmt.precision import training_precision
from attnmt.train import calibration, distributed, finetune
from attnmt.train.checkpoint import LAST_STATE, load_state
from attnmt.train.compiling import compiles_here
from attnmt.train.data import (CorpusData, check_epoch_sample, check_signature, open_training_data, signature,
                               write_run_tokenizers)
from attnmt.train.subwords import SubwordSampler

log = logging.getLogger(__name__)


class RunExistsError(CheckpointError):
    """A new run was asked for in a directory that already holds one (its ``checkpoints/last.pt``)."""


@dataclass
class Setup:
    """What :func:`set_up` settled; ``saved`` is the state to resume from (None for a new run)."""

    config: Config
    run_dir: Path
    ranks: distributed.Ranks
    device: torch.device
    precision: str
    data: CorpusData
    model: Transformer
    saved: dict | None
    compile: bool  # train.compile, and a compiler is there
    frozen: list[str] = field(default_factory=list)  # parameter names train.freeze fixed
    subwords: SubwordSampler | None = None  # train.subword_alpha: each sentence segmented anew
    start_record: dict | None = None  # fine-tuning: where the run started (init_from.json)
    start_time: float = 0.0  # time.monotonic() when the setup began
    precision_choice: Choice | None = None  # train.precision auto: what it chose, kept in the run directory


def set_up(config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
           progress: bool = True, allow_data_change: bool = False) -> Setup:
    """Settle the run (module docstring); arguments as ``attnmt.train.loop.TrainingRun``'s.
    Seeds torch with ``train.seed`` before the data and the model are made.

    Raises:
        ConfigError, DataError, CheckpointError (:class:`RunExistsError`): bad configuration,
            device, corpus or run directory.
    """
    start_time = time.monotonic()
    config = run_config(config)
    run_dir = Path(run_dir)
    tc = config.train
    ranks = distributed.from_env()
    device = resolve_device(tc.device, ranks.local_rank if ranks.distributed else None)
    configure(device)
    compile = compiles_here(tc.compile, device)  # a broken compiler: one line before any writing
    distributed.init(ranks, device, tc.dist_timeout)
    # rank 0's saved state (None for a new run) on every rank
    saved = distributed.broadcast(check_run_dir(run_dir, config, resume) if ranks.is_main else None, device)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    precision = tc.precision if tc.precision == "auto" else training_precision(tc.precision, device.type)
    torch.manual_seed(tc.seed)
    data = open_data(config, run_dir, ranks, saved, data_dir, allow_data_change, progress)
    subwords = None
    if tc.subword_alpha:
        subwords = SubwordSampler(data.src_tok, data.tgt_tok, tc.subword_alpha, tc.subword_nbest, tc.seed)
    model = Transformer(config.model, len(data.src_tok), len(data.tgt_tok), pad_id=PAD_ID)
    start_record = None
    if saved is None and tc.init_from:
        start_record = load_start_weights(model, config)
    elif saved is None:
        load_vectors(model, config, data)
    frozen = finetune.freeze(model, tc.freeze)
    model.to(device)
    if device.type == "cuda":  # speed switch: PyTorch's fused attention kernels on GPUs
        model.set_fused_attention(encoder=True, decoder=True)
    choice = None
    if precision == "auto":  # timed on the model itself, before the first update (attnmt.train.calibration)
        choice = calibration.training_choice(config, run_dir, resume, model, data, ranks, device)
        precision = choice.precision
    log.info("model: %d parameters; vocabulary %d/%d; device %s, precision %s", count_parameters(model),
             len(data.src_tok), len(data.tgt_tok), device, precision)
    if frozen:
        log.info("frozen: %d parameter tensors (%s%s)", len(frozen), ", ".join(frozen[:4]),
                 ", ..." if len(frozen) > 4 else "")
    if saved is not None:
        where = saved.get("progress", {})
        log.info("resuming from step %s (epoch %s, batch %s; saved under %d process(es), now %d)", where.get("step"),
                 where.get("epoch", 0) + 1, where.get("batch_in_epoch"), saved.get("world_size", 1), ranks.world_size)
    return Setup(config=config, run_dir=run_dir, ranks=ranks, device=device, precision=precision, data=data,
                 model=model, saved=saved, compile=compile, frozen=frozen, subwords=subwords,
                 start_record=start_record, start_time=start_time, precision_choice=choice)


def run_config(config: Config) -> Config:
    """The configuration a run trains with: with ``train.init_from`` the model and tokenizer
    sections of the starting model (``finetune.inherit_from``), and a multilingual model's
    target languages from its corpora (``languages.resolve``).

    Raises:
        ConfigError, CheckpointError: see those two functions.
    """
    if config.train.init_from:
        config = finetune.inherit_from(config, config.train.init_from)
    return languages.resolve(config)


def check_run_dir(run_dir: Path, config: Config, resume: bool) -> dict | None:
    """The state to resume from (None for a new run); refuses to overwrite a run.

    Raises:
        RunExistsError: not ``resume`` and ``run_dir`` holds a run.
        CheckpointError: ``resume`` and no such directory, or an unreadable state.
        ConfigError: ``resume`` with model or tokenizer settings other than the run's.
    """
    if not resume:
        if (run_dir / LAST_STATE).exists():
            raise RunExistsError(f"{run_dir} already holds a run")
        return None
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run directory to resume")
    if not (run_dir / LAST_STATE).is_file():  # stopped before its first checkpoint
        log.warning("%s: no checkpoint yet; starting the run from the beginning", run_dir)
        return None
    saved = rundir.read_config(run_dir)
    if saved.model != config.model or saved.tokenizer != config.tokenizer:
        raise ConfigError(f"{run_dir}/config.yaml: model or tokenizer settings differ from the run being resumed")
    return load_state(run_dir / LAST_STATE)


def open_data(config: Config, run_dir: Path, ranks: distributed.Ranks, saved: dict | None, data_dir: str | None,
              allow_change: bool, progress: bool) -> CorpusData:
    """Open the run's prepared data (``attnmt.train.data``, preparing text into ``RUN_DIR/data``
    first if needed); a resumed run has its data signature checked against the checkpoint's.
    Nothing is written into the run directory yet (:func:`write_run_files`) but its prepared data."""
    data = open_training_data(config, run_dir, saved is not None, data_dir, ranks, allow_change, progress)
    if saved is not None:
        check_signature(saved.get("data"), signature(config, data), run_dir, allow_change)
    check_epoch_sample(config, data, ranks.world_size)
    return data


def write_run_files(setup: Setup) -> None:
    """Rank 0, once every check of the setup has passed: the run's configuration, and a new
    run's tokenizers and (fine-tuning) ``init_from.json``, so that a refused start or resume
    leaves the run directory as it was."""
    if not setup.ranks.is_main:
        return
    setup.run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_config(setup.config, setup.run_dir)
    if setup.precision_choice is not None and setup.precision_choice.how != "run":
        calibration.keep_choice(setup.run_dir, setup.precision_choice)
    if setup.saved is not None:
        return
    write_run_tokenizers(setup.config, setup.data, setup.run_dir)
    if setup.start_record is not None:
        text = json.dumps(setup.start_record, indent=1) + "\n"
        atomic_write(setup.run_dir / finetune.START_RECORD,
                            lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def removed_if_refused(run_dir: str | Path) -> Iterator[None]:
    """Around a run's setup: a refused setup (``AttnmtError`` or ``ValueError``, the CLI's exit
    status 2) of a new run removes the run directory it made, the data it prepared included; an
    existing directory is left as it was, but for data prepared again at the user's request
    (``allow_data_change``, or a changed text without ``resume``)."""
    new_run = not Path(run_dir).exists()
    try:
        yield
    except (AttnmtError, ValueError):
        if new_run and distributed.from_env().is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def load_start_weights(model: Transformer, config: Config) -> dict:
    """Fine-tuning: load the starting model's weights (safetensors) and say where the run
    started (written as ``init_from.json`` by :func:`write_run_files`).

    Returns:
        {'path': the starting model directory, 'weights': its weights file's name, 'sha256':
        the SHA-256 of that file}.
    """
    path = Path(config.train.init_from) / rundir.WEIGHTS
    rundir.load_weights(model, path)
    record = {"path": str(Path(config.train.init_from).resolve()), "weights": rundir.WEIGHTS,
              "sha256": sha256_file(path)}
    log.info("starting from %s (sha256 %s)", path, record["sha256"][:12])
    return record


def load_vectors(model: Transformer, config: Config, data: CorpusData) -> None:
    """Copy the pretrained vectors of ``model.src_vectors`` / ``model.tgt_vectors`` into the
    embeddings (word vocabularies: the configuration's rules ask for ``tokenizer.kind word``);
    other rows keep their initialisation.

    Raises:
        ConfigError: a vectors file that cannot be read.
    """
    mc = config.model
    for path, tok, emb in ((mc.src_vectors, data.src_tok, model.encoder.embedding),
                           (mc.tgt_vectors, data.tgt_tok, model.decoder.embedding)):
        if path is None:
            continue
        try:
            filled = load_pretrained_embeddings(emb, tok.words, read_vec(path, set(tok.words)), EOS_ID + 1)
        except ValueError as e:
            raise ConfigError(f"{path}: {e}") from None
        log.info("%s: pretrained vectors for %d of %d words", path, filled, len(tok.words))
