"""Exact resume at scale: torchrun x2 CPU ranks on a prepared corpus of 10 million pairs, one rank
killed with SIGKILL, the run resumed, against the same run uninterrupted.

Steps (K shuffled copies of Multi30k train de-en, K=350 by default: 10,150,000 pairs):

1. ``attnmt prepare --workers 2`` of the copies (``benchmarks/suite_data.py``'s corpus and
   configuration: the de-en preset's model, d_model 256, 3+3 layers, 8k joint vocabulary,
   the noam schedule, no validation set), a checkpoint every ``--valid-every`` updates.
2. Run A: ``torchrun --nproc_per_node 2 -m attnmt train`` for ``--minutes`` minutes, then
   ``kill -9`` of rank 1 (the process whose environment says ``RANK=1``); torchrun's agent
   then ends rank 0. A's last checkpoint is at update s.
3. A resumed (the same command with ``--resume``) with ``train.max_steps = s + --next``.
4. Run B: the same command from scratch, uninterrupted, to ``s + --next`` updates.
5. The check: B's and resumed A's log records of updates s+1 .. s+next (loss, perplexity,
   learning rate, epoch) are equal, and so are their final checkpoints (the model, Adam's
   moments and step counts, the schedule, the random state, tensor by tensor, bit for bit).

A slow test: ``python -m pytest -m slow tests/test_slow_torchrun_resume.py`` (the README's
``python -m pytest -q`` leaves it out). Its size flags go in ``ATTNMT_SLOW_TORCHRUN_RESUME``, e.g.
``ATTNMT_SLOW_TORCHRUN_RESUME='--k 1 --minutes 1 --next 3 --valid-every 2'``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from harness import ROOT as REPO  # noqa: E402
from suite_data import write_config, write_corpus  # noqa: E402

COMPARED = ("loss", "ppl", "lr", "epoch", "processes")  # the log fields that must be equal (not timings)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=350, help="shuffled copies of Multi30k train (350: 10.15M pairs)")
    p.add_argument("--minutes", type=float, default=10.0, help="run A's minutes before the kill")
    p.add_argument("--next", type=int, default=50, help="updates compared after the resume")
    p.add_argument("--valid-every", type=int, default=25, help="a checkpoint every N updates")
    p.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="holds multi30k/ (default $ATTNMT_DATA)")
    p.add_argument("--work", default=str(REPO / "benchmarks" / "work" / "torchrun_resume"), help="scratch directory")
    return p.parse_args(argv)


def torchrun(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "attnmt", "train",
            str(config), "--output", str(run_dir), *extra]


def env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the training process of ``rank`` under the torchrun process ``parent``."""
    todo = [parent]
    while todo:
        pid = todo.pop()
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ and f"LOCAL_RANK={rank}".encode() in environ:
                return pid
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
    return None


def killed_run(config: Path, run_dir: Path, minutes: float, log: Path) -> dict:
    """Run A until ``minutes`` have passed, then SIGKILL its rank 1; returns what happened."""
    with open(log, "w") as out:
        proc = subprocess.Popen(torchrun(config, run_dir), env=env(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + minutes * 60
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
        if proc.poll() is not None:
            raise SystemExit(f"run A ended by itself before the kill ({proc.returncode}); see {log}")
        victim = rank_pid(proc.pid, 1)
        if victim is None:
            raise SystemExit("run A: no process with RANK=1 found")
        os.kill(victim, signal.SIGKILL)
        code = proc.wait()
    return {"killed_pid": victim, "torchrun_exit": code, "seconds": round(minutes * 60)}


def run(cmd: list[str], log: Path) -> float:
    t0 = time.monotonic()
    with open(log, "w") as out:
        if subprocess.run(cmd, env=env(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO).returncode:
            raise SystemExit(f"{' '.join(cmd)} failed; see {log}")
    return round(time.monotonic() - t0, 1)


def train_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor (and number) of a checkpoint, by its path in the nested dicts and lists."""
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(tensors(v, f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(tensors(v, f"{prefix}/{i}"))
    elif isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, (int, float)) and not isinstance(state, bool):
        out[prefix] = torch.tensor(state)
    return out


def differing_tensors(a: Path, b: Path) -> list[str]:
    """The checkpoint entries that differ (wall-clock progress fields aside)."""
    left, right = (tensors(torch.load(p, map_location="cpu", weights_only=True)) for p in (a, b))
    timing = ("elapsed_seconds", "log_bytes")  # wall clock, and the log's length (its timings' digits)
    keys = {k for k in left.keys() | right.keys() if not any(t in k for t in timing)}
    return sorted(k for k in keys if k not in left or k not in right or left[k].shape != right[k].shape
                  or not torch.equal(left[k], right[k]))


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src, tgt, pairs = write_corpus(Path(args.data_dir), args.k, work / "corpus")
    text = write_config(work / "text.yaml", {"train_src": str(src), "train_tgt": str(tgt)}, None)
    prepared = work / "prepared"
    summary: dict = {"pairs": pairs}
    if not (prepared / "manifest.json").is_file():
        summary["prepare_s"] = run([sys.executable, "-m", "attnmt", "prepare", str(text), "--output", str(prepared),
                                    "--workers", "2"], work / "prepare.log")
    config = write_config(work / "prepared.yaml", {"prepared": str(prepared)}, None, updates=100_000)
    cfg = yaml.safe_load(config.read_text())
    cfg["train"]["valid_every"] = args.valid_every
    config.write_text(yaml.safe_dump(cfg))

    a, b = work / "run_a", work / "run_b"
    for d in (a, b):
        subprocess.run(["rm", "-rf", str(d)], check=True)
    summary["a"] = killed_run(config, a, args.minutes, work / "a.log")
    step = torch.load(a / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["progress"]["step"]
    last = step + args.next
    summary.update(checkpoint_step=step, last_step=last)
    budget = ("--set", f"train.max_steps={last}")
    summary["a_resumed_s"] = run(torchrun(config, a, "--resume", *budget), work / "a_resumed.log")
    summary["b_s"] = run(torchrun(config, b, *budget), work / "b.log")

    logged = train_records(a)
    ra, rb = {r["step"]: r for r in logged}, {r["step"]: r for r in train_records(b)}
    steps = range(step + 1, last + 1)
    unequal = [s for s in steps if s not in ra or s not in rb or any(ra[s].get(f) != rb[s].get(f) for f in COMPARED)]
    summary["records_compared"] = len(steps)
    summary["records_unequal"] = unequal
    summary["a_steps_logged_once"] = [r["step"] for r in logged] == list(range(1, last + 1))
    summary["checkpoint_entries_unequal"] = differing_tensors(a / "checkpoints" / "last.pt",
                                                              b / "checkpoints" / "last.pt")
    summary["ok"] = not unequal and summary["a_steps_logged_once"] and not summary["checkpoint_entries_unequal"]
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


@pytest.mark.slow
def test_torchrun_resume():
    if not os.environ.get("ATTNMT_DATA"):
        pytest.skip("needs ATTNMT_DATA (the folder holding multi30k/)")
    assert main(shlex.split(os.environ.get("ATTNMT_SLOW_TORCHRUN_RESUME", ""))) == 0
