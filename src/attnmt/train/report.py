"""What a training run tells: the progress bar, the log lines and ``train_log.jsonl``.

One :class:`Reporter` per process: rank 0 writes the metrics records (``attnmt.train.metrics``:
'train' every ``log_every`` updates, 'valid', 'epoch', 'average', 'nonfinite', 'init_from',
'interrupted' and 'done') and shows a tqdm bar on a terminal (else a log line per 'train'
record); every process logs its warnings. The loss windows (the updates since the last 'train'
record, and the epoch in progress) are the reporter's.

Library: tqdm, logging.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from attnmt.config import Config
from attnmt.memory import peak_rss_mib
from attnmt.train import distributed
from attnmt.train.metrics import MetricsLog, Window
from attnmt.train.schedules import curriculum_dropout

if TYPE_CHECKING:
    from attnmt.train.trainer import Progress

log = logging.getLogger(__name__)

LOG_NAME = "train_log.jsonl"


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


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


class Reporter:
    """The run's progress bar, log lines and metrics records (module docstring).

    Args:
        run_dir: the model directory, holding ``train_log.jsonl``.
        config: the run's configuration (``train.max_minutes``, ``train.dropout_curriculum``).
        ranks: this process's place; rank 0 alone writes records and shows the bar.
        show_bar: show a tqdm bar on a terminal.
        log_bytes: cut the log back to this many bytes (0 for a new run; a resumed run's state
            remembers its length).
    """

    def __init__(self, run_dir: Path, config: Config, ranks: distributed.Ranks, show_bar: bool, log_bytes: int | None):
        self.config = config
        self.ranks = ranks
        self.show_bar = show_bar
        self.metrics = MetricsLog(run_dir / LOG_NAME, truncate_to=log_bytes) if ranks.is_main else None
        self.window = Window()  # the updates since the last 'train' record
        self.epoch_window = Window()  # the epoch in progress
        self.bar: tqdm | None = None  # while the updates run

    @property
    def log_bytes(self) -> int | None:
        """The length of train_log.jsonl (rank 0; None elsewhere)."""
        return self.metrics.size if self.metrics is not None else None

    def start_updates(self, progress: "Progress") -> None:
        """Open the progress bar at the update reached."""
        disable = None if self.show_bar and self.ranks.is_main else True
        self.bar = tqdm(total=self.config.train.max_steps, initial=progress.step, disable=disable, unit="upd",
                        dynamic_ncols=True, desc="train")

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, tokens: int, loss: float, nll: float) -> None:
        """Count an update's target tokens (all processes), summed loss and NLL."""
        self.window.add(tokens, loss, nll)
        self.epoch_window.add(tokens, loss, nll)
        self.bar.update(1)

    def start_epoch(self) -> None:
        self.epoch_window = Window()

    def train(self, progress: "Progress", lr: float, seconds: float) -> None:
        """A 'train' record of the window since the last one (rank 0), then a new window.
        ``lr``: the latest update's learning rate; ``seconds``: the run's wall clock."""
        summary = self.window.summary()
        budget = self.config.train.max_minutes
        eta = f"{(budget * 60 - seconds) / 60:.0f}m" if budget else "-"
        self.bar.set_postfix(loss=f"{summary['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{summary['tgt_tokens_per_s']:.0f}",
                             ep=progress.epoch + 1, eta=eta)
        self.metrics.write("train", step=progress.step, epoch=progress.epoch + 1, seconds=round(seconds, 1),
                           loss=summary["loss"], ppl=summary["ppl"], lr=lr,
                           tgt_tokens_per_s=summary["tgt_tokens_per_s"], peak_rss_mib=peak_rss_mib(),
                           processes=self.ranks.world_size, **self._dropout_share(progress.step))
        if self.bar.disable:
            log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s elapsed %.1f min", progress.step,
                     progress.epoch + 1, summary["loss"], lr, summary["tgt_tokens_per_s"], seconds / 60)
        self.window.reset()

    def _dropout_share(self, step: int) -> dict:
        """{'dropout_share': the share of the configured dropout rates in use} with
        ``train.dropout_curriculum``, else {}."""
        n = self.config.train.dropout_curriculum
        if not n:
            return {}
        return {"dropout_share": round(curriculum_dropout(step, n), 4)}

    def valid(self, progress: "Progress", result: dict, improved: bool, seconds: float, valid_seconds: float) -> None:
        """A 'valid' record and its log line (rank 0)."""
        self.metrics.write("valid", step=progress.step, epoch=progress.epoch + 1, seconds=round(seconds, 1), **result,
                           best=improved)
        directions = result.get("valid_directions")
        per_direction = ""
        if directions:
            per_direction = " (bleu " + ", ".join(f"{k} {v['bleu']:.2f}" for k, v in directions.items()) + ")"
        log.info("step %d valid: loss %.3f ppl %.2f bleu %s chrf %s%s%s (%.1fs)", progress.step,
                 result["valid_loss"] or 0, result["valid_ppl"] or 0, _fmt(result["valid_bleu"]),
                 _fmt(result["valid_chrf"]), per_direction, " (best)" if improved else "", valid_seconds)

    def epoch_summary(self) -> dict[str, float]:
        """The epoch's train loss and perplexity (:meth:`Window.summary`) and 'seconds' so far."""
        return {**self.epoch_window.summary(), "seconds": time.monotonic() - self.epoch_window.start}

    def epoch(self, progress: "Progress", train: dict[str, float], valid: dict) -> None:
        """An 'epoch' record (rank 0): ``train`` (:meth:`epoch_summary`) and ``valid``'s loss and
        perplexity."""
        self.metrics.write("epoch", epoch=progress.epoch + 1, step=progress.step, train_loss=train["loss"],
                           train_ppl=train["ppl"], valid_loss=valid["valid_loss"], valid_ppl=valid["valid_ppl"],
                           epoch_seconds=round(train["seconds"], 3))
        log.info("epoch %d: train loss %.3f ppl %.2f | valid loss %.3f ppl %.2f | %.1f s", progress.epoch + 1,
                 train["loss"], train["ppl"], valid["valid_loss"] or 0, valid["valid_ppl"] or 0, train["seconds"])

    def average(self, step: int, checkpoints: int, result: dict, improved: bool) -> None:
        """An 'average' record of the average of ``checkpoints`` step checkpoints (rank 0)."""
        self.metrics.write("average", step=step, checkpoints=checkpoints, **result, best=improved)
        log.info("average of %d checkpoints: ppl %.2f bleu %s%s", checkpoints, result["valid_ppl"],
                 _fmt(result["valid_bleu"]), " (kept)" if improved else " (not better; discarded)")

    def nonfinite(self, progress: "Progress", loss: float, grad_norm: float) -> None:
        """A skipped update: a warning (every process) and a 'nonfinite' record (rank 0)."""
        log.warning("step %d: loss %s, gradient norm %s: update skipped (%d in a row, %d in all)", progress.step + 1,
                    loss, grad_norm, progress.nonfinite_in_a_row, progress.nonfinite_total)
        if self.metrics is not None:
            self.metrics.write("nonfinite", step=progress.step, epoch=progress.epoch + 1, loss=loss,
                               grad_norm=grad_norm, in_a_row=progress.nonfinite_in_a_row,
                               total=progress.nonfinite_total)

    def init_from(self, start_record: dict, frozen: list[str], trainable_parameters: int) -> None:
        """Fine-tuning: an 'init_from' record of the starting model (rank 0)."""
        self.metrics.write("init_from", **start_record, frozen=frozen, trainable_parameters=trainable_parameters)

    def interrupted(self, result, reason: str, step: int, saved: bool, last_state: Path) -> None:
        """An 'interrupted' record of the :class:`TrainResult` and a warning (rank 0)."""
        self.metrics.write("interrupted", **asdict(result), processes=self.ranks.world_size)
        log.warning("%s at step %d: %s", reason, step, "resumable checkpoint saved" if saved else
                    f"nothing saved since the last checkpoint ({last_state})")

    def done(self, result, precision: str, progress: "Progress", compiles: tuple[int, float] | None) -> None:
        """The 'done' record of the :class:`TrainResult` (rank 0); ``compiles``: (graphs,
        seconds) with ``train.compile``."""
        extra = {}
        if compiles is not None:
            extra = {"compiled_graphs": compiles[0], "compile_seconds": round(compiles[1], 1)}
            log.info("train.compile: %d graphs compiled in this process, in %.1f s", *compiles)
        self.metrics.write("done", **asdict(result), precision=precision, processes=self.ranks.world_size,
                           last_valid_bleu=progress.last_valid_bleu, **extra)

    def finished(self, result, progress: "Progress") -> None:
        log.info("done: %d updates, %.1f epochs, %.1f minutes, best valid BLEU %s, %.0f tgt tok/s", progress.step,
                 result.epochs_done, result.minutes, _fmt(progress.best_bleu), result.tgt_tokens_per_second)

    def note(self, message: str, *args) -> None:
        """A log line about the run's course (resumed, stopping, nothing to do)."""
        log.info(message, *args)
