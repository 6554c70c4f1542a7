"""Run-directory files: atomic saves, the model directory, the resumable training state.

A run directory is a self-contained model directory plus training state:

    config.yaml            the validated configuration
    spm.model              joint SentencePiece model (or src.spm.model and tgt.spm.model)
    model.safetensors      weights translation uses (the best validation checkpoint)
    checkpoints/last.pt    everything ``--resume`` needs: weights, optimizer, step, data position,
                           random states (loaded with ``torch.load(weights_only=True)``)
    checkpoints/step_N.safetensors   recent validation weights, for checkpoint averaging

Every file is written to a temporary name in the same directory and renamed into place, so a
crash leaves either the old or the new file, never a torn one. Loading never executes code:
weights are safetensors and the training state is loaded with ``weights_only=True``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, load_model, save_model
from torch import nn

from attnmt.errors import CheckpointError

WEIGHTS = "model.safetensors"
LAST_STATE = "checkpoints/last.pt"


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` and rename the result onto ``path`` (same filesystem, atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_weights(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write the model's parameters as safetensors (tied tensors stored once), atomically."""
    atomic_write(path, lambda tmp: save_model(model, tmp, metadata=metadata))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into ``model`` (strict: every parameter must match).

    Raises:
        CheckpointError: missing file, or names/shapes that do not fit the model.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: weights do not fit the configured model: {e}") from None
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def save_state(state: dict[str, Any], path: str | Path) -> None:
    """torch.save a dict of tensors and plain values, atomically."""
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


def average_weights(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of several safetensors weight files (float32)."""
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        for k, v in load_file(str(p)).items():
            total[k] = total[k] + v.float() if k in total else v.float().clone()
    return {k: v / len(paths) for k, v in total.items()}
