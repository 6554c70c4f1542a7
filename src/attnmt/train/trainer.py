"""The training loop (paper section 5) as a small :class:`Trainer`.

``Trainer(config, run_dir).run()`` does the whole job. Setup opens the prepared corpus
(``attnmt.train.data``: token shards, prepared from text into ``RUN_DIR/data`` first
when the configuration names text) and builds the model and Adam with the configured
learning-rate schedule. Each update (:meth:`train_step`)
takes ``accum_steps`` length-bucketed token batches, the label-smoothed loss with optional
bfloat16 autocast (and, with ``train.dropout_curriculum``, dropout rates that grow with the
update count), and clips the gradient norm. Every ``valid_every`` updates
(:meth:`validate`) it computes validation loss, perplexity and greedy BLEU/chrF, keeps the best
weights as ``model.safetensors`` and writes the resumable state (:meth:`save_checkpoint`). It
stops (:meth:`stop_reason`) after ``max_steps``, ``max_epochs`` or ``max_minutes`` (wall clock,
leaving time for the final validation), or after ``stop_patience`` validations without
improvement; then it validates a last time and may average the last validation checkpoints.
Options of other published setups: batches by sentence count, SGD with Nesterov momentum,
per-sentence loss normalisation, a validation report and a checkpoint after every epoch,
word-level vocabularies and pretrained embeddings read from ``.vec`` files.
Metrics go to ``train_log.jsonl`` (``attnmt.train.metrics``).

Fine-tuning (``attnmt.train.finetune``): with ``train.init_from`` the run takes another model
directory's model section, tokenizers and weights, starts Adam and the schedule afresh, and
validates the starting model as step 0 before the first update; ``train.freeze`` keeps chosen
parameters fixed and out of the optimizer.

Finite training: an update whose loss or gradient norm is not finite is skipped (the weights
and Adam's moments stay as they were), counted and logged; after
``train.max_nonfinite_updates`` of them in a row training stops with a :class:`TrainingError`
and a resumable checkpoint of the last finite state. A validation with a non-finite loss is
never "best", and weights that are not all finite are never written as ``model.safetensors``.

Exact resume: the state remembers the log's length (cut back to it on resume), whether the
run has stopped (then the final validation is done) and whether it has finished. Resuming a
finished run whose stop condition still holds does nothing; resuming after a kill during the
final validation or the averaging finishes the run as an uninterrupted one would.

Devices and processes: the model and its batches live on ``train.device`` (``attnmt.device``),
at the precision that device supports (``attnmt.precision.training_precision``; float16 with a
loss scaler on CUDA). Started by torchrun, the same loop runs data-parallel over several
processes (``attnmt.train.distributed``: each rank's share of an update, the loss normalised
by the whole update's target tokens, rank 0 alone writing and validating). SIGINT and SIGTERM
stop every rank at the same update boundary with a resumable checkpoint; during the setup
(preparing the text), the planning of an epoch (one process) or an evaluation they stop it at
once, keeping nothing half-done (``attnmt.signals``). Corpus weights that sample no pair, or a
``train.freeze`` that leaves nothing to train, are refused before the first update.

"Best" means higher validation BLEU, then lower perplexity.

Compiled training step (``train.compile``, a speed switch): the encoder and decoder stacks of
the loss go through ``torch.compile`` (:func:`attnmt.train.compiling.compiled`; eager without a C++ compiler on CPU, with
a warning); the run's graphs and compile seconds are in the ``done`` record.

Library: torch.optim (Adam, SGD, LambdaLR), torch.compile, tqdm.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from attnmt import languages, rundir
from attnmt.config import Config
from attnmt.data.batching import Batch, batch_from_arrays, make_batch, token_batches
from attnmt.data.corpus import EncodedCorpus, sha256_file
from attnmt.data.plan import Share
from attnmt.data.tokenizers import EOS_ID, PAD_ID, WordTokenizer
from attnmt.data.vectors import read_vec
from attnmt.device import configure, resolve_device
from attnmt.errors import AttnmtError, CheckpointError, ConfigError, TrainingError
from attnmt.evaluate import corpus_scores
from attnmt.memory import peak_rss_mib
from attnmt.model.dropout import set_rates
from attnmt.model.transformer import Transformer, count_parameters, load_pretrained_embeddings
from attnmt.precision import autocast, grad_scaler, training_precision
from attnmt.search.batched import native_search
from attnmt.search.options import SearchOptions
from attnmt.signals import Interrupted, StopSignals, stop_point
from attnmt.train import distributed, finetune
from attnmt.train.compiling import compiled, compiled_graphs, compiles_here
from attnmt.train.data import (check_epoch_sample, check_signature, epoch_length, epoch_share, open_training_data,
                               signature, write_run_tokenizers)
from attnmt.train.checkpoint import (EPOCH_WEIGHTS, LAST_STATE, STEP_WEIGHTS, average_weights, load_state,
                                     save_state, step_checkpoints)
from attnmt.train.losses import (chunked_label_smoothed_cross_entropy, label_smoothed_cross_entropy,
                                 per_sentence_label_smoothed_cross_entropy)
from attnmt.train.metrics import MetricsLog, Window
from attnmt.train.schedules import curriculum_dropout, expected_updates, learning_rate
from attnmt.train.subwords import SubwordSampler

log = logging.getLogger(__name__)

CHUNKED_LOSS = True  # speed switch (memory): the loss without holding the (N, V) logits (attnmt.train.losses)


@dataclass
class TrainResult:
    """Summary of a finished run (also in the last line of train_log.jsonl)."""

    steps: int
    epochs_done: float
    minutes: float
    best_valid_bleu: float | None
    best_valid_ppl: float
    tgt_tokens_per_second: float  # all processes together
    stop_reason: str = ""
    interrupted_by: str | None = None  # 'SIGINT' or 'SIGTERM' when a signal stopped the run


@dataclass
class Progress:
    """Where a run stands; saved in the resumable state."""

    step: int = 0  # updates done
    epoch: int = 0  # 0-based epoch in progress
    batch_in_epoch: int = 0  # batches of that epoch done, by all processes together
    elapsed_seconds: float = 0.0  # wall clock before this process
    best_bleu: float | None = None
    best_ppl: float = float("inf")
    best_key: tuple[float, float] = (-float("inf"), -float("inf"))  # (BLEU, -perplexity)
    bad_validations: int = 0  # validations since the last improvement
    nonfinite_in_a_row: int = 0  # updates skipped in a row: loss or gradient norm not finite
    nonfinite_total: int = 0  # all updates skipped so far
    last_valid_bleu: float | None = None  # of the latest validation
    stop_reason: str | None = None  # set when training stopped; the final validation is then done
    finished: bool = False  # the final validation, averaging and the 'done' record are written
    log_bytes: int | None = None  # length of train_log.jsonl when the state was saved
    expected_steps: float = float("inf")  # updates the time budget is expected to hold (schedule time_budget)


class BatchLoss(torch.nn.Module):
    """The summed label-smoothed loss and NLL of one teacher-forced batch, as a module's
    forward: ``DistributedDataParallel`` synchronises the gradients of what the forward of the
    module it wraps computed, so the loss, not only the Transformer, is what it wraps.

    Args:
        model: the Transformer.
        label_smoothing: epsilon_ls (paper section 5.4).
        per_sentence: the objective is the sum of each sentence's mean loss per token
            (``train.loss_normalization: sentences``), else the summed loss.
    """

    def __init__(self, model: Transformer, label_smoothing: float, per_sentence: bool = False,
                 compile: bool = False):
        super().__init__()
        self.model, self.label_smoothing, self.per_sentence = model, label_smoothing, per_sentence
        self.features = self._features
        if compile:  # speed switch (train.compile): the stacks through inductor; the plain eager method otherwise
            self.features = compiled(self._features)

    def _features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The decoder's final states (B, T, D) of teacher-forced decoding: (B, S), (B, T) int64 ids."""
        memory, src_mask, _ = self.model.encode(src)
        return self.model.decoder.features(tgt_in, memory, src_mask)[0]

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, S), (B, T), (B, T) int64 ids -> (objective, summed label-smoothed loss, summed
        NLL) over the non-pad targets (float32 scalars); the objective is what is minimised."""
        eps, target = self.label_smoothing, tgt_out.flatten()  # (B*T,)
        if self.per_sentence and torch.is_grad_enabled():
            return per_sentence_label_smoothed_cross_entropy(self.model(src, tgt_in), tgt_out, eps, PAD_ID)
        if not CHUNKED_LOSS:
            logits = self.model(src, tgt_in)  # (B, T, V)
            loss, nll = label_smoothed_cross_entropy(logits.flatten(0, 1), target, eps, PAD_ID)
            return loss, loss, nll
        # Speed switch (memory): the loss from the decoder states and the output projection.
        states = self.features(src, tgt_in)  # (B, T, D)
        projection = self.model.decoder.output_projection
        loss, nll = chunked_label_smoothed_cross_entropy(states.flatten(0, 1), projection.weight, target, eps, PAD_ID,
                                                         projection.bias)
        return loss, loss, nll


class Trainer:
    """Trains a model into a run directory (module docstring).

    Args:
        config: the validated configuration; on ``resume`` its model and tokenizer sections
            must equal those saved in ``run_dir``.
        run_dir: the model directory to create (or, with ``resume``, to continue); under
            several processes only rank 0 reads and writes it.
        resume: continue from ``run_dir``'s ``checkpoints/last.pt`` (saved under any number
            of processes; ``attnmt.train.distributed`` says what is exact).
        data_dir: local dataset directory (overrides ``data.data_dir`` and ``ATTNMT_DATA``).
        progress: show a tqdm progress bar on a terminal (rank 0 only).
        allow_data_change: resume even though the data, the corpus weights or the batching
            settings differ from the checkpoint's (``attnmt.train.data``).
    Raises:
        ConfigError, DataError, CheckpointError: bad configuration, device, corpus or run directory.
    """

    def __init__(self, config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
                 progress: bool = True, allow_data_change: bool = False):
        self.start_time = time.monotonic()
        config = run_config(config)
        self.config, self.run_dir, self.progress_bar = config, Path(run_dir), progress
        tc = config.train
        self.ranks = distributed.from_env()
        self.device = resolve_device(tc.device, self.ranks.local_rank if self.ranks.distributed else None)
        configure(self.device)
        self.compiled = compiles_here(tc.compile, self.device)  # a broken compiler: one line before any writing
        distributed.init(self.ranks, self.device)
        # rank 0's saved state (None for a new run) on every rank
        state = distributed.broadcast(self._check_run_dir(resume) if self.ranks.is_main else None, self.device)
        if tc.num_threads:
            torch.set_num_threads(tc.num_threads)
        self.precision = training_precision(tc.precision, self.device.type)
        torch.manual_seed(tc.seed)
        self._setup_data(state, data_dir, allow_data_change)
        self.model = Transformer(config.model, len(self.data.src_tok), len(self.data.tgt_tok), pad_id=PAD_ID)
        if state is None and tc.init_from:
            self._load_start_weights()
        elif state is None:
            self._load_vectors()
        frozen = finetune.freeze(self.model, tc.freeze)
        self.model.to(self.device)
        if self.device.type == "cuda":  # speed switch: PyTorch's fused attention kernels on GPUs
            self.model.set_fused_attention(encoder=True, decoder=True)
        log.info("model: %d parameters; vocabulary %d/%d; device %s, precision %s", count_parameters(self.model),
                 len(self.data.src_tok), len(self.data.tgt_tok), self.device, self.precision)
        self.params = list({id(p): p for p in self.model.parameters()}.values())  # tied tensors once
        if frozen:  # train.freeze: fixed parameters stay out of the optimizer
            self.params = [p for p in self.params if p.requires_grad]
            log.info("frozen: %d parameter tensors (%s%s)", len(frozen), ", ".join(frozen[:4]),
                     ", ..." if len(frozen) > 4 else "")
        # The schedule gives the learning rate itself (base rate 1.0, as in the Annotated
        # Transformer); LambdaLR's step i is the (i + 1)-th update. fused: speed switch,
        # PyTorch's one-kernel Adam update (same update rule), on CPUs and CUDA GPUs.
        self.optimizer = torch.optim.Adam(self.params, lr=1.0, betas=tc.adam_betas, eps=tc.adam_eps,
                                          weight_decay=tc.weight_decay, fused=self.device.type in ("cpu", "cuda"))
        if tc.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=1.0, momentum=tc.momentum, nesterov=tc.nesterov,
                                             weight_decay=tc.weight_decay)
        self.state = Progress()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda i: learning_rate(
            tc.schedule, i + 1, d_model=config.model.d_model, lr=tc.lr, lr_factor=tc.lr_factor,
            warmup_steps=tc.warmup_steps, first_decay_steps=tc.first_decay_steps, t_mul=tc.t_mul, m_mul=tc.m_mul,
            alpha=tc.alpha, expected_steps=self.state.expected_steps, warmup_fraction=tc.warmup_fraction,
            budget_decay=tc.budget_decay))
        self.scaler = grad_scaler(self.precision, self.device.type)
        self.loss = BatchLoss(self.model, tc.label_smoothing, per_sentence=tc.loss_normalization == "sentences",
                              compile=self.compiled)
        if state is not None:
            self._restore(state)
        elif self.ranks.rank > 0:
            torch.manual_seed(distributed.rank_seed(tc.seed, self.ranks.rank, 0))
        self.ddp_loss = distributed.wrap(self.loss, self.ranks, self.device, tc.ddp_overlap)  # the loss the updates use
        self._write_run_files(resumed=state is not None)  # every check above has passed: the first writes
        self._open_records(resumed=state is not None)
        if state is None and tc.init_from and self.ranks.is_main:
            self.metrics.write("init_from", **self.start_record, frozen=frozen,
                               trainable_parameters=count_parameters(self.model))
        self.valid_seconds = 0.0  # duration of the last validation, reserved at the end of the budget
        self.window = Window()
        self.run_tokens, self.run_seconds = 0, 0.0  # target tokens (all processes) and update time of this run
        self.bar: tqdm | None = None  # the progress bar, while run() runs
        self._last_lr = 0.0  # the learning rate of the latest update
        self.signals = StopSignals()  # flag only; evaluation and (one process) planning stop at once
        self.interrupted_by: str | None = None  # the signal that stopped the run
        self.epoch_window = Window()  # loss and time of the epoch in progress
        self.last_valid: dict = {}  # the latest validation's result
        self.setup_seconds = 0.0  # wall clock before the first update of this process

    def _setup_data(self, state: dict | None, data_dir: str | None, allow_change: bool) -> None:
        """Open the run's prepared data (``attnmt.train.data``, preparing text into
        ``RUN_DIR/data`` first if needed); a new run gets the configuration and tokenizers in its
        directory, a resumed one has its data signature checked against the checkpoint's; nothing
        is written into the run directory yet (:meth:`_write_run_files`) but its prepared data."""
        self.data = open_training_data(self.config, self.run_dir, state is not None, data_dir, self.ranks,
                                       allow_change, self.progress_bar)
        self._epoch_batches: tuple[int, Share] | None = None  # (epoch, this process's batches), once per epoch
        tc = self.config.train
        self.subwords = SubwordSampler(self.data.src_tok, self.data.tgt_tok, tc.subword_alpha, tc.subword_nbest,
                                       tc.seed, self.config.tokenizer.target_languages) if tc.subword_alpha else None
        if state is not None:
            check_signature(state.get("data"), signature(self.config, self.data), self.run_dir, allow_change)
        check_epoch_sample(self.config, self.data, self.ranks.world_size)

    def _write_run_files(self, resumed: bool) -> None:
        """Rank 0, once every check of the setup has passed: the run's configuration, and a new
        run's tokenizers and (fine-tuning) ``init_from.json``, so that a refused start or resume
        leaves the run directory as it was."""
        if not self.ranks.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_config(self.config, self.run_dir)
        if resumed:
            return
        write_run_tokenizers(self.config, self.data, self.run_dir)
        if self.config.train.init_from:
            text = json.dumps(self.start_record, indent=1) + "\n"
            rundir.atomic_write(self.run_dir / finetune.START_RECORD,
                                lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def _load_start_weights(self) -> None:
        """Fine-tuning: load the starting model's weights (safetensors) and record where the run
        started, ``init_from.json`` (path and SHA-256 of the weights file) and an ``init_from``
        line in train_log.jsonl (written by :meth:`_open_records`)."""
        path = Path(self.config.train.init_from) / rundir.WEIGHTS
        rundir.load_weights(self.model, path)
        self.start_record = {"path": str(Path(self.config.train.init_from).resolve()), "weights": rundir.WEIGHTS,
                             "sha256": sha256_file(path)}  # written with the run's files (_write_run_files)
        log.info("starting from %s (sha256 %s)", path, self.start_record["sha256"][:12])

    def _load_vectors(self) -> None:
        """Copy the pretrained vectors of ``model.src_vectors`` / ``model.tgt_vectors`` into the
        embeddings (word vocabularies only); other rows keep their initialisation."""
        mc = self.config.model
        for path, tok, emb in ((mc.src_vectors, self.data.src_tok, self.model.encoder.embedding),
                               (mc.tgt_vectors, self.data.tgt_tok, self.model.decoder.embedding)):
            if path is None:
                continue
            if not isinstance(tok, WordTokenizer):
                raise ConfigError("model.src_vectors/tgt_vectors need tokenizer.kind word")
            try:
                filled = load_pretrained_embeddings(emb, tok.words, read_vec(path, set(tok.words)), EOS_ID + 1)
            except ValueError as e:
                raise ConfigError(f"{path}: {e}") from None
            log.info("%s: pretrained vectors for %d of %d words", path, filled, len(tok.words))

    def _check_run_dir(self, resume: bool) -> dict | None:
        """The state to resume from (None for a new run); refuses to overwrite a run."""
        if not resume:
            if (self.run_dir / LAST_STATE).exists():
                raise CheckpointError(f"{self.run_dir} already holds a run; pass --resume to continue it "
                                      "or choose another --output")
            return None
        if not self.run_dir.is_dir():
            raise CheckpointError(f"{self.run_dir}: no such run directory to resume")
        if not (self.run_dir / LAST_STATE).is_file():  # stopped before its first checkpoint
            log.warning("%s: no checkpoint yet; starting the run from the beginning", self.run_dir)
            return None
        saved = rundir.read_config(self.run_dir)
        if saved.model != self.config.model or saved.tokenizer != self.config.tokenizer:
            raise ConfigError(f"{self.run_dir}/config.yaml: model or tokenizer settings differ from the run "
                              "being resumed")
        return load_state(self.run_dir / LAST_STATE)

    def _restore(self, state: dict) -> None:
        """Load a saved state; rank 0 continues the saved random stream, other ranks reseed."""
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler") and self.scaler.is_enabled():
                self.scaler.load_state_dict(state["scaler"])
            progress = dict(state["progress"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{self.run_dir / LAST_STATE}: does not fit this run: {e}") from None
        progress["best_key"] = tuple(progress["best_key"])
        self.state = Progress(**progress)
        if self.ranks.is_main:
            torch.set_rng_state(state["torch_rng"])
            if self.device.type == "cuda" and "cuda_rng" in state:
                torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        else:
            torch.manual_seed(distributed.rank_seed(self.config.train.seed, self.ranks.rank, self.state.step))
        log.info("resumed from step %d (epoch %d, batch %d; saved under %d process(es), now %d)", self.state.step,
                 self.state.epoch + 1, self.state.batch_in_epoch, state.get("world_size", 1), self.ranks.world_size)

    def _open_records(self, resumed: bool) -> None:
        """Open ``train_log.jsonl`` and list the step checkpoints, both as of the saved state:
        a new run starts an empty log and removes stale step checkpoints; a resumed one cuts
        the log back to the state's length and drops step checkpoints written after it. Rank 0
        alone writes: the other processes get neither."""
        s = self.state
        if not self.ranks.is_main:
            self.metrics, self.step_ckpts = None, []
            return
        self.metrics = MetricsLog(self.run_dir / "train_log.jsonl", truncate_to=s.log_bytes if resumed else 0)
        self.step_ckpts = []
        for path in step_checkpoints(self.run_dir):
            if resumed and int(path.stem.split("_")[1]) <= s.step:
                self.step_ckpts.append(path)
            else:
                path.unlink()
        self._prune_step_checkpoints()

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run, earlier processes included."""
        return self.state.elapsed_seconds + time.monotonic() - self.start_time

    # ---- one update ---------------------------------------------------------------------------

    def batch_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and summed NLL of one teacher-forced batch (float32
        scalars), by the model itself (not through DistributedDataParallel): for validation."""
        return self.loss(batch.src, batch.tgt_in, batch.tgt_out)[1:]

    def train_step(self, batches: list[Batch], tokens: int | None = None, sentences: int | None = None
                   ) -> tuple[float, float, int] | None:
        """One update from this process's ``batches`` (on the device; gradients accumulated).

        Each batch's summed loss is divided by ``tokens``, the target tokens of the whole update
        (all processes; default: those of ``batches``), and multiplied by the number of
        processes, whose gradients are then averaged (``distributed.average_gradients``, or
        DistributedDataParallel during the last batch's backward pass: the inner batches skip
        its synchronisation, ``no_sync``). With ``loss_normalization: sentences`` each
        sentence's mean loss is summed instead and divided by ``sentences`` (all processes).
        Then the loss scaler (fp16 only) unscales the gradients, their norm is clipped to
        ``clip_norm``, and the optimizer and the schedule step (``time_budget`` first refits
        the expected number of updates).

        Returns:
            (summed loss, summed NLL, target tokens) of this process's batches, or None when
            the loss or the gradient norm is not finite: then nothing is updated
            (:meth:`skip_nonfinite`). Under torchrun the gradient norm is that
            of the averaged gradients, the same on every process, so all skip together.
        """
        local_tokens = sum(b.num_tgt_tokens for b in batches)
        tokens = tokens or local_tokens
        sentences = sentences or sum(b.tgt_out.size(0) for b in batches)
        per_sentence = self.config.train.loss_normalization == "sentences"
        scale = self.ranks.world_size / (sentences if per_sentence else tokens)
        if self.config.train.dropout_curriculum:  # curriculum dropout: the configured rates times this step's share
            share, m = curriculum_dropout(self.state.step, self.config.train.dropout_curriculum), self.config.model
            set_rates(self.model, m.dropout * share, m.attention_dropout * share, m.activation_dropout * share)
        loss_sum = nll_sum = 0.0
        for i, b in enumerate(batches):
            # dropout masks from a seed of (update, batch's place in the whole update): the same
            # masks for any split of the update over processes and accumulation steps
            torch.manual_seed(distributed.batch_seed(self.config.train.seed, self.state.step,
                                                     self.ranks.rank + i * self.ranks.world_size))
            inner = self.ranks.distributed and i < len(batches) - 1
            with distributed.no_sync(self.ddp_loss) if inner else contextlib.nullcontext():
                with autocast(self.precision, self.device.type):
                    objective, loss, nll = self.ddp_loss(b.src, b.tgt_in, b.tgt_out)
                self.scaler.scale(objective * scale).backward()
            loss_sum += loss.item()
            nll_sum += nll.item()
        distributed.average_gradients(self.ddp_loss, self.ranks)
        self.scaler.unscale_(self.optimizer)
        if self.config.train.clip_norm:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.config.train.clip_norm))
        else:
            grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None]))
        # fp16: an infinite gradient is the loss scaler's business (it skips the step and lowers the scale)
        finite_grad = math.isfinite(grad_norm) or self.scaler.is_enabled()
        if not finite_grad or (not self.ranks.distributed and not math.isfinite(loss_sum)):
            self.zero_grad()
            self.scaler.update()
            self.skip_nonfinite(loss_sum / tokens, grad_norm)
            return None
        self.state.nonfinite_in_a_row = 0
        self.scaler.step(self.optimizer)  # skipped (fp16) when a gradient is inf or NaN
        self.scaler.update()
        self.state.step += 1
        if self.config.train.schedule == "time_budget":  # refit to the update rate measured so far
            self.state.expected_steps = expected_updates(self.state.step, self.elapsed() - self.setup_seconds,
                                                         self.config.train.max_minutes * 60 - self.setup_seconds)
            if self.config.train.max_steps:  # the budget is whichever ends first: the minutes or the updates
                self.state.expected_steps = min(self.state.expected_steps, self.config.train.max_steps)
        self.scheduler.step()
        self.zero_grad()
        return loss_sum, nll_sum, local_tokens

    def zero_grad(self) -> None:
        """Clear the gradients for the next update: set to None, except under
        DistributedDataParallel, whose gradients are views into its all-reduce buckets
        (``distributed.wrap``): zeroed in place they stay views, where None would make each
        backward allocate them anew."""
        self.optimizer.zero_grad(set_to_none=not isinstance(self.ddp_loss, DistributedDataParallel))

    def skip_nonfinite(self, loss: float, grad_norm: float) -> None:
        """Count and log an update skipped for a non-finite loss or gradient norm.

        Raises:
            TrainingError: ``train.max_nonfinite_updates`` in a row; the last finite state is
                saved first (with the counter reset), so ``--resume``, e.g. with a lower
                learning rate, goes on from there.
        """
        s, limit = self.state, self.config.train.max_nonfinite_updates
        s.nonfinite_in_a_row, s.nonfinite_total = s.nonfinite_in_a_row + 1, s.nonfinite_total + 1
        log.warning("step %d: loss %s, gradient norm %s: update skipped (%d in a row, %d in all)", s.step + 1,
                    loss, grad_norm, s.nonfinite_in_a_row, s.nonfinite_total)
        if self.ranks.is_main:
            self.metrics.write("nonfinite", step=s.step, epoch=s.epoch + 1, loss=loss, grad_norm=grad_norm,
                               in_a_row=s.nonfinite_in_a_row, total=s.nonfinite_total)
        if s.nonfinite_in_a_row >= limit:
            s.nonfinite_in_a_row = 0
            if self.ranks.is_main:
                self.save_checkpoint()
            raise TrainingError(f"{limit} updates in a row with a non-finite loss or gradient norm after step "
                                f"{s.step}; lower the learning rate (train.lr or train.lr_factor) or set "
                                f"train.clip_norm, then --resume (the last finite state is in "
                                f"{self.run_dir / LAST_STATE})")

    # ---- validation and checkpoints -----------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation loss and perplexity (teacher forcing) and, with ``train.valid_bleu``, greedy
        BLEU and chrF (sacreBLEU) of the validation set, at the training precision. A
        multilingual model has a set per direction: the loss and perplexity are over all their
        tokens, BLEU and chrF the mean of the directions', each direction's in 'valid_directions'.

        Returns:
            {'valid_loss': label-smoothed loss per token, 'valid_ppl': exp(NLL per token),
             'valid_bleu', 'valid_chrf'} (None for what was not computed), and with several
            sets 'valid_directions': {name: {'bleu', 'chrf'}}.
        """
        sets, tc, start = self.data.valid_sets, self.config.train, self.config.model.decoder_start_id
        if not sets:
            return {"valid_loss": None, "valid_ppl": None, "valid_bleu": None, "valid_chrf": None}
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        scores = {}
        with autocast(self.precision, self.device.type):
            for valid in sets:
                data = valid.pairs
                for idx in token_batches(data.lengths(), tc.batch_tokens):
                    batch = make_batch([data.src[i] for i in idx], [data.tgt[i] for i in idx], start)
                    loss, nll = self.batch_loss(batch.to(self.device))
                    loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
                    tokens += batch.num_tgt_tokens
                if tc.valid_bleu:
                    scores[valid.name] = corpus_scores(self._greedy_translations(data), valid.refs)
        self.model.train()
        result = {"valid_loss": loss_sum / max(tokens, 1), "valid_ppl": math.exp(min(nll_sum / max(tokens, 1), 50)),
                  "valid_bleu": None, "valid_chrf": None}
        if scores:
            result["valid_bleu"] = sum(v["bleu"] for v in scores.values()) / len(scores)
            result["valid_chrf"] = sum(v["chrf"] for v in scores.values()) / len(scores)
        if len(sets) > 1:
            result["valid_directions"] = {name: {"bleu": v["bleu"], "chrf": v["chrf"]} for name, v in scores.items()}
        return result

    def _greedy_translations(self, data: EncodedCorpus, batch_size: int = 256) -> list[str]:
        """Detokenized greedy translations of ``data.src``, in order: the batch routine of
        ``attnmt translate`` (``attnmt.search.batched.native_search``), with the decode config's
        length limits and a beam of 1."""
        options = SearchOptions.from_config(self.config.decode, beam_size=1, nbest=1)
        hyps = native_search(self.model, [s + [EOS_ID] for s in data.src], options, batch_size, self.device)
        return [self.data.tgt_tok.decode([t for t in h.tokens if t != EOS_ID]) for [h] in hyps]

    def validate(self) -> dict:
        """Evaluate, keep the weights if they are the best so far, keep a step checkpoint for
        averaging, write the resumable state and log the result. Rank 0 does all of it; every
        rank gets its result, the count of validations without improvement and the time it
        took (so that every rank takes the same stop decisions).

        Raises:
            Interrupted: (on every process) a stop signal reached rank 0 during the
                evaluation, before anything was written.
        """
        result = stopped = None
        if self.ranks.is_main:
            try:
                result = self._validate_and_save()
            except Interrupted as e:
                stopped = e.signal_name
        result, self.state.bad_validations, self.valid_seconds, stopped = distributed.broadcast(
            (result, self.state.bad_validations, self.valid_seconds, stopped), self.device)
        if stopped:
            raise Interrupted(stopped)
        self.last_valid = result
        return result

    def _evaluate_or_stop(self) -> dict:
        """:meth:`evaluate`, which a stop signal ends at once (it writes nothing).

        Raises:
            Interrupted: a signal arrived before or during the evaluation.
        """
        try:
            with self.signals.raising():
                return self.evaluate()
        finally:
            self.model.train()

    def _validate_and_save(self) -> dict:
        t0 = time.monotonic()
        result = self._evaluate_or_stop()
        self.valid_seconds = time.monotonic() - t0
        s, step = self.state, self.state.step
        improved = self._keep_if_best(result, {"step": str(step)})
        s.bad_validations = 0 if improved else s.bad_validations + 1
        s.last_valid_bleu = result["valid_bleu"]
        if self.config.train.average_last > 1 and step > 0:  # never average in a fine-tuning run's start
            self._keep_step_checkpoint()
        # The record first, then the state that remembers the log's length: a resume from an
        # older state cuts the record away and validates again.
        self.metrics.write("valid", step=step, epoch=s.epoch + 1, seconds=round(self.elapsed(), 1), **result,
                           best=improved)
        self.save_checkpoint()
        self._prune_step_checkpoints()
        directions = result.get("valid_directions")
        log.info("step %d valid: loss %.3f ppl %.2f bleu %s chrf %s%s%s (%.1fs)", step, result["valid_loss"] or 0,
                 result["valid_ppl"] or 0, _fmt(result["valid_bleu"]), _fmt(result["valid_chrf"]),
                 " (bleu " + ", ".join(f"{k} {v['bleu']:.2f}" for k, v in directions.items()) + ")" if directions else "",
                 " (best)" if improved else "", self.valid_seconds)
        return result

    def _selection_key(self, result: dict) -> tuple[float, float]:
        """(BLEU, -perplexity); without validation data (step, 0): the latest is the best."""
        if result["valid_ppl"] is None:
            return (float(self.state.step), 0.0)
        return (result["valid_bleu"] if result["valid_bleu"] is not None else 0.0, -result["valid_ppl"])

    def _keep_if_best(self, result: dict, metadata: dict[str, str]) -> bool:
        """If ``result`` is the best so far, record it and save the model as ``model.safetensors``."""
        key = self._selection_key(result)
        if result["valid_loss"] is not None and not math.isfinite(result["valid_loss"]):
            log.warning("validation loss is %s: never the best model", result["valid_loss"])
            return False
        if key <= self.state.best_key:
            return False
        if not all(bool(torch.isfinite(p).all()) for p in self.params):
            log.warning("weights are not all finite: not written as %s", rundir.WEIGHTS)
            return False
        s = self.state
        s.best_bleu, s.best_ppl, s.best_key = result["valid_bleu"], result["valid_ppl"] or float("inf"), key
        rundir.save_weights(self.model, self.run_dir / rundir.WEIGHTS, metadata)
        return True

    def _keep_step_checkpoint(self) -> None:
        path = self.run_dir / STEP_WEIGHTS.format(step=self.state.step)
        rundir.save_weights(self.model, path, {"step": str(self.state.step)})
        if path not in self.step_ckpts:
            self.step_ckpts.append(path)

    def _prune_step_checkpoints(self) -> None:
        """Keep the last ``average_last`` step checkpoints; called after the state is saved, so
        that a resume from it still finds those it averages."""
        while len(self.step_ckpts) > self.config.train.average_last:
            self.step_ckpts.pop(0).unlink(missing_ok=True)

    def save_checkpoint(self) -> None:
        """Write ``checkpoints/last.pt``: everything a resume needs (rank 0's random state; the
        data position counts the batches of all processes, so any world size can resume it)."""
        progress = asdict(self.state)
        progress.update(elapsed_seconds=self.elapsed(), best_key=list(self.state.best_key),
                        log_bytes=self.metrics.size)
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "progress": progress,
                 "torch_rng": torch.get_rng_state(), "world_size": self.ranks.world_size,
                 "data": signature(self.config, self.data)}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        save_state(state, self.run_dir / LAST_STATE)

    def average_checkpoints(self) -> None:
        """Average the last validation checkpoints; keep the average as ``model.safetensors`` if
        it validates better than the best so far. The model's own weights are left unchanged."""
        backup = {k: v.clone() for k, v in self.model.state_dict().items()}
        averaged = {k: v.to(self.device) for k, v in average_weights(self.step_ckpts).items()}
        self.model.load_state_dict(averaged, strict=False)
        result = self._evaluate_or_stop()
        improved = self._keep_if_best(result, {"step": str(self.state.step), "averaged": str(len(self.step_ckpts))})
        self.metrics.write("average", step=self.state.step, checkpoints=len(self.step_ckpts), **result,
                           best=improved)
        log.info("average of %d checkpoints: ppl %.2f bleu %s%s", len(self.step_ckpts), result["valid_ppl"],
                 _fmt(result["valid_bleu"]), " (kept)" if improved else " (not better; discarded)")
        self.model.load_state_dict(backup)

    # ---- the loop -----------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> Share:
        """This process's training batches of ``epoch`` (``attnmt.train.data.epoch_share``: its
        share of the epoch's plan, from the batch the run has reached; the epoch's sample of the
        weighted corpora, by ``batch_sentences`` when set, else by ``batch_tokens``). Built once
        per epoch, from the lengths alone, after the previous epoch's are freed."""
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            self._epoch_batches = None
            start = self.state.batch_in_epoch if epoch == self.state.epoch else 0
            self._epoch_batches = (epoch, epoch_share(self.config, self.data, epoch, self.ranks, start))
        return self._epoch_batches[1]

    def end_epoch(self) -> None:
        """After a full epoch: with ``validate_every_epoch``, validate and log an 'epoch' record
        (train loss and perplexity over the epoch, valid loss and perplexity, the epoch's
        seconds); with ``epoch_checkpoints``, keep the weights as checkpoints/epoch_N.safetensors."""
        tc, s = self.config.train, self.state
        train = self.epoch_window.summary()
        seconds = time.monotonic() - self.epoch_window.start
        if tc.epoch_checkpoints and self.ranks.is_main:
            rundir.save_weights(self.model, self.run_dir / EPOCH_WEIGHTS.format(epoch=s.epoch + 1),
                                {"step": str(s.step), "epoch": str(s.epoch + 1)})
        if not tc.validate_every_epoch:
            return
        valid = self.validate() if s.step % tc.valid_every else self.last_valid
        if not self.ranks.is_main:
            return
        self.metrics.write("epoch", epoch=s.epoch + 1, step=s.step, train_loss=train["loss"], train_ppl=train["ppl"],
                           valid_loss=valid["valid_loss"], valid_ppl=valid["valid_ppl"], epoch_seconds=round(seconds, 3))
        log.info("epoch %d: train loss %.3f ppl %.2f | valid loss %.3f ppl %.2f | %.1f s", s.epoch + 1, train["loss"],
                 train["ppl"], valid["valid_loss"] or 0, valid["valid_ppl"] or 0, seconds)

    def stop_reason(self) -> str | None:
        """Why training must stop after the update just done, or None to go on (this process's
        view; the loop makes the processes agree)."""
        tc, step = self.config.train, self.state.step
        if tc.max_steps and step >= tc.max_steps:
            return f"reached max_steps {tc.max_steps}"
        if tc.max_minutes and self.elapsed() + 1.5 * self.valid_seconds + 5 >= tc.max_minutes * 60:
            return f"reached the {tc.max_minutes:g}-minute budget"
        return None

    def _log_window(self) -> None:
        s, summary, budget = self.state, self.window.summary(), self.config.train.max_minutes
        eta = f"{(budget * 60 - self.elapsed()) / 60:.0f}m" if budget else "-"
        self.bar.set_postfix(loss=f"{summary['loss']:.3f}", lr=f"{self._last_lr:.2e}",
                             tok_s=f"{summary['tgt_tokens_per_s']:.0f}", ep=s.epoch + 1, eta=eta)
        self.metrics.write("train", step=s.step, epoch=s.epoch + 1, seconds=round(self.elapsed(), 1),
                           loss=summary["loss"], ppl=summary["ppl"], lr=self._last_lr,
                           tgt_tokens_per_s=summary["tgt_tokens_per_s"], peak_rss_mib=peak_rss_mib(),
                           processes=self.ranks.world_size, **self._dropout_share())
        if self.bar.disable:
            log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s elapsed %.1f min", s.step, s.epoch + 1,
                     summary["loss"], self._last_lr, summary["tgt_tokens_per_s"], self.elapsed() / 60)
        self.window.reset()

    def _dropout_share(self) -> dict:
        """{'dropout_share': the share of the configured dropout rates in use} with
        ``train.dropout_curriculum``, else {}."""
        n = self.config.train.dropout_curriculum
        return {"dropout_share": round(curriculum_dropout(self.state.step, n), 4)} if n else {}

    def _next_update(self, batches: Share) -> list[Batch] | None:
        """This process's batches of the next update (``Share.update``: its part of the next
        ``world_size x accum_steps`` batches, as ``distributed.share`` deals them), on the CPU;
        None when the rest of the epoch cannot give every process one."""
        group = batches.update(self.state.batch_in_epoch, self.ranks.world_size * self.config.train.accum_steps)
        if group is None:
            return None
        corpus, start = self.data.train, self.config.model.decoder_start_id
        pairs = [corpus.pairs(idx) for idx in group]
        if self.subwords is not None:  # subword regularisation: each sentence segmented anew (train.subwords)
            pairs = [self.subwords(src, tgt, self.state.epoch, self.state.batch_in_epoch + k, self.ranks.rank)
                     for k, (src, tgt) in enumerate(pairs)]
        return [batch_from_arrays(src, tgt, start) for src, tgt in pairs]

    def _run_epoch(self, batches: Share) -> str | None:
        """Updates over the rest of one epoch's batches; returns a stop reason, or None at its end.

        Two small all-reduces per update keep the processes in step: before it, the update's
        target tokens and the stop-signal flags; after it, the summed loss and NLL and the
        stop flags (any process's stop reason stops all)."""
        tc, s, device = self.config.train, self.state, self.device
        while (built := self._next_update(batches)) is not None:
            local, local_sentences = sum(b.num_tgt_tokens for b in built), sum(b.tgt_out.size(0) for b in built)
            tokens, sentences, signalled = distributed.all_reduce_sum(
                [local, local_sentences, self.signals.received is not None], device)
            if signalled:
                self.interrupted_by = self.signals.received or "SIGTERM"
                return f"interrupted by {self.interrupted_by}"
            t0 = time.monotonic()
            self._last_lr = self.scheduler.get_last_lr()[0]  # the rate of this update
            done = self.train_step([b.to(device) for b in built], int(tokens), int(sentences))
            s.batch_in_epoch += min(self.ranks.world_size * tc.accum_steps, batches.total - s.batch_in_epoch)
            if done is None:  # a non-finite update, skipped (on every process)
                continue
            loss, nll, _ = done
            reason = self.stop_reason()
            loss, nll, stops = distributed.all_reduce_sum([loss, nll, reason is not None], device)
            reason = reason or ("another process stopped" if stops else None)
            self.run_tokens, self.run_seconds = self.run_tokens + int(tokens), self.run_seconds + time.monotonic() - t0
            self.window.add(int(tokens), loss, nll)
            self.epoch_window.add(int(tokens), loss, nll)
            self.bar.update(1)
            if s.step % tc.log_every == 0 and self.ranks.is_main:
                self._log_window()
            if s.step % tc.valid_every == 0 and reason is None:
                self.validate()
                self.window.start = time.monotonic()
                if tc.stop_patience and s.bad_validations >= tc.stop_patience:
                    reason = f"no improvement in {tc.stop_patience} validations"
            if reason:
                return reason
        return None

    def due_stop(self) -> str | None:
        """The stop condition that holds now, if any: :meth:`stop_reason`, ``max_epochs`` at an
        epoch's end, or ``stop_patience``. Lets a resumed run see that it is already over."""
        tc, s = self.config.train, self.state
        reason = self.stop_reason()
        if reason is None and tc.max_epochs and s.epoch >= tc.max_epochs:
            reason = f"reached max_epochs {tc.max_epochs}"
        if reason is None and tc.stop_patience and s.bad_validations >= tc.stop_patience:
            reason = f"no improvement in {tc.stop_patience} validations"
        return reason

    def run(self) -> TrainResult:
        """Train until a stop condition, validate a last time, average checkpoints if configured.
        A stop signal (SIGINT, SIGTERM) instead ends with a resumable checkpoint at the update
        boundary and no final validation; one during an evaluation ends it at once and saves
        nothing, so the checkpoint of the previous validation is the one to resume from.

        A resumed run that had stopped and whose stop condition still holds skips training (and
        the final validation, which it did); a finished one does nothing more.

        Returns:
            The run's :class:`TrainResult` (on every process); ``interrupted_by`` names the
            signal that stopped it, if any.
        """
        with self.signals:
            try:
                return self._run()
            except Interrupted as e:  # during an evaluation: its result is dropped
                self.interrupted_by = e.signal_name
                if self.bar is not None:
                    self.bar.close()
                return self._end_interrupted(f"interrupted by {e.signal_name} during validation", save=False)

    def _end_interrupted(self, reason: str, save: bool) -> TrainResult:
        """The end of a run that a stop signal interrupted: with ``save`` a resumable checkpoint
        of the update boundary reached, else nothing saved (the last checkpoint stays the one to
        resume from); an 'interrupted' record, which a resume cuts off."""
        result = self._result(reason)
        if self.ranks.is_main:
            if save:
                self.save_checkpoint()  # before the record, which a resume then cuts off
            self.metrics.write("interrupted", **asdict(result), processes=self.ranks.world_size)
            log.warning("%s at step %d: %s; continue with --resume", reason, self.state.step,
                        "resumable checkpoint saved" if save else
                        f"nothing saved since the last checkpoint ({self.run_dir / LAST_STATE})")
        distributed.barrier()
        return result

    def _run(self) -> TrainResult:
        tc, s = self.config.train, self.state
        if s.stop_reason is not None and self.due_stop() is None:  # resumed with a larger budget
            s.stop_reason, s.finished = None, False
        if s.finished:
            log.info("%s: the run is already finished (%s, step %d); nothing to do", self.run_dir, s.stop_reason,
                     s.step)
            return self._result()
        if s.stop_reason is None:
            if tc.init_from and s.step == 0 and s.best_key[0] == -math.inf:  # the starting model, as step 0
                self.validate()
            reason = self._train_until_stop()
            if self.interrupted_by:  # a stop signal: a resumable checkpoint, no final validation
                return self._end_interrupted(reason, save=True)
            s.stop_reason = reason
            self.validate()  # its saved state records the stop: a resume goes on from here
        else:
            log.info("resuming after the final validation (stopped: %s)", s.stop_reason)
        if (self.ranks.is_main and tc.average_last > 1 and len(self.step_ckpts) > 1
                and self.data.valid_sets):
            self.average_checkpoints()
        result = self._result(s.stop_reason)
        s.finished = True
        if self.ranks.is_main:
            compiles = {}
            if self.compiled:
                graphs, seconds = compiled_graphs()
                compiles = {"compiled_graphs": graphs, "compile_seconds": round(seconds, 1)}
                log.info("train.compile: %d graphs compiled in this process, in %.1f s", graphs, seconds)
            self.metrics.write("done", **asdict(result), precision=self.precision, processes=self.ranks.world_size,
                               last_valid_bleu=s.last_valid_bleu, **compiles)
            self.save_checkpoint()
            log.info("done: %d updates, %.1f epochs, %.1f minutes, best valid BLEU %s, %.0f tgt tok/s", s.step,
                     result.epochs_done, result.minutes, _fmt(s.best_bleu), result.tgt_tokens_per_second)
        distributed.barrier()
        return result

    def _train_until_stop(self) -> str:
        """Epochs of updates until a stop condition or a stop signal; returns the reason."""
        tc, s = self.config.train, self.state
        self.model.train()
        self.setup_seconds = self.elapsed()
        self.bar = tqdm(total=tc.max_steps, initial=s.step, disable=None if self.progress_bar and self.ranks.is_main
                        else True, unit="upd", dynamic_ncols=True, desc="train")
        reason = self.due_stop() if s.step else None
        while reason is None:
            self.epoch_window = Window()
            batches = self._plan_epoch()
            reason = f"interrupted by {self.interrupted_by}" if batches is None else self._run_epoch(batches)
            if reason is None:
                self.end_epoch()
                s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                if tc.max_epochs and s.epoch >= tc.max_epochs:
                    reason = f"reached max_epochs {tc.max_epochs}"
        self.bar.close()
        log.info("stopping: %s", reason)
        return reason

    def _plan_epoch(self) -> Share | None:
        """This process's batches of the epoch in progress (:meth:`epoch_batches`), or None when
        a stop signal came before or during the planning (then :attr:`interrupted_by` is set).
        Under torchrun every process plans the whole epoch: the processes agree on a stop at
        the next update's start."""
        if self.ranks.distributed:
            return self.epoch_batches(self.state.epoch)
        try:
            with self.signals.raising():
                return self.epoch_batches(self.state.epoch)
        except Interrupted as e:
            self.interrupted_by = e.signal_name
            return None

    def _result(self, reason: str | None = None) -> TrainResult:
        s, planned = self.state, self._epoch_batches
        per_epoch = (planned[1].total if planned and planned[0] == s.epoch else  # no plan built to count it
                     epoch_length(self.config, self.data, s.epoch) if s.batch_in_epoch else 1)
        return TrainResult(steps=s.step, epochs_done=s.epoch + s.batch_in_epoch / max(per_epoch, 1),
                           minutes=self.elapsed() / 60, best_valid_bleu=s.best_bleu, best_valid_ppl=s.best_ppl,
                           tgt_tokens_per_second=self.run_tokens / max(self.run_seconds, 1e-9),
                           stop_reason=reason or "", interrupted_by=self.interrupted_by)


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


def train(config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
          progress: bool = True, allow_data_change: bool = False) -> TrainResult:
    """``Trainer(config, run_dir, resume, data_dir, progress, allow_data_change).run()`` (see :class:`Trainer`),
    then leave the process group, if torchrun started this process.

    A stop signal during the setup (preparing the text, building the model) ends it at once:
    what it prepares is staged and every file it writes is renamed into place, so nothing
    half-written is left. A setup that refuses its input writes none of the run's files; a new
    run's directory (with the data it prepared) is removed, an existing one is left as it was
    but for data prepared again at the user's request (``allow_data_change``, or a changed text
    without ``resume``).

    Raises:
        ConfigError: the configuration has no data section (an imported model's, say).
        Interrupted: SIGINT or SIGTERM during the setup.
    """
    if config.data is None:
        raise ConfigError("the configuration has no data section: nothing to train on")
    stop_point()  # a stop that the caller's work (a distillation) received but did not raise
    new_run = not Path(run_dir).exists()
    try:
        with StopSignals(raising=True):
            try:
                trainer = Trainer(config, run_dir, resume, data_dir, progress, allow_data_change)
            except (AttnmtError, ValueError):  # refused (the CLI's exit status 2)
                if new_run and distributed.from_env().is_main:  # no run directory, data included
                    shutil.rmtree(run_dir, ignore_errors=True)
                raise
            return trainer.run()  # its own flag-only handlers while it trains
    finally:
        distributed.shutdown()


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
