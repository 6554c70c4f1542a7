"""The records: one JSON line per figure in ``records/SUITE.jsonl``, as the harness wrote it.

A record (:class:`Record`, a pydantic model) holds its section (a ``##`` heading of RESULTS.md),
figure (the table's row), column, ``value`` (a number, or a list of numbers) and ``unit``; the
machine the harness described, the date and time (UTC), the load average per core when the run
started (``load``; above 0.5 the machine was not measuring alone), the full 40-hex ``commit`` of the checkout
(``dirty`` when its tracked files had uncommitted changes), the exact ``command`` that produced it
and ``settings`` that are not in the command. Its key is (section, figure, column, machine label):
a rerun of the same command on the same machine replaces the record of that key (:func:`store`).

:func:`load` refuses a file's torn or invalid lines, each named with its file and line
(:class:`RecordError`); :func:`renamed` finds rows a rerun left beside each other because the
suite's names changed.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, field_validator

from attnmt.ranges import C_INT_MAX, Range

Number = StrictInt | StrictFloat
# a measured figure: a finite number no larger in magnitude than any the suites measure (a count of
# tokens, seconds, bytes or a score); past it a value is a broken measurement, not a figure
FIGURE = Range(-1e15, 1e15)


class RecordError(Exception):
    """Invalid records: one line per problem, each naming the file and line."""


def machine_label(m: dict) -> str:
    """A short name for a machine description, as RESULTS.md's tables show it."""
    if m.get("label"):
        return m["label"]
    kind = "bf16" if "avx512_bf16" in m.get("flags", []) else "AVX2"
    vendor = "EPYC" if "AMD" in m.get("vendor", "") + m.get("model_name", "") else m.get("vendor", "CPU")
    return f"{vendor} {kind} (fam {m.get('family')} model {m.get('model')})"


class Machine(BaseModel):
    """The CPU as harness.machine described it."""

    model_config = ConfigDict(extra="allow")
    vendor: str = Field(min_length=1)
    cores: StrictInt = Field(gt=0, le=C_INT_MAX)
    flags: list[str]
    family: str = ""
    model: str = ""
    model_name: str = ""
    label: str = ""


class Record(BaseModel):
    """One figure as the harness wrote it; extra keys are refused (``measured_with`` among them)."""

    model_config = ConfigDict(extra="forbid")
    suite: str = Field(min_length=1)
    section: str = Field(min_length=1)
    figure: str = Field(min_length=1)
    column: str = Field(min_length=1)
    value: Number | list[Number]
    unit: str = Field(min_length=1)
    machine: Machine
    date: str = Field(pattern=r"^\d{4}-\d\d-\d\d(T\d\d:\d\d:\d\d([+-]\d\d:\d\d|Z)?)?$")
    load: float | None = Field(default=None, ge=0)  # 1-minute load average per core at the run's start
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    dirty: bool = False
    command: str = Field(pattern=r"^python -m benchmarks \S")
    settings: dict[str, Any] = {}

    @field_validator("value")
    @classmethod
    def _finite(cls, value):
        values = value if isinstance(value, list) else [value]
        if not values or not all(FIGURE.contains(v) for v in values):
            raise ValueError(f"not {FIGURE.describe()}")
        return value

    def key(self) -> tuple[str, str, str, str]:
        """(section, figure, column, machine label): what a rerun replaces."""
        return self.section, self.figure, self.column, machine_label(self.machine.model_dump())


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "record"
    if first["type"] == "missing":
        return f"no {where}"
    if first["type"] == "extra_forbidden":
        return f"{where} is not a record field"
    if first["loc"][0] == "value":
        return f"value: not {FIGURE.describe()} (or a list of them)"
    return f"{where}: {first['msg']}"


def read(path: Path) -> list[tuple[int, Record]]:
    """A records file's (line number, record) pairs.

    Raises:
        RecordError: one line per torn or invalid line, naming the file and line.
    """
    out, problems = [], []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, Record.model_validate(json.loads(line))))
        except json.JSONDecodeError as e:
            problems.append(f"{path}:{number}: not a JSON line ({e.msg}, column {e.colno}): torn or corrupt")
        except ValidationError as e:
            problems.append(f"{path}:{number}: {_problem(e)}")
    if problems:
        raise RecordError("\n".join(problems))
    return out


def located(folder: Path) -> list[tuple[str, Record]]:
    """Every record of ``folder``'s ``*.jsonl`` files with its place ("FILE:LINE"), a later one replacing an
    earlier one of the same key.

    Raises:
        RecordError: see :func:`read` (every file's problems together).
    """
    cells: dict = {}
    problems = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        try:
            for number, rec in read(path):
                cells.pop(rec.key(), None)
                cells[rec.key()] = (f"{path}:{number}", rec)
        except RecordError as e:
            problems.append(str(e))
    if problems:
        raise RecordError("\n".join(problems))
    return list(cells.values())


def load(folder: Path) -> list[Record]:
    """Every record of ``folder`` (:func:`located`, without the places)."""
    return [rec for _, rec in located(folder)]


def store(folder: Path, rec: dict) -> None:
    """Put ``rec`` into ``folder``/SUITE.jsonl in place of the record of its key (at the end if new),
    the file replaced atomically (a temporary file, then os.replace)."""
    new = Record.model_validate(rec)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{new.suite}.jsonl"
    lines = [line for line in (path.read_text(encoding="utf-8").splitlines() if path.exists() else [])
             if line.strip() and Record.model_validate(json.loads(line)).key() != new.key()]
    lines.append(json.dumps(rec, ensure_ascii=False))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def _name(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.casefold())


def renamed(recs: list[Record]) -> list[str]:
    """Rows of one table that differ only in a name: two records of one section and machine whose figure
    (or column) differs only in case, spacing or punctuation, or that one command wrote on two runs
    (dates) under different figure names for one column, so that the later run did not replace the earlier."""
    problems = []
    seen: dict = {}
    for r in recs:
        label = machine_label(r.machine.model_dump())
        for kind, name, other in (("figure", r.figure, r.column), ("column", r.column, r.figure)):
            spot = (r.section, label, kind, _name(name), other if kind == "figure" else _name(other))
            first = seen.setdefault(spot, name)
            if first != name:
                problems.append(f"{r.section!r} on {label}: {kind} {first!r} and {name!r} differ only in spelling")
    runs: dict = {}
    for r in recs:
        runs.setdefault((r.section, machine_label(r.machine.model_dump()), r.command, r.column), {}).setdefault(
            r.date, set()).add(r.figure)
    for (section, label, command, column), by_date in runs.items():
        dates = sorted(by_date)
        for old in dates[:-1]:
            stale = by_date[old] - by_date[dates[-1]]
            if stale:
                problems.append(f"{section!r} on {label}: `{command}` wrote column {column!r} on {old} for "
                                f"{sorted(stale)} and on {dates[-1]} for {sorted(by_date[dates[-1]])}: rename or "
                                "delete the older records")
    return problems
