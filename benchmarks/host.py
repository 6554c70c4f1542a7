"""The machine a run measures on: its CPU, how busy it is, and the commit of the checkout.

- :func:`machine` describes the CPU (vendor, family, model, the flags that pick PyTorch's and
  CTranslate2's kernels, cores); every record carries it.
- :func:`load_per_core` and :func:`busy_line`: the load average per core at a run's start, kept in each
  record, and the line printed when it is above :data:`BUSY` (other work shares the machine).
- :func:`commit`: the checkout's commit and whether its tracked files have uncommitted changes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil

from records import machine_label

ROOT = Path(__file__).resolve().parent.parent
# what measuring writes into the checkout (the records, and RESULTS.md that `report` builds from them), relative
# to ROOT: measured figures, not measured code
MEASURED = ("benchmarks/records", "benchmarks/RESULTS.md")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def machine() -> dict:
    """The CPU as ``lscpu`` names it: vendor, family, model, the flags that choose kernels, cores."""
    try:
        info = json.loads(subprocess.run(["lscpu", "--json"], capture_output=True, text=True).stdout)
        fields = {e["field"].rstrip(":"): e["data"] for e in info["lscpu"]}
    except (OSError, ValueError, KeyError):
        fields = {}
    flags = set(fields.get("Flags", "").split())
    desc = {"vendor": fields.get("Vendor ID", ""), "family": fields.get("CPU family", ""),
            "model": fields.get("Model", ""), "model_name": fields.get("Model name", ""),
            "flags": [f for f in FLAGS if f in flags], "cores": psutil.cpu_count(logical=True)}
    desc["label"] = machine_label(desc)
    return desc


BUSY = 0.5  # load average per core above which the machine is not measuring alone


def load_per_core() -> float:
    """The 1-minute load average divided by the logical cores: above :data:`BUSY` other work shares the machine."""
    return round(os.getloadavg()[0] / (psutil.cpu_count(logical=True) or 1), 2)


def busy_line(load: float) -> str | None:
    """The warning printed at a run's start when ``load`` (per core) is above :data:`BUSY`, else None."""
    if load <= BUSY:
        return None
    return (f"[bench] the machine is busy: load average {load:.2f} per core (above {BUSY}); figures measured now "
            "measure the neighbours too (records keep the load)")


def commit() -> tuple[str, bool]:
    """The checkout's full commit hash and whether its tracked files have uncommitted changes ('' outside git).

    :data:`MEASURED` is left out: the records a run writes (``python -m benchmarks all`` runs step after step) and
    the report built from them are what it measured, not code it measures, and must not make the next step's
    tree "dirty"."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                              *(f":(exclude){path}" for path in MEASURED)))
