"""RESULTS.md from the records: ``python -m benchmarks report [--check]``.

Every section of ``records/sections.json`` (its order, one-line intro, the name of its rows' column
and the command that measures it) becomes a ``##`` heading with one table of its records (records.py):
a row per figure, machine and command, a column per record column (its unit in the heading), then the
machine, the date (with the load per core where it was above 0.5: the machine was not measuring alone),
the commit (marked "dirty" where the tree had uncommitted changes) and the command. Records that could not
be true (checks.py) and an empty records folder are refused before anything is written.
A section without records keeps its heading and says which command measures it, so that links to it
stay valid. ``records/notes.md`` (findings of single investigations) follows the tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from checks import problems as impossible
from harness import BUSY, HERE, ROOT
from records import Record, RecordError, located, machine_label, renamed

RECORDS = HERE / "records"
RESULTS = HERE / "RESULTS.md"

HEADER = ("# Results\n\nThe current figure of each measurement, built by `python -m benchmarks report` from "
          "`benchmarks/records/*.jsonl`: every figure is what its command printed at the commit named, on the "
          "machine named (figures are never typed here by hand). Run the commands from the repository root with "
          "`ATTNMT_DATA` naming the folder that holds `multi30k/`; a rerun on the same machine replaces its row. "
          "Machines had 2 cores and 2 threads per run unless a row says otherwise. Earlier figures are in the git "
          "history of the records.\n")


def cell(value) -> str:
    """A value as a table cell: numbers with thousands separators, lists comma-separated."""
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value)
    return f"{value:,}"


def heading(column: str, units: set[str]) -> str:
    """A column's heading: its name, and its unit where the name does not say it."""
    unit = next(iter(units)) if len(units) == 1 else ""
    said = any(word == unit or (len(unit) > 2 and word.startswith(unit)) for word in column.split())
    return column if not unit or said else f"{column} ({unit})"


def table(recs: list[Record], first: str = "figure") -> list[str]:
    """One Markdown table: a row per (figure, machine, date, commit, command), a column per record column."""
    units: dict[str, set[str]] = {}
    for r in recs:
        units.setdefault(r.column, set()).add(r.unit)
    rows: dict = {}
    for r in recs:
        commit = r.commit[:9] + (" (dirty)" if r.dirty else "")
        date = r.date[:10] + (f" (load {r.load:.2f} per core)" if r.load is not None and r.load > BUSY else "")
        row = rows.setdefault((r.figure, machine_label(r.machine.model_dump()), date, commit, r.command), {})
        row[r.column] = cell(r.value) + ("" if len(units[r.column]) == 1 else f" {r.unit}")
    out = [f"| {first} | " + " | ".join(heading(c, units[c]) for c in units) + " | CPU | date | commit | command |",
           "| --- | " + " | ".join("---" for _ in units) + " | --- | --- | --- | --- |"]
    previous = None
    for (figure, machine, date, commit, command), values in rows.items():
        shown = "the same" if command == previous else f"`{command}`"
        previous = command
        out.append(f"| {figure} | " + " | ".join(values.get(c, "-") for c in units)
                   + f" | {machine} | {date} | {commit} | {shown} |")
    return out


def machines(recs: list[Record]) -> list[str]:
    """The machines the tables name, each as the harness described it."""
    seen = {}
    for r in recs:
        m = r.machine.model_dump()
        seen.setdefault(machine_label(m), m)
    out = ["Machines:"]
    for label, m in seen.items():
        ident = " ".join(f"{k} {m[k]}" for k in ("family", "model") if m.get(k)) or "family and model not kept"
        out.append(f"- **{label}**: {m.get('model_name') or m.get('vendor')}, {ident}; "
                   f"{', '.join(m.get('flags', [])) or 'no listed flags'}; {m.get('cores', '?')} cores")
    return out + [""]


def render(recs: list[Record], folder: Path) -> str:
    """RESULTS.md's text: the header, each section's intro and table in ``sections.json``'s order, the notes."""
    def own(name: str) -> Path:  # a records folder without its own sections or notes: the committed ones
        return folder / name if (folder / name).exists() else RECORDS / name
    sections = json.loads(own("sections.json").read_text(encoding="utf-8"))
    lines = [HEADER] + machines(recs)
    known = {s["title"] for s in sections}
    for extra in dict.fromkeys(r.section for r in recs if r.section not in known):
        sections.append({"title": extra, "intro": ""})
    for s in sections:
        mine = [r for r in recs if r.section == s["title"]]
        lines += [f"## {s['title']}"] + ([s["intro"], ""] if s["intro"] else [])
        if mine:
            lines += table(mine, s.get("row", "figure")) + [""]
        else:
            lines += [f"No current record: `{s['command']}` measures it.", ""]
    notes = own("notes.md")
    if notes.exists():
        lines.append(notes.read_text(encoding="utf-8").rstrip() + "\n")
    return "\n".join(lines)


def report(args) -> None:
    """Write RESULTS.md (``--output``) from ``--records`` (``--check``: exit 1 when the file differs from the records, or
    two records of one table differ only in a name). Neither writes anything from no records, nor from records
    that could not be true (checks.py).

    Raises:
        records.RecordError: a torn or invalid record, or one that could not be true (one line each, naming the
            file and line); no records at all.
    """
    places = located(args.records)
    if not places:
        raise RecordError(f"{args.records}: no records (*.jsonl): nothing to report")
    bad = impossible(places, ROOT)
    if bad:
        raise RecordError("\n".join(bad))
    recs = [rec for _, rec in places]
    text = render(recs, args.records)
    if args.check:
        problems = renamed(recs)
        if Path(args.output).read_text(encoding="utf-8") != text:
            problems.append("RESULTS.md differs from the records: run python -m benchmarks report")
        for problem in problems:
            print(f"python -m benchmarks report: {problem}", file=sys.stderr)
        if problems:
            sys.exit(1)
        return
    Path(args.output).write_text(text, encoding="utf-8")
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
