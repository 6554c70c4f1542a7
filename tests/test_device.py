"""Devices, precision per device, the loss scaler and the distributed helpers, run on this CPU:
the CUDA-only branches are driven through their logic (a GradScaler on the CPU, a faked CUDA
device count), and the single-process stop signal through a real SIGTERM."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from attnmt import device as device_module
from attnmt import precision
from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.data.batching import batch_from_arrays, make_batch
from attnmt.device import resolve_device, to_device
from attnmt.errors import ConfigError
from attnmt.signals import StopSignals
from attnmt.train import distributed
from attnmt.train.loop import TrainingRun

from .test_distributed import _raw_config


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """These runs use one thread (train.num_threads); give the other tests back their count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_device_names_resolve_and_bad_ones_are_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    _fake_gpus(monkeypatch, 0)
    assert resolve_device("cpu") == resolve_device("auto") == torch.device("cpu")
    for bad, message in (("gpu", "use auto, cpu"), ("cuda", "no CUDA GPU"), ("mps", "no Apple MPS"),
                         ("cuda:x", "use auto")):
        with pytest.raises(ConfigError, match=message):
            resolve_device(bad)
    _fake_gpus(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)  # torchrun's LOCAL_RANK
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)  # an explicit index wins
    with pytest.raises(ConfigError, match="has 2 CUDA GPU"):
        resolve_device("cuda:2")


def test_device_options_are_validated():
    raw = {"data": {"train_src": "a", "train_tgt": "b"}}
    config = config_from_dict({**raw, "train": {"device": "cuda:1"}, "decode": {"device": "mps"}})
    assert config.train.device == "cuda:1" and config.decode.device == "mps"
    assert config_from_dict(raw).train.device == config_from_dict(raw).decode.device == "auto"
    for section in ("train", "decode"):
        with pytest.raises(ConfigError, match=f"{section}.device"):
            config_from_dict({**raw, section: {"device": "gpu0"}})


def test_accum_steps_and_fp16_options():
    raw = {"data": {"train_src": "a", "train_tgt": "b"}}
    assert config_from_dict({**raw, "train": {"accum_steps": 3, "precision": "fp16"}}).train.accum_steps == 3
    with pytest.raises(ConfigError, match="train.accum_steps"):
        config_from_dict({**raw, "train": {"accum_steps": 0}})


def test_training_precision_per_device(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_is_fast", lambda: False)
    assert precision.training_precision("fp16", "cpu") == "fp32"
    assert precision.training_precision("bf16", "cpu") == "fp32"
    monkeypatch.setattr(precision, "cpu_bf16_is_fast", lambda: True)
    assert precision.training_precision("bf16", "cpu") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.training_precision("bf16", "cuda") == "fp16"  # pre-Ampere GPUs
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.training_precision("bf16", "cuda") == "bf16"
    assert precision.training_precision("fp16", "cuda") == "fp16"
    assert precision.training_precision("bf16", "mps") == "fp32"
    assert not precision.grad_scaler("bf16", "cuda").is_enabled()
    assert precision.grad_scaler("fp16", "cpu").is_enabled()  # a CUDA one too, where a GPU is present
    with pytest.raises(ValueError):
        precision.training_precision("int8", "cpu")


def test_to_device_keeps_cpu_tensors_and_pins_only_for_cuda():
    t = torch.arange(3)
    assert to_device(t, torch.device("cpu")) is t
    batch = make_batch([[5, 6]], [[7]])
    assert batch.to(torch.device("cpu")).src is batch.src
    assert device_module.pin_for(torch.device("cuda", 0)) and not device_module.pin_for(torch.device("cpu"))


@pytest.fixture
def tiny_trainer(tmp_path):
    """A one-process trainer of a tiny model (no training run)."""
    def make(name: str) -> TrainingRun:
        return TrainingRun(config_from_dict(_raw_config(tmp_path, 1, 5)), tmp_path / name, progress=False)
    return make


def test_train_step_through_an_active_loss_scaler(tiny_trainer):
    # The fp16 path of train_step (CUDA only in training) with a GradScaler on the CPU: with
    # finite gradients the update equals the unscaled one; an overflow skips the update and
    # halves the scale.
    plain, scaled = tiny_trainer("plain"), tiny_trainer("scaled")
    scaled.trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    corpus = plain.data.train
    batch = batch_from_arrays(*corpus.pairs(range(8)))
    for t in (plain, scaled):
        t.trainer.train_step([batch])
    for a, b in zip(plain.trainer.params, scaled.trainer.params):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert scaled.trainer.scaler.get_scale() == 2.0 ** 12
    before = [p.detach().clone() for p in scaled.trainer.params]
    hook = scaled.trainer.params[-1].register_hook(lambda g: g * float("inf"))  # as if float16 overflowed
    scaled.trainer.train_step([batch])
    hook.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.trainer.params))  # the update was skipped
    assert scaled.trainer.scaler.get_scale() == 2.0 ** 11
    assert scaled.progress.step == 2  # the update counts (the schedule moves on), as in PyTorch's recipe


def test_one_process_sigterm_saves_a_resumable_checkpoint(tiny_trainer, monkeypatch):
    training = tiny_trainer("run")
    step = training.trainer.train_step

    def step_then_signal(*args, **kwargs):
        out = step(*args, **kwargs)
        if training.progress.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(training.trainer, "train_step", step_then_signal)
    result = training.run()
    assert result.interrupted_by == "SIGTERM" and result.steps == 2
    state = torch.load(training.run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["progress"]["step"] == 2 and state["world_size"] == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is gone again


def test_distributed_helpers_without_a_process_group():
    assert distributed.from_env({}) == distributed.Ranks(0, 1, 0)
    ranks = distributed.from_env({"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "0"})
    assert (ranks.rank, ranks.world_size, ranks.is_main, ranks.distributed) == (1, 3, False, True)
    with pytest.raises(ConfigError, match="outside WORLD_SIZE=3"):
        distributed.from_env({"RANK": "3", "WORLD_SIZE": "3"})
    group = list(range(7))
    shares = [distributed.share(group, distributed.Ranks(r, 3)) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]  # disjoint, together the whole update
    assert distributed.share([0, 1], distributed.Ranks(2, 3)) == []
    assert distributed.all_reduce_sum([1.0, 2.0], torch.device("cpu")) == [1.0, 2.0]
    assert distributed.broadcast({"a": 1}, torch.device("cpu")) == {"a": 1}
    assert len({distributed.rank_seed(1, r, s) for r in (1, 2) for s in (0, 10)}) == 4
    # one dropout seed per (update, place in the update), the same whatever the world size
    assert len({distributed.batch_seed(1, s, i) for s in (0, 1, 2) for i in (0, 1, 2)}) == 9
    assert 0 <= distributed.batch_seed(2**40, 2**40, 7) < 2**63  # a valid torch.manual_seed value
    assert distributed.backend_for(torch.device("cuda", 0)) == "nccl"
    assert distributed.backend_for(torch.device("cpu")) == "gloo"


def test_stop_signals_flag_then_interrupt():
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C does not wait
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_cli_device_errors_are_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("data: {train_src: a, train_tgt: b}\n")
    assert main(["train", str(config), "--output", str(tmp_path / "o"), "--device", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnmt: error:") and "train.device" in err and "\n" not in err
