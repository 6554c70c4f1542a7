"""The resumable training state, the best model, step checkpoints and their average.

    RUN_DIR/checkpoints/last.pt                everything a resume needs: weights, optimizer,
                                               schedule, step, data position, random state
    RUN_DIR/checkpoints/step_N.safetensors     recent validation weights, for averaging
    RUN_DIR/checkpoints/epoch_N.safetensors    the weights after epoch N (train.epoch_checkpoints)

What translation needs (config, SentencePiece models) is ``attnmt.rundir``'s; the run's
:class:`Checkpoints` writes its ``model.safetensors`` (the best weights so far: higher
validation BLEU, then lower perplexity). The state is written atomically and loaded with
``torch.load(weights_only=True)``, which never executes code from the file. Rank 0 alone
writes: the other processes of a torchrun have no :class:`Checkpoints`.

Library: torch (save/load), safetensors.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from attnmt import environment, rundir
from attnmt.config import Config
from attnmt.errors import CheckpointError
from attnmt.atomic import atomic_write
from attnmt.train import distributed
from attnmt.train.data import CorpusData, signature
from attnmt.train.trainer import Progress

if TYPE_CHECKING:
    from attnmt.train.trainer import Trainer

log = logging.getLogger(__name__)

LAST_STATE = "checkpoints/last.pt"
STEP_WEIGHTS = "checkpoints/step_{step}.safetensors"
EPOCH_WEIGHTS = "checkpoints/epoch_{epoch}.safetensors"  # kept with train.epoch_checkpoints


def save_state(state: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` a dict of tensors and plain values, atomically."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: str | Path) -> dict[str, Any]:
    """Load a training state with ``weights_only=True`` (no code execution).

    Raises:
        CheckpointError: missing or unreadable file, or a recorded number (the progress, the
            processes it was saved under) outside its range.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no training state to resume from")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise CheckpointError(f"{path}: unreadable training state: {e}") from None
    try:
        if not isinstance(state, dict):
            raise ValueError("not a training state")
        Progress.from_dict(state.get("progress"), "")
        if "world_size" in state:
            environment.WORLD_SIZE.range.check(state["world_size"], "world_size")
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}; resume from another copy or train anew") from None
    return state


def checkpoint_step(path: Path) -> int | None:
    """N of a ``step_N.safetensors`` file, None for a name of another form (``step_x``, ``step_-1``)."""
    found = re.fullmatch(r"step_([0-9]{1,18})", path.stem)
    return None if found is None else int(found.group(1))


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``checkpoints/step_N.safetensors`` files, oldest step first (files of another
    name beside them are not attnmt's and left alone)."""
    paths = [p for p in (run_dir / "checkpoints").glob("step_*.safetensors") if checkpoint_step(p) is not None]
    return sorted(paths, key=checkpoint_step)


def average_weights(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean (float32) of several safetensors weight files with the same tensors.

    Raises:
        CheckpointError: a file that is not readable safetensors or changed since it was written
            (``attnmt.rundir.read_weights``), named.
    """
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        for k, v in rundir.read_weights(p)[0].items():  # a damaged file: CheckpointError naming it
            total[k] = total[k] + v.float() if k in total else v.float().clone()
    return {k: v / len(paths) for k, v in total.items()}


def restore_random_state(trainer: "Trainer", saved: dict, seed: int) -> None:
    """After ``trainer`` loaded a saved state: rank 0 continues the saved random stream, other
    ranks reseed (``distributed.rank_seed`` of the step reached)."""
    if trainer.ranks.is_main:
        torch.set_rng_state(saved["torch_rng"])
        if trainer.device.type == "cuda" and "cuda_rng" in saved:
            torch.cuda.set_rng_state(saved["cuda_rng"], trainer.device)
    else:
        torch.manual_seed(distributed.rank_seed(seed, trainer.ranks.rank, trainer.progress.step))


class Checkpoints:
    """Rank 0's checkpoints of one run (module docstring).

    Args:
        run_dir: the model directory.
        config: the run's configuration (``train.average_last``; the data signature).
        data: the run's data, whose signature the state records (``attnmt.train.data``).
        trainer: the model, optimiser and progress to save.
        resumed: the run continues a saved state: keep the step checkpoints up to its step
            (later ones were written after it and are removed); a new run removes them all.
    """

    def __init__(self, run_dir: Path, config: Config, data: CorpusData, trainer: "Trainer", resumed: bool):
        self.run_dir = run_dir
        self.config = config
        self.data = data
        self.trainer = trainer
        self.steps: list[Path] = []  # the step checkpoints kept for averaging, oldest first
        for path in step_checkpoints(run_dir):
            if resumed and checkpoint_step(path) <= trainer.progress.step:
                self.steps.append(path)
            else:
                path.unlink()
        self.prune()

    def save(self, log_bytes: int) -> None:
        """Write ``checkpoints/last.pt``: everything a resume needs (the trainer's state, rank 0's
        random state, the length ``log_bytes`` of train_log.jsonl, the data signature; the data
        position counts the batches of all processes, so any world size can resume it)."""
        trainer = self.trainer
        state = trainer.state_dict()
        state["progress"]["log_bytes"] = log_bytes
        state.update(torch_rng=torch.get_rng_state(), world_size=trainer.ranks.world_size,
                     data=signature(self.config, self.data))
        if trainer.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(trainer.device)
        save_state(state, self.run_dir / LAST_STATE)

    def keep_if_best(self, result: dict, metadata: dict[str, str]) -> bool:
        """If the validation ``result`` (:meth:`Trainer.evaluate`) is the best so far, record it in
        the progress and save the weights as ``model.safetensors`` with ``metadata``. A
        non-finite loss, or weights that are not all finite, are never the best."""
        progress = self.trainer.progress
        key = selection_key(result, progress.step)
        if result["valid_loss"] is not None and not math.isfinite(result["valid_loss"]):
            log.warning("validation loss is %s: never the best model", result["valid_loss"])
            return False
        if key <= progress.best_key:
            return False
        if not all(bool(torch.isfinite(p).all()) for p in self.trainer.params):
            log.warning("weights are not all finite: not written as %s", rundir.WEIGHTS)
            return False
        progress.best_bleu = result["valid_bleu"]
        progress.best_ppl = result["valid_ppl"] or float("inf")
        progress.best_key = key
        rundir.save_weights(self.trainer.model, self.run_dir / rundir.WEIGHTS, metadata)
        return True

    def keep_step(self) -> None:
        """Keep the weights as ``checkpoints/step_N.safetensors``, for averaging."""
        step = self.trainer.progress.step
        path = self.run_dir / STEP_WEIGHTS.format(step=step)
        rundir.save_weights(self.trainer.model, path, {"step": str(step)})
        if path not in self.steps:
            self.steps.append(path)

    def keep_epoch(self, epoch: int) -> None:
        """Keep the weights after ``epoch`` (1-based) as ``checkpoints/epoch_N.safetensors``."""
        rundir.save_weights(self.trainer.model, self.run_dir / EPOCH_WEIGHTS.format(epoch=epoch),
                            {"step": str(self.trainer.progress.step), "epoch": str(epoch)})

    def prune(self) -> None:
        """Keep the last ``average_last`` step checkpoints; called after the state is saved, so
        that a resume from it still finds those it averages."""
        while len(self.steps) > self.config.train.average_last:
            self.steps.pop(0).unlink(missing_ok=True)

    @contextlib.contextmanager
    def averaged(self) -> Iterator[None]:
        """The model holds the average of the step checkpoints (:func:`average_weights`) inside
        the block and its own weights again after it."""
        model = self.trainer.model
        device = self.trainer.device
        backup = {k: v.clone() for k, v in model.state_dict().items()}
        averaged = {k: v.to(device) for k, v in average_weights(self.steps).items()}
        model.load_state_dict(averaged, strict=False)
        try:
            yield
        finally:
            model.load_state_dict(backup)


def selection_key(result: dict, step: int) -> tuple[float, float]:
    """(BLEU, -perplexity) of a validation result, higher is better; without validation data
    (step, 0): the latest is the best."""
    if result["valid_ppl"] is None:
        return (float(step), 0.0)
    bleu = result["valid_bleu"] if result["valid_bleu"] is not None else 0.0
    return (bleu, -result["valid_ppl"])
