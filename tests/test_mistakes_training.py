"""Training mistakes and stop signals: corpus weights that sample no pair, a freeze that leaves
nothing to train, and SIGTERM/SIGINT during preparation, epoch planning, training, validation
and distillation (real ``python -m attnmt`` processes for the signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from attnmt.config import config_from_dict
from attnmt.data.prepare import prepare
from attnmt.signals import Interrupted, StopSignals, stop_point
from attnmt.train import loop as loop_module
from attnmt.train.loop import TrainingRun
from tests.conftest import COPY_WORDS, copy_task_config
from tests.test_hardening import assert_one_line_error, run_cli

STOP_SECONDS = 20  # a generous bound on how long a stop may take on a busy machine
ROOT = Path(__file__).resolve().parents[1]


def write_config(tmp_path: Path, raw: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def weighted(tmp_path: Path, weights: list[float], **train) -> dict:
    """The copy task with its training pairs as ``data.train`` entries of these weights."""
    raw = copy_task_config(tmp_path, **train)
    d = raw["data"]
    d["train"] = [{"src": d["train_src"], "tgt": d["train_tgt"], "weight": w} for w in weights]
    d["train_src"] = d["train_tgt"] = None
    return raw


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ---- refused before training ------------------------------------------------------------------

@pytest.mark.parametrize("weights", [[1e-9], [1e-9, 1e-9], [0.0001, 0.001]])
def test_weights_that_sample_no_pair_are_refused(tmp_path, capsys, weights):
    config = write_config(tmp_path, weighted(tmp_path, weights))
    inputs = snapshot(tmp_path)
    rc, out, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "data.train", "weight", "no training pair")
    assert out == "" and not (tmp_path / "run" / "config.yaml").exists()  # refused before the run is written
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run/")} == inputs  # inputs unchanged


def test_weights_that_sample_no_pair_are_refused_from_a_prepared_directory(tmp_path, capsys):
    raw = weighted(tmp_path, [1e-9])
    prepared = tmp_path / "prepared"
    prepare(config_from_dict(raw), prepared)
    before = snapshot(prepared)
    raw["data"] = {"prepared": str(prepared)}
    rc, _, err = run_cli(capsys, "train", str(write_config(tmp_path, raw)), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "data.train", "weight")
    assert snapshot(prepared) == before and not (tmp_path / "run").exists()


def test_a_small_weight_that_still_samples_pairs_trains(tmp_path):
    raw = weighted(tmp_path, [1e-9, 0.05], max_steps=2, valid_every=2)  # 20 pairs an epoch
    result = loop_module.train(config_from_dict(raw), tmp_path / "run", progress=False)
    assert result.steps == 2 and result.interrupted_by is None


@pytest.mark.parametrize("freeze", [["embeddings", "encoder", "decoder"], ["*"], ["decoder", "encoder.*", "embeddings"]])
def test_freezing_every_parameter_is_refused(tmp_path, capsys, freeze):
    config = write_config(tmp_path, copy_task_config(tmp_path, freeze=freeze))
    rc, out, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "train.freeze leaves no parameter to train")
    assert out == "" and not (tmp_path / "run" / "checkpoints").exists()


def test_a_freeze_pattern_that_matches_nothing_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, copy_task_config(tmp_path, freeze=["encoder", "no_such_layer.*"]))
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "train.freeze", "'no_such_layer.*'", "matches no parameter")


def test_freezing_some_groups_still_trains(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=2, valid_every=2, freeze=["embeddings", "encoder"])
    result = loop_module.train(config_from_dict(raw), tmp_path / "run", progress=False)
    assert result.steps == 2


# ---- the stop mechanism in this process ---------------------------------------------------------

def test_raising_stop_signals_raise_at_once_with_the_exit_code():
    with StopSignals() as stop:
        with pytest.raises(Interrupted) as caught:
            with stop.raising():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # never reached: the handler raises
        assert caught.value.exit_code == 128 + signal.SIGTERM and stop.received == "SIGTERM"
        with pytest.raises(Interrupted):  # a signal received earlier stops the next raising block at its start
            with stop.raising():
                pass


def test_a_stop_that_python_swallows_is_raised_at_the_next_stop_point(capsys):
    class SignalledWhileCollected:
        def __del__(self):  # Python ignores what a __del__ raises ("Exception ignored in ...")
            os.kill(os.getpid(), signal.SIGTERM)

    with StopSignals(raising=True) as stop:
        SignalledWhileCollected()  # collected at once: the stop is raised in __del__ and swallowed
        assert stop.received == "SIGTERM" and capsys.readouterr().err == ""  # silently
        with pytest.raises(Interrupted):
            stop_point()
    stop_point()  # nothing entered: nothing to raise


@pytest.mark.parametrize("call", ["encode", "sample"])
def test_a_stop_while_workers_start_leaves_no_worker_running(monkeypatch, call):
    """A stop raised between two workers' starts left the first one running."""
    import multiprocessing.process

    from attnmt.data import encoding, sampling

    start_worker = multiprocessing.process.BaseProcess.start

    def signalled_while_starting(process):
        start_worker(process)  # the worker is forked
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, between two starts
        sum(range(1000))

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", signalled_while_starting)
    with StopSignals(raising=True), pytest.raises(Interrupted):
        if call == "sample":
            sampling._in_parallel(len, [("a",), ("b",)], workers=2)
        else:
            list(encoding.encode_stream(iter([]), None, None, None, np.dtype(np.uint16), workers=2))
    assert multiprocessing.active_children() == []  # killed and joined, not left behind


class DiesWhileSent:
    """A result whose sending kills the worker (as the kernel's out-of-memory killer would)."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)


def answer(kind: str):
    return DiesWhileSent() if kind == "dies" else kind


def test_a_worker_that_dies_while_it_answers_is_an_error_not_a_hang():
    import multiprocessing

    from attnmt.data.workers import imap
    from attnmt.errors import EnvironmentFailure

    with pytest.raises(EnvironmentFailure, match="ended without answering .killed by SIGKILL"):  # a Pool hung
        list(imap(answer, [("ok",), ("dies",), ("ok",)], workers=2))
    assert multiprocessing.active_children() == []


def test_a_ctrl_c_that_reaches_the_workers_leaves_the_decision_to_attnmt():
    """A terminal's Ctrl-C reaches every process of its group: a worker ignores it (no lost answer)."""
    import multiprocessing
    import threading

    from attnmt.data.workers import imap

    def interrupt_the_workers():
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGINT)

    threading.Timer(0.3, interrupt_the_workers).start()
    assert list(imap(time.sleep, [(0.6,), (0.6,), (0.1,)], workers=2)) == [None, None, None]


def test_sigterm_while_planning_an_epoch_saves_a_resumable_checkpoint(tmp_path, monkeypatch):
    raw = copy_task_config(tmp_path, max_steps=1000, valid_every=1000, log_every=1000)
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    plan = loop_module.epoch_share

    def plan_with_a_signal(config, data, epoch, ranks, start=0):
        if epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises first
        return plan(config, data, epoch, ranks, start)

    monkeypatch.setattr(loop_module, "epoch_share", plan_with_a_signal)
    result = training.run()
    assert result.interrupted_by == "SIGTERM" and result.steps > 0
    progress = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["progress"]
    assert (progress["step"], progress["epoch"], progress["batch_in_epoch"]) == (result.steps, 1, 0)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ---- real processes ---------------------------------------------------------------------------

def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "attnmt", *args], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=err)
    proc.stderr_path = tmp_path / "stderr.txt"
    return proc


def wait_for(proc: subprocess.Popen, ready, seconds: float = 240) -> None:
    """Poll ``ready()`` until it holds, failing if the process ends first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, f"the process ended before the phase to interrupt: {proc.stderr_path.read_text()}"
        assert time.monotonic() < deadline, "the phase to interrupt never came"
        time.sleep(0.05)


def stop(proc: subprocess.Popen, signum: int = signal.SIGTERM) -> tuple[int, str]:
    """Send ``signum``; the exit status and stdout, asserting the process ends in STOP_SECONDS."""
    proc.send_signal(signum)
    try:
        out, _ = proc.communicate(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running {STOP_SECONDS} s after {signal.Signals(signum).name}")
    return proc.returncode, out


def records(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "train_log.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def big_corpus(tmp_path: Path, pairs: int, name: str = "big") -> tuple[Path, Path]:
    words = COPY_WORDS * 3
    lines = "".join(" ".join(words[(i + k) % len(words)] for k in range(3 + i % 7)) + "\n" for i in range(pairs))
    src, tgt = tmp_path / f"{name}.src", tmp_path / f"{name}.tgt"
    src.write_text(lines)
    tgt.write_text(lines)
    return src, tgt


def long_preparation(tmp_path: Path) -> Path:
    """A configuration whose text takes long to encode (3 million pairs) after a quick tokenizer."""
    raw = copy_task_config(tmp_path)
    raw["data"]["train_src"], raw["data"]["train_tgt"] = map(str, big_corpus(tmp_path, 3_000_000))
    raw["tokenizer"]["max_sentences"] = 2000
    return write_config(tmp_path, raw)


def assert_stopped(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` stops ``proc`` in time with 128 + its number and one line saying so, no traceback."""
    rc, out = stop(proc, signum)
    err = proc.stderr_path.read_text().strip().splitlines()
    assert rc == 128 + signum and out == "", err
    assert err[-1].startswith(f"attnmt: stopped by {signal.Signals(signum).name}") and "Traceback" not in "".join(err)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_preparing_leaves_no_output(tmp_path, signum):
    proc = start(tmp_path, "prepare", str(long_preparation(tmp_path)), "--output", "out", "--workers", "2")
    wait_for(proc, lambda: any(tmp_path.glob(".out.*.tmp/*.model")))  # the tokenizers are saved: encoding
    assert_stopped(proc, signum)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))  # no half-written output


def test_sigterm_while_train_prepares_its_text_leaves_no_run(tmp_path):
    proc = start(tmp_path, "train", str(long_preparation(tmp_path)), "--output", "run")
    wait_for(proc, lambda: any(tmp_path.glob("run/.data.*.tmp/*.model")))
    assert_stopped(proc, signal.SIGTERM)
    assert not (tmp_path / "run").exists()  # the staging directory and the run directory it made are gone


def test_sigterm_while_training_keeps_a_resumable_checkpoint(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=100_000, valid_every=20, log_every=5)
    config = write_config(tmp_path, raw)
    proc = start(tmp_path, "train", str(config), "--output", "run")
    run = tmp_path / "run"
    wait_for(proc, lambda: any(r["step"] >= 25 for r in records(run, "train")))  # past the first validation
    rc, out = stop(proc)
    assert rc == 128 + signal.SIGTERM
    result = json.loads(out)
    assert result["interrupted_by"] == "SIGTERM" and result["steps"] >= 25
    progress = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["progress"]
    assert progress["step"] == result["steps"] and (run / "model.safetensors").is_file()
    assert records(run, "interrupted") and not records(run, "done")


def test_sigterm_during_validation_keeps_the_previous_checkpoint(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=100_000, valid_every=4, log_every=4)
    valid_src, valid_tgt = big_corpus(tmp_path, 6000, "valid")  # a validation of several seconds
    raw["data"].update(valid_src=str(valid_src), valid_tgt=str(valid_tgt))
    raw["decode"]["max_len_b"] = 40
    config = write_config(tmp_path, raw)
    proc = start(tmp_path, "train", str(config), "--output", "run")
    run = tmp_path / "run"
    wait_for(proc, lambda: any(r["step"] == 8 for r in records(run, "train")))  # the second validation begins
    before = {name: (run / name).read_bytes() for name in ("checkpoints/last.pt", "model.safetensors")}
    rc, out = stop(proc)
    assert rc == 128 + signal.SIGTERM
    assert json.loads(out)["stop_reason"] == "interrupted by SIGTERM during validation"
    assert {name: (run / name).read_bytes() for name in before} == before  # the step-4 files, untouched
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["progress"]["step"] == 4
    assert [r["step"] for r in records(run, "valid")] == [4]


def test_sigterm_while_distilling_keeps_only_whole_chunks(tmp_path, tiny_run):
    raw = copy_task_config(tmp_path)
    raw["data"]["train_src"], raw["data"]["train_tgt"] = map(str, big_corpus(tmp_path, 40_000))
    raw["decode"]["max_len_b"] = 40
    config = write_config(tmp_path, raw)
    proc = start(tmp_path, "distill", str(config), "--teacher", str(tiny_run), "--output", "student",
                 "--beam-size", "2")
    parts = tmp_path / "student" / "distill" / "parts"
    wait_for(proc, lambda: any(parts.glob("*.tgt")))
    assert_stopped(proc, signal.SIGTERM)
    chunks = sorted(parts.iterdir())
    assert chunks and all(p.suffix == ".tgt" for p in chunks)  # no temporary file of the chunk in progress
    assert all(len(p.read_text().splitlines()) == 2000 for p in chunks)  # whole chunks, which a rerun skips
    assert len(chunks) < 20 and not (tmp_path / "student" / "distill" / "train.tgt").exists()


KILLED_PARENT = """
import multiprocessing, os, signal, time
from attnmt.data.workers import imap

calls = imap(time.sleep, [(0.1,)] * 4, workers=3)
next(calls)  # the workers run
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
"""


def test_workers_end_when_their_parent_is_killed():
    """Each worker held the other workers' pipes open, so none saw its pipe close: they outlived a killed parent."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED_PARENT], env=env, text=True, capture_output=True, timeout=60)
    pids = [int(pid) for pid in done.stdout.split()]
    assert done.returncode == -signal.SIGKILL and len(pids) == 3, done.stderr

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    deadline = time.monotonic() + STOP_SECONDS
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(running, pids)), [pid for pid in pids if running(pid)]
    assert "Traceback" not in done.stderr, done.stderr  # a worker whose parent is gone ends quietly
