"""Records that could not be true: the checks ``report`` and ``report --check`` make before writing anything.

Each check names the record's file and line ("FILE:LINE: problem"), one line per problem:

- **commit**: the commit is not one of this repository's (``git cat-file``; skipped outside a git checkout);
- **date**: later than now, or earlier than the day of its commit (nothing is measured before its code exists);
- **range**: a BLEU or chrF outside 0-100, a ``%`` outside 0-100, an MFU outside (0, 1], a rate (tok/s,
  GFLOP/s, sentences/s, pairs/s) that is not above zero (a failed run recorded as 0), a time or size
  (s, ms, min, MiB, GiB, MB) below zero, a count of updates that is not a positive whole number;
- **decode within process**: a row's "decode s" larger than its "process s" (the decoding is part of the process);
- **placeholder**: the command names a placeholder (an upper-case word such as ``DIR`` or ``BASE/src``), so
  no one can run it;
- **one run twice**: two rows (or column groups such as "own budget: ...") of different figures whose
  updates, test BLEU and test chrF are all equal: one training shown as two results.

The checks are written here rather than in pydantic validators because several look across records
(rows, git history); :mod:`records` keeps validating each line's form.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
import subprocess
from pathlib import Path

from records import Record, machine_label

RATES = {"tok/s", "GFLOP/s", "sentences/s", "pairs/s"}  # above zero: a failed run recorded as 0 is no rate
AMOUNTS = {"s", "ms", "min", "MiB", "GiB", "MB"}  # not below zero (a tiny file or step may round to 0)
PERCENT = {"BLEU", "chrF", "%"}
PLACEHOLDER = re.compile(r"^(?:[\w.-]*=)?[A-Z][A-Z_]{1,}(?:/|$)")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def commit_days(root: Path, commits: set[str]) -> dict[str, str | None] | None:
    """Commit -> the UTC day it was committed (None: not in the repository); None outside a git checkout."""
    if _git(root, "rev-parse", "--git-dir").returncode:
        return None
    out = {}
    for c in commits:
        shown = _git(root, "show", "-s", "--format=%cI", f"{c}^{{commit}}")
        stamp = shown.stdout.strip()
        out[c] = (dt.datetime.fromisoformat(stamp).astimezone(dt.timezone.utc).date().isoformat()
                  if shown.returncode == 0 and stamp else None)
    return out


def _values(rec: Record) -> list[float]:
    return rec.value if isinstance(rec.value, list) else [rec.value]


def each(place: str, rec: Record, days: dict | None, today: str) -> list[str]:
    """The problems of one record alone."""
    out = []
    if days is not None:
        day = days.get(rec.commit)
        if day is None:
            out.append(f"{place}: commit {rec.commit} is not in this repository's history")
        elif rec.date[:10] < day:
            out.append(f"{place}: dated {rec.date[:10]}, before its commit {rec.commit[:9]} ({day})")
    if rec.date[:10] > today:
        out.append(f"{place}: dated {rec.date[:10]}, in the future")
    values = _values(rec)
    if rec.unit in PERCENT and any(not 0 <= v <= 100 for v in values):
        out.append(f"{place}: {rec.column} {rec.value} {rec.unit}: outside 0-100")
    if rec.column == "MFU" and any(not 0 < v <= 1 for v in values):
        out.append(f"{place}: MFU {rec.value}: outside (0, 1]")
    if rec.unit in RATES and any(v <= 0 for v in values):
        out.append(f"{place}: {rec.column} {rec.value} {rec.unit}: a rate must be above zero")
    if rec.unit in AMOUNTS and any(v < 0 for v in values):
        out.append(f"{place}: {rec.column} {rec.value} {rec.unit}: a time or size below zero")
    if rec.unit == "updates" and any(v <= 0 or v != int(v) for v in values):
        out.append(f"{place}: {rec.column} {rec.value} updates: not a positive whole number")
    try:
        words = shlex.split(rec.command)
    except ValueError:
        words = rec.command.split()
    named = [w for w in words if PLACEHOLDER.match(w)]
    if named:
        out.append(f"{place}: the command names a placeholder ({named[0]}): record the command as it ran")
    return out


def _group(rec: Record) -> tuple[str, str]:
    """A column's group (the text before ": ", e.g. "own budget") and its name within the group."""
    return tuple(rec.column.split(": ", 1)) if ": " in rec.column else ("", rec.column)


def across(located: list[tuple[str, Record]]) -> list[str]:
    """The problems between records: decode seconds over process seconds, one run shown twice."""
    out = []
    rows: dict = {}
    for place, rec in located:
        row = (rec.section, rec.figure, machine_label(rec.machine.model_dump()), rec.command, rec.date)
        rows.setdefault(row, {})[rec.column] = (place, rec)
    for cells in rows.values():
        if "decode s" in cells and "process s" in cells:
            (place, dec), (_, proc) = cells["decode s"], cells["process s"]
            if any(d > p for d, p in zip(_values(dec), _values(proc))):
                out.append(f"{place}: decode s {dec.value} is more than the row's process s {proc.value}")
    runs: dict = {}
    for place, rec in located:
        group, name = _group(rec)
        key = (rec.section, rec.figure, group, machine_label(rec.machine.model_dump()))
        if name == "updates" or name in ("test BLEU", "test chrF"):
            runs.setdefault(key, {})[name] = (place, rec.value)
    seen: dict = {}
    for key, cells in runs.items():
        if set(cells) != {"updates", "test BLEU", "test chrF"}:
            continue
        signature = (key[3], *(str(cells[n][1]) for n in ("updates", "test BLEU", "test chrF")))
        if signature in seen and seen[signature][:2] != key[:2]:
            first = seen[signature]
            out.append(f"{cells['test BLEU'][0]}: {key[0]!r} / {key[1]!r} repeats {first[0]!r} / {first[1]!r} "
                       "(the same updates, test BLEU and chrF): one run shown twice; keep one row and point to it")
        seen.setdefault(signature, key)
    return out


def problems(located: list[tuple[str, Record]], root: Path, now: dt.datetime | None = None) -> list[str]:
    """Every problem of the records (``(place, record)`` pairs, records.located), one line each."""
    today = (now or dt.datetime.now(dt.timezone.utc)).date().isoformat()
    days = commit_days(root, {rec.commit for _, rec in located})
    out = [p for place, rec in located for p in each(place, rec, days, today)]
    return out + across(located)
