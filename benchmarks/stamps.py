"""The stamp of a trained model: what trained it (its configuration file's SHA-256, the options, the
commit and whether the tree was clean), kept as ``bench_stamp.json`` in the run folder.

A benchmark that needs a model trains it once per clean commit: :func:`reusable` says whether a
folder holds a finished training of the same stamp (never one made from uncommitted code), and
:func:`note_model` remembers, for every record of the run, which models were reused and at which
commit they were trained.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from host import ROOT  # the checkout


STAMP = "bench_stamp.json"  # in a run folder: what trained it (configuration, options, commit)


def stamp(args, config: Path, options) -> dict:
    """What a model was trained from: its configuration file's SHA-256, the options and the commit (clean or not)."""
    return {"config": Path(config).name, "config_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest(),
            "options": [str(o) for o in options], "commit": getattr(args, "commit", ""),
            "dirty": bool(getattr(args, "dirty", True))}


def reusable(run_dir: Path, wanted: dict) -> bool:
    """Whether ``run_dir`` holds a finished training whose stamp is ``wanted``, made at a clean commit."""
    path = Path(run_dir) / STAMP
    log = Path(run_dir) / "train_log.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines() if log.is_file() else []
    done = any(json.loads(line).get("kind") == "done" for line in lines if line.strip())
    return done and path.is_file() and not wanted["dirty"] and json.loads(path.read_text(encoding="utf-8")) == wanted


def note_model(args, run_dir: Path, reused: bool) -> None:
    """Remember that this run read the model of ``run_dir``, trained now or reused: every record says so."""
    path = Path(run_dir) / STAMP
    made = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if not hasattr(args, "models"):
        args.models = {}
    args.models[str(run_dir)] = {"dir": shown(run_dir, getattr(args, "work", None)), "reused": reused,
                                 "trained_at": made.get("commit", "unknown"), "trained_dirty": made.get("dirty", True)}


def shown(path: Path, work: Path | None = None) -> str:
    """A model folder as a record names it, with no path of the machine that measured: relative to the
    checkout where it lies inside it (``benchmarks/work/...``, ``runs/...``), else ``WORK/...`` under the
    work folder, else the folder's own name."""
    full = Path(path).resolve()
    for base, prefix in ((ROOT, ""), (Path(work).resolve() if work else None, "WORK/")):
        if base is not None and full.is_relative_to(base):
            return prefix + full.relative_to(base).as_posix()
    return full.name


def atomic_json(path: Path, value) -> None:
    """``value`` as JSON in ``path``, written to a temporary file then renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
