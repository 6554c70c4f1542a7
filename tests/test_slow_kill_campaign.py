"""A kill -9 campaign: a real Multi30k training run (float32, CPU) killed with SIGKILL at random
moments and resumed each time, against the same run uninterrupted.

Steps: write a configuration (a slice of Multi30k de-en, a small model, frequent validations
and checkpoint averaging), train it once without interruption (the reference), then train it
again as ``attnmt train ... --resume`` processes, each killed with SIGKILL, until KILLS kills
have happened; a last process runs to the end. The kill moments are random and spread over
the whole run: a fifth of the kills fall uniformly within a process's start-up (imports,
reading the corpus, SentencePiece, loading the state, the first updates: the reference's time
to its first log record); the others at KILLS-many points drawn uniformly on
the reference's timeline after start-up (training, validations, the final validation and
the averaging), taken in order: a process resumed from a state at step s is killed at
start-up + (point - the reference's time at step s), or right after start-up if the point is
already behind it. After every kill each file of the run directory that exists must be readable: the
resumable state (``torch.load(weights_only=True)``), the safetensors weights, the SentencePiece
model, config.yaml, and every line of train_log.jsonl but a torn last one. At the end the run
must equal the reference: the same weights (state and model.safetensors, bit for bit), the
same optimizer state, and the same log records (wall-clock numbers aside), so no record twice.

A slow test: ``python -m pytest -m slow tests/test_slow_kill_campaign.py`` (the README's
``python -m pytest -q`` leaves it out). Its size flags go in ``ATTNMT_SLOW_KILL_CAMPAIGN``, e.g.
``ATTNMT_SLOW_KILL_CAMPAIGN='--kills 10 --max-steps 60 --d-model 32'``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
TIMING_KEYS = {"seconds", "tgt_tokens_per_s", "peak_rss_mib", "minutes", "tgt_tokens_per_second"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs before the run may finish")
    p.add_argument("--max-steps", type=int, default=120, help="updates of the run")
    p.add_argument("--valid-every", type=int, default=20, help="validation (and checkpoint) every N updates")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
    p.add_argument("--train-lines", type=int, default=5000, help="first N Multi30k training pairs (0: all)")
    p.add_argument("--valid-lines", type=int, default=100, help="first N validation pairs")
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1, help="seed of the kill moments")
    p.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="holds multi30k/ (default $ATTNMT_DATA)")
    p.add_argument("--work", default=str(REPO / "benchmarks" / "work" / "kill_campaign"), help="scratch directory")
    return p.parse_args(argv)


def write_config(args, work: Path) -> Path:
    data = Path(args.data_dir) / "multi30k"
    files = {}
    for split, limit in (("train", args.train_lines), ("val", args.valid_lines)):
        for lang in ("de", "en"):
            lines = gzip.decompress((data / f"{split}.{lang}.gz").read_bytes()).decode("utf-8").splitlines()
            path = work / f"{split}.{lang}"
            path.write_text("\n".join(lines[:limit] if limit else lines) + "\n", encoding="utf-8")
            files[split, lang] = str(path)
    config = {
        "data": {"train_src": files["train", "de"], "train_tgt": files["train", "en"],
                 "valid_src": files["val", "de"], "valid_tgt": files["val", "en"]},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": "unigram"},
        "model": {"d_model": args.d_model, "num_heads": 4, "d_ff": 2 * args.d_model,
                  "num_encoder_layers": args.layers, "num_decoder_layers": args.layers, "dropout": 0.1},
        "train": {"batch_tokens": 1500, "max_steps": args.max_steps, "valid_every": args.valid_every,
                  "log_every": 5, "warmup_steps": 40, "average_last": 3, "precision": "fp32", "num_threads": 1,
                  "seed": 1},
        "decode": {"max_len_b": 10},
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def train_command(config: Path, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "attnmt", "train", str(config), "--output", str(run_dir)]
    return command + ["--resume"] if run_dir.exists() else command


def readable_files(run_dir: Path) -> list[str]:
    """The files of a run directory that cannot be read (empty when all is well)."""
    from attnmt.config import config_from_yaml
    from attnmt.data.tokenizers import Tokenizer

    bad = []
    checks = {"checkpoints/last.pt": lambda p: torch.load(p, weights_only=True)["progress"],
              "config.yaml": lambda p: config_from_yaml(p.read_text(), p), "spm.model": Tokenizer.load,
              "model.safetensors": lambda p: load_file(str(p))}
    for name, check in checks.items():
        if (run_dir / name).exists():
            try:
                check(run_dir / name)
            except Exception as e:  # noqa: BLE001 - any failure counts
                bad.append(f"{name}: {e}")
    for path in sorted((run_dir / "checkpoints").glob("step_*.safetensors")):
        try:
            load_file(str(path))
        except Exception as e:  # noqa: BLE001
            bad.append(f"{path.name}: {e}")
    log = run_dir / "train_log.jsonl"
    if log.exists():
        lines = log.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines[:-1], start=1):  # the last piece may be torn
            try:
                json.loads(line)
            except ValueError:
                bad.append(f"train_log.jsonl:{number}: not JSON")
    return bad


def phase(stderr: str) -> str:
    """Where a killed process was, from its log lines."""
    lines = [line for line in stderr.splitlines() if " INFO " in line or " WARNING " in line]
    last = lines[-1] if lines else ""
    if "already finished" in stderr:
        return "no-op resume of a finished run"
    if "done:" in last:
        return "after the done record"
    if "average of" in last:
        return "averaging written, before the last save"
    if "stopping:" in stderr or "resuming after the final validation" in stderr:
        return "averaging" if (" valid:" in last or "resuming after" in last) else "final validation"
    if " valid:" in last or "epoch" in last:
        return "training"
    if "model:" in last:
        return "first update"
    if "SentencePiece" in last or "training pairs" in last:
        return "SentencePiece, encoding, building the model"
    return "start-up (imports, reading the corpus)"


def records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


def compare(ref: Path, run: Path) -> dict:
    a, b = (torch.load(d / "checkpoints" / "last.pt", weights_only=True) for d in (ref, run))
    weights = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    moments = all(torch.equal(x[k], y[k]) for x, y in zip(a["optimizer"]["state"].values(),
                                                         b["optimizer"]["state"].values()) for k in x)
    ma, mb = (load_file(str(d / "model.safetensors")) for d in (ref, run))
    best = all(torch.equal(ma[k], mb[k]) for k in ma)
    ra, rb = records(ref), records(run)
    keys = [(r["kind"], r.get("step")) for r in rb]
    return {"weights_identical": weights, "adam_moments_identical": moments, "model_safetensors_identical": best,
            "log_records_identical": ra == rb, "duplicate_log_records": len(keys) - len(set(keys)),
            "log_records": len(rb)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.data_dir or not (Path(args.data_dir) / "multi30k" / "train.de.gz").is_file():
        sys.exit("kill_campaign: give --data-dir (or ATTNMT_DATA) holding multi30k/train.de.gz")
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = write_config(args, work)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    t0 = time.monotonic()
    ref = work / "reference"
    proc = subprocess.Popen(train_command(config, ref), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Start-up: until the first log record (after the corpus, SentencePiece, the model and the
    # first log_every updates), so that a kill point is not spent before training resumes.
    while proc.poll() is None and not (ref / "train_log.jsonl").exists():
        time.sleep(0.05)
    startup = time.monotonic() - t0
    if proc.wait() != 0:
        sys.exit(f"kill_campaign: the reference run failed: {proc.stderr.read().decode()[-2000:]}")
    reference_seconds = time.monotonic() - t0
    rng = random.Random(args.seed)

    work_seconds = reference_seconds - startup
    points = sorted(rng.uniform(0, work_seconds) for _ in range(args.kills))

    def kill_delay() -> float:
        """Seconds after which to kill the next process (module docstring)."""
        if rng.random() < 0.2:
            return rng.uniform(0, startup)
        point = points.pop(0) if points else rng.uniform(0, work_seconds)
        try:
            progress = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["progress"]
            done = work_seconds * min(1.0, progress["step"] / args.max_steps)
        except (OSError, RuntimeError, KeyError):
            done = 0.0
        return startup + max(0.0, point - done) + rng.uniform(0, 1)

    run = work / "run"
    kills, unreadable, phases, processes = 0, [], {}, 0
    t1 = time.monotonic()
    while True:
        final = kills >= args.kills
        delay = None if final else kill_delay()
        proc = subprocess.Popen(train_command(config, run), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        processes += 1
        try:
            _, err = proc.communicate(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
            kills += 1
            (work / f"kill_{kills:03d}.log").write_text(f"killed after {delay:.1f} s\n{err}")
            where = phase(err)
            phases[where] = phases.get(where, 0) + 1
            unreadable += [f"kill {kills}: {m}" for m in readable_files(run)] if run.exists() else []
            continue
        if proc.returncode != 0:
            print(err, file=sys.stderr)
            sys.exit(f"kill_campaign: a training process failed with status {proc.returncode}")
        if final:
            break
        phases["finished before the kill"] = phases.get("finished before the kill", 0) + 1
    summary = {"kills": kills, "processes": processes, "unreadable_files_after_kills": len(unreadable),
               "unreadable": unreadable[:10], "kill_phases": phases, **compare(ref, run),
               "reference_seconds": round(reference_seconds, 1), "startup_seconds": round(startup, 1),
               "campaign_seconds": round(time.monotonic() - t1, 1), "args": vars(args)}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    ok = (not unreadable and summary["duplicate_log_records"] == 0 and summary["weights_identical"]
          and summary["adam_moments_identical"] and summary["model_safetensors_identical"]
          and summary["log_records_identical"])
    return 0 if ok else 1


@pytest.mark.slow
def test_kill_campaign():
    if not os.environ.get("ATTNMT_DATA"):
        pytest.skip("needs ATTNMT_DATA (the folder holding multi30k/)")
    assert main(shlex.split(os.environ.get("ATTNMT_SLOW_KILL_CAMPAIGN", ""))) == 0
