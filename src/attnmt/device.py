"""Where a job runs: the device name of the configuration, resolved and checked, and the
per-device settings that go with it.

A device name is ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``. ``auto`` takes CUDA if
PyTorch sees a GPU, then Apple's MPS, then the CPU. Under torchrun (``LOCAL_RANK`` set) ``cuda``
and ``auto`` mean the GPU ``cuda:LOCAL_RANK`` of this process, one GPU per process as
``DistributedDataParallel`` expects. On CUDA, :func:`configure` allows TF32 matmuls (10-bit
mantissa inputs, float32 accumulation; NVIDIA Ampere and later), PyTorch's own advice for
training.

Batches are built on the CPU; for CUDA they are pinned (page-locked) so that the copy to the
GPU can be asynchronous (:func:`to_device`).

Library: torch (``torch.device``, ``torch.cuda``, ``torch.backends.mps``).
"""

from __future__ import annotations

import re

import torch

from attnmt.config import DEVICE_NAME
from attnmt.errors import ConfigError

_DEVICE_RE = re.compile(DEVICE_NAME)


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The ``torch.device`` that ``name`` means on this machine.

    Args:
        name: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.
        local_rank: this process's GPU slot under torchrun (``LOCAL_RANK``); 'cuda' and 'auto'
            then mean ``cuda:local_rank``. None for a single process (``cuda:0``).
    Raises:
        ConfigError: an unknown name, or a device this machine does not have.
    """
    if not _DEVICE_RE.match(name):
        raise ConfigError(f"device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r}: PyTorch sees no CUDA GPU on this machine")
        index = int(name.split(":")[1]) if ":" in name else (local_rank or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device cuda:{index}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
        return torch.device("cuda", index)
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps': PyTorch sees no Apple MPS device on this machine")
    return torch.device(name)


def configure(device: torch.device) -> None:
    """Per-device global settings, before the first operation on ``device``: on CUDA, make it
    the current GPU and allow TF32 matmuls and convolutions; nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def pin_for(device: torch.device) -> bool:
    """Whether CPU tensors bound for ``device`` should be pinned: only for CUDA (pinned memory
    lets the host-to-GPU copy overlap with computation)."""
    return device.type == "cuda"


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: unchanged on the CPU; for CUDA pinned, then copied without
    blocking the host (the copy is ordered before later kernels on the same stream)."""
    if tensor.device == device:
        return tensor
    if pin_for(device) and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
