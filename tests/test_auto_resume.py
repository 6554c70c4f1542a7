"""``attnmt train --auto-resume``: one command line that starts a run and continues it. A run
killed with SIGKILL and launched again with the same line ends bit for bit as an uninterrupted
one; the relaunch checks what ``--resume`` checks; and a failed collective's one line names the
silent peer (``attnmt.train.peers``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.train import peers
from attnmt.train.loop import train

from .conftest import checkpoint_differences, copy_task_config

KILL_TIMEOUT = 180  # seconds for the killed run to reach its first checkpoint


def _line(config: Path, output: Path) -> list[str]:
    return [sys.executable, "-m", "attnmt", "-q", "train", str(config), "--output", str(output), "--auto-resume"]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))


def test_a_killed_run_launched_again_with_the_same_line_continues_bit_exactly(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=40, valid_every=4, valid_bleu=False, average_last=1)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_line(config, killed), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    log_file, deadline = killed / "train_log.jsonl", time.monotonic() + KILL_TIMEOUT
    while not (log_file.is_file() and '"valid"' in log_file.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert max(r["step"] for r in records if "step" in r) < 40  # killed mid-run
    again = subprocess.run(_line(config, killed), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["steps"] == 40
    reference = tmp_path / "uninterrupted"
    train(config_from_dict(raw), reference, progress=False)
    assert checkpoint_differences(killed / "checkpoints" / "last.pt", reference / "checkpoints" / "last.pt") == []
    steps = [json.loads(line)["step"] for line in log_file.read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == list(range(2, 41, 2))  # the killed run's records past its checkpoint were cut away


def test_auto_resume_starts_then_continues_with_the_checks_of_resume(tmp_path, capsys):
    raw = copy_task_config(tmp_path, max_steps=4, valid_bleu=False, average_last=1)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = tmp_path / "run"
    argv = ["-q", "train", str(config), "--output", str(run), "--auto-resume"]
    assert main(argv) == 0  # no --output yet: a new run
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 4
    assert main([*argv, "--set", "train.max_steps=6"]) == 0  # the same line continues it
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 6
    assert main([*argv, "--set", "model.d_model=24"]) == 2  # refused as --resume refuses it
    err = capsys.readouterr().err
    assert "model or tokenizer settings differ" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        main([*argv, "--resume"])
    assert e.value.code == 2


def test_a_failed_collective_names_the_silent_peer(monkeypatch):
    import torch.distributed as dist

    addresses = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"]
    timeout = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation")
    assert peers.is_collective_failure(timeout) and not peers.is_collective_failure(RuntimeError("a bug"))
    assert peers.is_collective_failure(dist.DistNetworkError("store unreachable"))
    assert peers.silent_peers(str(timeout), 0, addresses) == [2, 3]  # the other machines' ranks
    assert peers.silent_peers(str(timeout), 0, ["127.0.0.1"] * 3) == [1, 2]  # one machine: every other
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:41234")
    assert peers.silent_peers(str(closed), 0, addresses) == [3]  # the address the library names
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    line = str(peers.failure(timeout, 1, addresses, 20.0, "on rank 0's machine"))
    assert line.startswith("rank 1: no answer from rank 2 at 10.0.0.2, rank 3 at 10.0.0.3 within "
                           "train.dist_timeout (20 s)")
    assert "restarts are used up (2)" in line and "\n" not in line
    assert "--resume" not in line  # the command line adds its flags
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert "(1 of 2 restarts used)" in str(peers.failure(closed, 0, addresses, 20.0, "x"))
    assert "lost the connection to rank 3 at 10.0.0.3" in str(peers.failure(closed, 0, addresses, 20.0, "x"))
