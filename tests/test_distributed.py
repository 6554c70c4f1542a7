"""Data-parallel training for real, with gloo on this CPU: torchrun launches of 2 processes (one
machine, and two "machines" meeting at a c10d rendezvous on 127.0.0.1) give the same weights as
1 process with the same global batch; a run saved under 2 processes resumes under 1; SIGTERM
stops every rank with a resumable checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from attnmt.config import config_from_dict
from attnmt.train.loop import train

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LAUNCH_TIMEOUT = 240  # seconds; a launch takes a few seconds of Python start-up per process


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """These runs use one thread (train.num_threads); give the other tests back their count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raw_config(data_dir: Path, accum_steps: int, max_steps: int) -> dict:
    rng = random.Random(0)
    lines = [" ".join(rng.sample(WORDS, rng.randint(2, 6))) for _ in range(700)]
    for name, part in (("train", lines[:660]), ("valid", lines[660:])):
        for side in ("src", "tgt"):
            (data_dir / f"{name}.{side}").write_text("\n".join(part) + "\n")
    return {
        "data": {"train_src": str(data_dir / "train.src"), "train_tgt": str(data_dir / "train.tgt"),
                 "valid_src": str(data_dir / "valid.src"), "valid_tgt": str(data_dir / "valid.tgt")},
        "tokenizer": {"vocab_size": 40, "model_type": "bpe"},
        "model": {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1,
                  # dropout on: the processes must draw the masks one process would
                  "dropout": 0.3, "attention_dropout": 0.1, "share_embeddings": True},
        "train": {"batch_tokens": 120, "accum_steps": accum_steps, "schedule": "inverse_sqrt", "lr": 1e-3,
                  "warmup_steps": 4, "max_steps": max_steps, "valid_every": 1000, "log_every": 1,
                  "valid_bleu": False, "precision": "fp32", "seed": 5, "num_threads": 1, "device": "cpu",
                  # The key projection's bias has an exactly zero gradient (softmax ignores a shift
                  # shared by all keys), so its computed gradient is rounding noise whose sign depends
                  # on the order of the sums; Adam's default eps (1e-9) would turn that noise into
                  # +-lr steps. A larger eps keeps it at noise level.
                  "adam_eps": 1e-6},
    }


def _write_config(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _launch(config: Path, output: Path, *torchrun_args: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = TORCHRUN + list(torchrun_args) + ["-m", "attnmt", "-q", "train", str(config), "--output", str(output),
                                            *extra]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 0, out[-3000:]
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def _max_difference(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two-process runs next to one-process runs of the same global batch (5 updates each):
    torchrun --nproc_per_node 2 with accum 1 against 1 process with accum 2 (gradients averaged
    after the backward passes), and two one-process 'nodes' at a c10d rendezvous with accum 2
    (DistributedDataParallel, ``train.ddp_overlap``) against 1 process with accum 4. The one-process
    runs go on to 8 updates as references for resuming."""
    tmp = tmp_path_factory.mktemp("ddp")
    raw1, raw2 = _raw_config(tmp, 1, 5), _raw_config(tmp, 2, 5)
    config1, config2 = _write_config(tmp / "accum1.yaml", raw1), _write_config(tmp / "accum2.yaml", raw2)
    one_node = _launch(config1, tmp / "two_procs", "--nproc_per_node", "2", "--master_port", str(_free_port()))
    endpoint, nodes = f"127.0.0.1:{_free_port()}", []
    for node_rank in (0, 1):  # each "node" names its own output folder, as on separate machines
        nodes.append(_launch(config2, tmp / f"node{node_rank}", "--nnodes", "2", "--nproc_per_node", "1",
                             "--node_rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                             "--rdzv-id", "attnmt-test", extra=("--set", "train.ddp_overlap=true")))
    references = {}
    for accum, total in ((2, 2), (4, 4)):
        raw = _raw_config(tmp, total, 5)
        train(config_from_dict(raw), tmp / f"one_proc_accum{accum}", progress=False)
        references[accum] = raw
    outputs = [_finish(p) for p in [one_node, *nodes]]
    return tmp, references, outputs


def test_two_processes_equal_one_with_the_same_global_batch(runs):
    tmp, _, outputs = runs
    assert _max_difference(tmp / "two_procs", tmp / "one_proc_accum2") < 1e-5
    state = torch.load(tmp / "two_procs" / "checkpoints" / "last.pt", weights_only=True)
    assert state["progress"]["step"] == 5 and state["world_size"] == 2
    assert state["progress"]["batch_in_epoch"] == 10  # global position: 5 updates x 2 processes
    summary = json.loads(outputs[0].strip().splitlines()[-1])
    assert summary["steps"] == 5  # printed once, by rank 0
    assert outputs[0].count('"steps"') == 1


def test_two_node_rendezvous_trains_and_rank_0_alone_writes(runs):
    tmp, _, _ = runs
    written = [d for d in (tmp / "node0", tmp / "node1") if d.exists()]
    assert len(written) == 1, written  # the other node's --output stays untouched
    run_dir = written[0]
    for name in ("config.yaml", "spm.model", "model.safetensors", "checkpoints/last.pt", "train_log.jsonl"):
        assert (run_dir / name).is_file(), name
    # 2 processes x accumulation 2 == 1 process x accumulation 4
    assert _max_difference(run_dir, tmp / "one_proc_accum4") < 1e-5
    log_lines = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log_lines if r["kind"] == "train"] == [1, 2, 3, 4, 5]  # one writer
    assert all(r["processes"] == 2 for r in log_lines if r["kind"] == "train")


def test_saved_under_two_processes_resumes_under_one(runs):
    tmp, references, _ = runs
    raw = dict(references[2], train={**references[2]["train"], "max_steps": 8})
    train(config_from_dict(raw), tmp / "one_proc_accum2", resume=True, progress=False)
    result = train(config_from_dict(raw), tmp / "two_procs", resume=True, progress=False)
    assert result.steps == 8
    state = torch.load(tmp / "two_procs" / "checkpoints" / "last.pt", weights_only=True)
    assert state["progress"]["batch_in_epoch"] == 16 and state["world_size"] == 1
    # The same data, optimizer and schedule as the run that had one process all along.
    assert _max_difference(tmp / "two_procs", tmp / "one_proc_accum2") < 1e-5


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for c in map(int, children):
            found.add(c)
            todo.append(c)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_sigterm_stops_every_rank_with_a_resumable_checkpoint(tmp_path):
    raw = _raw_config(tmp_path, 1, 100_000)
    config = _write_config(tmp_path / "long.yaml", raw)
    run_dir = tmp_path / "run"
    proc = _launch(config, run_dir, "--nproc_per_node", "2", "--master_port", str(_free_port()))
    log_file, deadline = run_dir / "train_log.jsonl", time.monotonic() + LAUNCH_TIMEOUT
    while not (log_file.is_file() and log_file.read_text().count('"train"') >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    workers = _descendants(proc.pid)
    assert len(workers) >= 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports the stop
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), out[-3000:]
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    stopped_at = state["progress"]["step"]
    assert stopped_at >= 3 and state["progress"]["batch_in_epoch"] == 2 * stopped_at
    assert "interrupted by SIGTERM" in log_file.read_text()  # the 'done' record of rank 0
    raw["train"]["max_steps"] = stopped_at + 2
    result = train(config_from_dict(raw), run_dir, resume=True, progress=False)
    assert result.steps == stopped_at + 2
