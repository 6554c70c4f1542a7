"""Shared fixtures: the local Multi30k copy and tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.model.transformer import Transformer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")])])
def device(request) -> str:
    """The device a test builds its model on: 'cpu', and 'cuda' (mark ``cuda``: run with
    ``pytest -m cuda``) where PyTorch sees a GPU."""
    return request.param


@pytest.fixture
def multi30k_dir() -> Path:
    """The directory holding multi30k/*.gz (skips the test where it is absent)."""
    if not (SHARED_DATA / "multi30k" / "train.de.gz").is_file():
        pytest.skip("Multi30k not found in ../shared/data")
    return SHARED_DATA


def tiny_model(seed: int = 0, vocab: int = 40, device: str = "cpu", **overrides) -> Transformer:
    """A small randomly initialised Transformer in eval mode, on ``device``."""
    torch.manual_seed(seed)
    cfg = dict(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
               max_positions=128)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg), vocab, vocab).eval().to(device)
