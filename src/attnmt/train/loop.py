"""The training loop (paper section 5): epochs of updates, validation, signals, processes.

``TrainingRun(config, run_dir).run()`` (or :func:`train`) does the whole job: the setup
(``attnmt.train.setup``), then updates by the :class:`~attnmt.train.trainer.Trainer`. Every
``valid_every`` updates (:meth:`TrainingRun.validate`) it validates, keeps the best weights and
writes the resumable state (``attnmt.train.checkpoint``); it stops as ``attnmt.train.stop``
says, validates a last time and may average the last validation checkpoints. With
``train.init_from`` the starting model is validated as step 0; ``attnmt.train.report`` tells.

Exact resume: the state remembers the log's length (cut back to it on resume), whether the
run has stopped (then the final validation is done) and whether it has finished. Resuming a
finished run whose stop condition still holds does nothing; resuming after a kill during the
final validation or the averaging finishes the run as an uninterrupted one would.

Processes and signals: under torchrun the same loop runs data-parallel (``attnmt.train.distributed``;
rank 0 alone writes and validates). SIGINT and SIGTERM stop every rank at the same update
boundary with a resumable checkpoint; during the setup, the planning of an epoch (one process)
or an evaluation they stop it at once, keeping nothing half-done (``attnmt.signals``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from attnmt.config import Config
from attnmt.data.batching import Batch, batch_from_arrays
from attnmt.data.plan import Share
from attnmt.errors import CheckpointError, ConfigError
from attnmt.model.transformer import count_parameters
from attnmt.signals import Interrupted, StopSignals, stop_point
from attnmt.train import checkpoint, distributed
from attnmt.train.checkpoint import LAST_STATE, Checkpoints
from attnmt.train.compiling import compiled_graphs
from attnmt.train.data import epoch_length, epoch_share
from attnmt.train.report import Reporter, TrainResult
from attnmt.train.setup import removed_if_refused, set_up, write_run_files
from attnmt.train.stop import AFTER_UPDATE, AFTER_VALIDATION, ANY_MOMENT, AT_EPOCH_END, NonFiniteError, stop_reason
from attnmt.train.trainer import Progress, Trainer


class TrainingRun:
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
        ConfigError, DataError, CheckpointError: bad configuration, device, corpus or run
            directory (``attnmt.train.setup.RunExistsError``: a new run in a run's directory).
    """

    def __init__(self, config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
                 progress: bool = True, allow_data_change: bool = False):
        setup = set_up(config, run_dir, resume, data_dir, progress, allow_data_change)
        self.config = setup.config
        self.run_dir = setup.run_dir
        self.ranks = setup.ranks
        self.device = setup.device
        self.data = setup.data
        self.subwords = setup.subwords
        saved = setup.saved
        try:
            self.trainer = Trainer(setup.config, setup.model, setup.data, setup.ranks, setup.device, setup.precision,
                                   compile=setup.compile, frozen=bool(setup.frozen), saved=saved,
                                   start_time=setup.start_time)
        except (KeyError, RuntimeError, ValueError) as e:
            if saved is None:
                raise
            raise CheckpointError(f"{self.run_dir / LAST_STATE}: does not fit this run: {e}") from None
        if saved is not None:
            checkpoint.restore_random_state(self.trainer, saved, self.config.train.seed)
        elif self.ranks.rank > 0:
            torch.manual_seed(distributed.rank_seed(self.config.train.seed, self.ranks.rank, 0))
        write_run_files(setup)  # every check has passed: the run's first writes
        self.reporter = Reporter(self.run_dir, self.config, self.ranks, progress,
                                 self.progress.log_bytes if saved is not None else 0)
        self.checkpoints = (Checkpoints(self.run_dir, self.config, self.data, self.trainer, saved is not None)
                            if self.ranks.is_main else None)  # rank 0 alone writes
        if saved is None and setup.start_record is not None and self.ranks.is_main:
            self.reporter.init_from(setup.start_record, setup.frozen, count_parameters(setup.model))
        self.valid_seconds = 0.0  # duration of the last validation, reserved at the end of the budget
        self.run_tokens = 0  # target tokens of this process's updates, all processes together
        self.run_seconds = 0.0  # update time of this process
        self.last_lr = 0.0  # the learning rate of the latest update
        self.signals = StopSignals()  # flag only; evaluation and (one process) planning stop at once
        self.interrupted_by: str | None = None  # the signal that stopped the run
        self.last_valid: dict = {}  # the latest validation's result
        self._epoch_batches: tuple[int, Share] | None = None  # (epoch, this process's batches), once per epoch

    @property
    def progress(self) -> Progress:
        """Where the run stands (the trainer's, saved in the resumable state)."""
        return self.trainer.progress

    def _stop(self, moment: str) -> str | None:
        return stop_reason(self.config.train, self.progress, moment, self.trainer.elapsed(), self.valid_seconds)

    # ---- validation -------------------------------------------------------------------------

    def validate(self) -> dict:
        """Evaluate, keep the best weights and a step checkpoint, save the state, report. Rank 0
        does it; every rank gets the result, the count of validations without improvement and
        the time it took (so that every rank takes the same stop decisions).

        Raises:
            Interrupted: (on every process) a stop signal reached rank 0 during the
                evaluation, before anything was written.
        """
        result = None
        stopped = None
        if self.ranks.is_main:
            try:
                result = self._validate_and_keep()
            except Interrupted as e:
                stopped = e.signal_name
        shared = (result, self.progress.bad_validations, self.valid_seconds, stopped)
        result, self.progress.bad_validations, self.valid_seconds, stopped = distributed.broadcast(shared, self.device)
        if stopped:
            raise Interrupted(stopped)
        self.last_valid = result
        return result

    def _validate_and_keep(self) -> dict:
        """Rank 0's part of :meth:`validate`; a stop signal ends the evaluation at once."""
        progress = self.progress
        started = time.monotonic()
        with self.signals.raising():
            result = self.trainer.evaluate()
        self.valid_seconds = time.monotonic() - started
        improved = self.checkpoints.keep_if_best(result, {"step": str(progress.step)})
        progress.bad_validations = 0 if improved else progress.bad_validations + 1
        progress.last_valid_bleu = result["valid_bleu"]
        if self.config.train.average_last > 1 and progress.step > 0:  # never average in a fine-tuning run's start
            self.checkpoints.keep_step()
        # The record first, then the state that remembers the log's length: a resume from an
        # older state cuts the record away and validates again.
        self.reporter.valid(progress, result, improved, self.trainer.elapsed(), self.valid_seconds)
        self.checkpoints.save(self.reporter.log_bytes)
        self.checkpoints.prune()
        return result

    def average_checkpoints(self) -> None:
        """Average the last validation checkpoints; keep the average as ``model.safetensors`` if
        it validates better than the best so far. The model's own weights are left unchanged."""
        steps = self.checkpoints.steps
        with self.checkpoints.averaged():
            with self.signals.raising():
                result = self.trainer.evaluate()
            improved = self.checkpoints.keep_if_best(result, {"step": str(self.progress.step),
                                                              "averaged": str(len(steps))})
            self.reporter.average(self.progress.step, len(steps), result, improved)

    # ---- the loop ---------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> Share:
        """This process's share of ``epoch``'s batches from the batch the run has reached
        (``attnmt.train.data.epoch_share``), built once per epoch after the previous one is freed."""
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            self._epoch_batches = None
            start = self.progress.batch_in_epoch if epoch == self.progress.epoch else 0
            self._epoch_batches = (epoch, epoch_share(self.config, self.data, epoch, self.ranks, start))
        return self._epoch_batches[1]

    def end_epoch(self) -> None:
        """After a full epoch: with ``validate_every_epoch``, validate and report an 'epoch'
        record; with ``epoch_checkpoints``, keep the weights as checkpoints/epoch_N.safetensors."""
        tc = self.config.train
        progress = self.progress
        summary = self.reporter.epoch_summary()  # the epoch's updates, before the validation
        if tc.epoch_checkpoints and self.ranks.is_main:
            self.checkpoints.keep_epoch(progress.epoch + 1)
        if not tc.validate_every_epoch:
            return
        valid = self.validate() if progress.step % tc.valid_every else self.last_valid
        if self.ranks.is_main:
            self.reporter.epoch(progress, summary, valid)

    def _next_update(self, batches: Share) -> list[Batch] | None:
        """This process's batches of the next update (``Share.update``: its part of the next
        ``world_size x accum_steps`` batches, as ``distributed.share`` deals them), on the CPU;
        None when the rest of the epoch cannot give every process one."""
        progress = self.progress
        group = batches.update(progress.batch_in_epoch, self.ranks.world_size * self.config.train.accum_steps)
        if group is None:
            return None
        start = self.config.model.decoder_start_id
        pairs = [self.data.train.pairs(idx) for idx in group]
        if self.subwords is not None:  # subword regularisation: each sentence segmented anew (train.subwords)
            pairs = [self.subwords(src, tgt, progress.epoch, progress.batch_in_epoch + k, self.ranks.rank)
                     for k, (src, tgt) in enumerate(pairs)]
        return [batch_from_arrays(src, tgt, start) for src, tgt in pairs]

    def _run_epoch(self, batches: Share) -> str | None:
        """Updates over the rest of one epoch's batches; returns a stop reason, or None at its end.

        Two small all-reduces per update keep the processes in step: before it, the update's
        target tokens and the stop-signal flags; after it, the summed loss and NLL and the
        stop flags (any process's stop reason stops all)."""
        tc = self.config.train
        progress = self.progress
        device = self.device
        while (built := self._next_update(batches)) is not None:
            local_tokens = sum(b.num_tgt_tokens for b in built)
            local_sentences = sum(b.tgt_out.size(0) for b in built)
            tokens, sentences, signalled = distributed.all_reduce_sum(
                [local_tokens, local_sentences, self.signals.received is not None], device)
            if signalled:
                self.interrupted_by = self.signals.received or "SIGTERM"
                return f"interrupted by {self.interrupted_by}"
            started = time.monotonic()
            self.last_lr = self.trainer.learning_rate()  # the rate of this update
            done = self.trainer.train_step([b.to(device) for b in built], int(tokens), int(sentences))
            if done is None:  # a non-finite update, skipped (on every process)
                self._skipped_update()
            update_batches = self.ranks.world_size * tc.accum_steps
            progress.batch_in_epoch += min(update_batches, batches.total - progress.batch_in_epoch)
            if done is None:
                continue
            reason = self._stop(AFTER_UPDATE)
            loss, nll, stops = distributed.all_reduce_sum([done[0], done[1], reason is not None], device)
            if reason is None and stops:
                reason = "another process stopped"
            self.run_tokens += int(tokens)
            self.run_seconds += time.monotonic() - started
            self.reporter.update(int(tokens), loss, nll)
            if progress.step % tc.log_every == 0 and self.ranks.is_main:
                self.reporter.train(progress, self.last_lr, self.trainer.elapsed())
            if progress.step % tc.valid_every == 0 and reason is None:
                self.validate()
                self.reporter.window.start = time.monotonic()
                reason = self._stop(AFTER_VALIDATION)
            if reason:
                return reason
        return None

    def _skipped_update(self) -> None:
        """Report an update skipped for a non-finite loss or gradient norm.

        Raises:
            NonFiniteError: ``train.max_nonfinite_updates`` in a row; the last finite state is
                saved first (with the counter reset), so a resume goes on from there.
        """
        progress = self.progress
        limit = self.config.train.max_nonfinite_updates
        self.reporter.nonfinite(progress, *self.trainer.skipped)
        if progress.nonfinite_in_a_row < limit:
            return
        progress.nonfinite_in_a_row = 0
        if self.ranks.is_main:
            self.checkpoints.save(self.reporter.log_bytes)
        raise NonFiniteError(limit, progress.step, self.run_dir / LAST_STATE)

    def run(self) -> TrainResult:
        """Train until a stop condition, validate a last time, average checkpoints if configured.
        A stop signal ends instead with a resumable checkpoint at the update boundary, or, during
        an evaluation, at once with nothing saved (the previous validation's checkpoint is the one
        to resume from). A resumed run that had stopped skips what it did; a finished one does
        nothing more.

        Returns:
            The run's :class:`TrainResult` (on every process); ``interrupted_by`` names the
            signal that stopped it, if any.
        """
        with self.signals:
            try:
                return self._run()
            except Interrupted as e:  # during an evaluation: its result is dropped
                self.interrupted_by = e.signal_name
                self.reporter.close_bar()
                return self._end_interrupted(f"interrupted by {e.signal_name} during validation", save=False)

    def _end_interrupted(self, reason: str, save: bool) -> TrainResult:
        """End a run that a stop signal interrupted: with ``save`` a resumable checkpoint of the
        update boundary reached (else the last one stays); an 'interrupted' record."""
        result = self._result(reason)
        if self.ranks.is_main:
            if save:
                self.checkpoints.save(self.reporter.log_bytes)  # before the record, which a resume then cuts off
            self.reporter.interrupted(result, reason, self.progress.step, save, self.run_dir / LAST_STATE)
        distributed.barrier()
        return result

    def _run(self) -> TrainResult:
        tc = self.config.train
        progress = self.progress
        if progress.stop_reason is not None and self._stop(ANY_MOMENT) is None:  # resumed with a larger budget
            progress.stop_reason = None
            progress.finished = False
        if progress.finished:
            self.reporter.note("%s: the run is already finished (%s, step %d); nothing to do", self.run_dir,
                               progress.stop_reason, progress.step)
            return self._result()
        if progress.stop_reason is None:
            if tc.init_from and progress.step == 0 and progress.best_key[0] == -math.inf:  # the starting model
                self.validate()
            reason = self._train_until_stop()
            if self.interrupted_by:  # a stop signal: a resumable checkpoint, no final validation
                return self._end_interrupted(reason, save=True)
            progress.stop_reason = reason
            self.validate()  # its saved state records the stop: a resume goes on from here
        else:
            self.reporter.note("resuming after the final validation (stopped: %s)", progress.stop_reason)
        if self.ranks.is_main and tc.average_last > 1 and len(self.checkpoints.steps) > 1 and self.data.valid_sets:
            self.average_checkpoints()
        result = self._result(progress.stop_reason)
        progress.finished = True
        if self.ranks.is_main:
            compiles = compiled_graphs() if self.trainer.compiles else None
            self.reporter.done(result, self.trainer.precision, progress, compiles)
            self.checkpoints.save(self.reporter.log_bytes)
            self.reporter.finished(result, progress)
        distributed.barrier()
        return result

    def _train_until_stop(self) -> str:
        """Epochs of updates until a stop condition or a stop signal; returns the reason."""
        progress = self.progress
        self.trainer.model.train()
        self.trainer.setup_seconds = self.trainer.elapsed()
        self.reporter.start_updates(progress)
        reason = self._stop(ANY_MOMENT) if progress.step else None
        while reason is None:
            self.reporter.start_epoch()
            batches = self._plan_epoch()
            if batches is None:
                reason = f"interrupted by {self.interrupted_by}"
            else:
                reason = self._run_epoch(batches)
            if reason is None:
                self.end_epoch()
                progress.epoch += 1
                progress.batch_in_epoch = 0
                reason = self._stop(AT_EPOCH_END)
        self.reporter.close_bar()
        self.reporter.note("stopping: %s", reason)
        return reason

    def _plan_epoch(self) -> Share | None:
        """:meth:`epoch_batches` of the epoch in progress, or None when a stop signal came before or
        during the planning (one process; under torchrun the processes agree on a stop at the next
        update's start)."""
        if self.ranks.distributed:
            return self.epoch_batches(self.progress.epoch)
        try:
            with self.signals.raising():
                return self.epoch_batches(self.progress.epoch)
        except Interrupted as e:
            self.interrupted_by = e.signal_name
            return None

    def _result(self, reason: str | None = None) -> TrainResult:
        progress = self.progress
        planned = self._epoch_batches
        if planned and planned[0] == progress.epoch:
            per_epoch = planned[1].total
        elif progress.batch_in_epoch:  # no plan built to count it
            per_epoch = epoch_length(self.config, self.data, progress.epoch)
        else:
            per_epoch = 1
        epochs_done = progress.epoch + progress.batch_in_epoch / max(per_epoch, 1)
        return TrainResult(steps=progress.step, epochs_done=epochs_done, minutes=self.trainer.elapsed() / 60,
                           best_valid_bleu=progress.best_bleu, best_valid_ppl=progress.best_ppl,
                           tgt_tokens_per_second=self.run_tokens / max(self.run_seconds, 1e-9),
                           stop_reason=reason or "", interrupted_by=self.interrupted_by)


def train(config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
          progress: bool = True, allow_data_change: bool = False) -> TrainResult:
    """``TrainingRun(config, run_dir, resume, data_dir, progress, allow_data_change).run()`` (see
    :class:`TrainingRun`), then leave the process group, if torchrun started this process.

    A stop signal during the setup ends it at once, and a refused setup writes none of the run's
    files (``attnmt.train.setup``): nothing half-written is left.

    Raises:
        ConfigError: the configuration has no data section (an imported model's, say).
        Interrupted: SIGINT or SIGTERM during the setup. EnvironmentFailure: ``distributed.peer_failures``.
    """
    if config.data is None:
        raise ConfigError("the configuration has no data section: nothing to train on")
    stop_point()  # a stop that the caller's work (a distillation) received but did not raise
    try:
        with StopSignals(raising=True), distributed.peer_failures(Path(run_dir) / LAST_STATE):
            with removed_if_refused(run_dir):  # a refused new run leaves no directory
                run = TrainingRun(config, run_dir, resume, data_dir, progress, allow_data_change)
            return run.run()  # its own flag-only handlers while it trains
    finally:
        distributed.shutdown()
