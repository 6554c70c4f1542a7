"""The resumable training state and checkpoint averaging.

    RUN_DIR/checkpoints/last.pt                everything ``--resume`` needs: weights, optimizer,
                                               schedule, step, data position, random state
    RUN_DIR/checkpoints/step_N.safetensors     recent validation weights, for averaging
    RUN_DIR/checkpoints/epoch_N.safetensors    the weights after epoch N (train.epoch_checkpoints)

What translation needs (config, SentencePiece models, ``model.safetensors``) is
``attnmt.rundir``'s. The state is written atomically and loaded with
``torch.load(weights_only=True)``, which never executes code from the file.

Library: torch (save/load), safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from attnmt.errors import CheckpointError
from attnmt.rundir import atomic_write

LAST_STATE = "checkpoints/last.pt"
STEP_WEIGHTS = "checkpoints/step_{step}.safetensors"
EPOCH_WEIGHTS = "checkpoints/epoch_{epoch}.safetensors"  # kept with train.epoch_checkpoints


def save_state(state: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` a dict of tensors and plain values, atomically."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: str | Path) -> dict[str, Any]:
    """Load a training state with ``weights_only=True`` (no code execution).

    Raises:
        CheckpointError: missing or unreadable file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no training state to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise CheckpointError(f"{path}: unreadable training state: {e}") from None


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``checkpoints/step_N.safetensors`` files, oldest step first."""
    return sorted((run_dir / "checkpoints").glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))


def average_weights(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean (float32) of several safetensors weight files with the same tensors."""
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        for k, v in load_file(str(p)).items():
            total[k] = total[k] + v.float() if k in total else v.float().clone()
    return {k: v / len(paths) for k, v in total.items()}
