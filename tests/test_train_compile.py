"""``train.compile``: the training step's encoder and decoder through torch.compile (inductor),
against the eager step it replaces: the same losses within float noise (same dropout masks), a
bit-exact resume with the switch on, a bounded number of compiled graphs over batches of many
lengths, and the option refused where it would do nothing."""

from __future__ import annotations

import json

import pytest
import torch

from attnmt.config import config_from_dict
from attnmt.errors import ConfigError
from attnmt.train.compiling import compiler_missing
from attnmt.train.loop import train
from tests.conftest import copy_task_config
from tests.test_end_to_end import straight_and_resumed

needs_compiler = pytest.mark.skipif(compiler_missing(torch.device("cpu")) is not None,
                                    reason="torch.compile's CPU backend needs a C++ compiler (Debian package g++)")


def _records(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _raw(tmp_path, max_steps: int, compile: bool) -> dict:
    raw = copy_task_config(tmp_path, max_steps=max_steps, log_every=1, valid_every=10, valid_bleu=False,
                           average_last=0, compile=compile)
    raw["model"]["dropout"] = 0.1  # the same masks in both: the draws are PyTorch's own
    return raw


@needs_compiler
def test_compiled_and_eager_losses_agree(tmp_path):
    """20 updates each way, fp32: every update's loss within 1e-4 (relative) of the eager one."""
    losses = {}
    for compile in (False, True):
        run = tmp_path / f"compile-{compile}"
        train(config_from_dict(_raw(tmp_path, 20, compile)), run, progress=False)
        losses[compile] = [r["loss"] for r in _records(run, "train")]
    assert len(losses[True]) == len(losses[False]) == 20
    for eager, compiled in zip(losses[False], losses[True]):
        assert compiled == pytest.approx(eager, rel=1e-4)
    done = _records(tmp_path / "compile-True", "done")[0]
    assert 1 <= done["compiled_graphs"] <= 8  # dynamic shapes: not one graph per batch shape
    assert done["compile_seconds"] > 0


@needs_compiler
def test_resume_with_compile_is_bit_exact(tmp_path):
    a, b = straight_and_resumed(_raw(tmp_path, 16, True), tmp_path, 8)
    assert a["progress"]["step"] == b["progress"]["step"] == 16
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_compile_with_per_sentence_loss_is_refused(tmp_path):
    raw = _raw(tmp_path, 2, True)
    raw["train"]["loss_normalization"] = "sentences"
    with pytest.raises(ConfigError, match="train.compile applies only to train.loss_normalization tokens"):
        config_from_dict(raw)


def test_compile_without_a_cpp_compiler_trains_eager(tmp_path, monkeypatch, caplog):
    """No C++ compiler on PATH: one warning naming the package, the run trains eager and its
    done record has no compiled graphs."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CXX", raising=False)
    run = tmp_path / "run"
    with caplog.at_level("WARNING"):
        train(config_from_dict(_raw(tmp_path, 2, True)), run, progress=False)
    assert any("no C++ compiler" in r.getMessage() and "g++" in r.getMessage() for r in caplog.records)
    done = _records(run, "done")[0]
    assert done["steps"] == 2 and "compiled_graphs" not in done
