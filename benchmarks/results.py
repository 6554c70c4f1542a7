"""RESULTS.md from the records: ``python -m benchmarks report``.

Every suite appends one JSON line per figure to ``records/SUITE.jsonl``. A record holds its section
(a ``##`` heading of RESULTS.md), its figure (the table's row), its column, its value and unit, the
machine the harness measured, the date, the commit and the command that reproduces it (and, where
the figure was measured with an older command line, that one as ``measured_with``).
``records/sections.json`` gives the sections' order and one-line intros; ``records/notes.md``
(findings of single investigations) is copied below the tables. A later record of the same
section, figure, column and machine replaces an earlier one; older figures live in git history.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import RECORDS, machine_label

HEADER = ("# Results\n\nThe current figure of each measurement, built by `python -m benchmarks report` from "
          "`benchmarks/records/*.jsonl` (figures are never typed here by hand). Run the commands from the repository "
          "root with `ATTNMT_DATA` naming the folder that holds `multi30k/`. Machines had 2 cores and 2 threads "
          "per run unless a row says otherwise; \"shared\" marks a machine other jobs loaded meanwhile (compare "
          "within a row, not across). Earlier figures are in the git history of this file.\n")


def load(folder: Path = RECORDS) -> list[dict]:
    """Every record of every ``*.jsonl`` file, the later replacing the earlier of the same cell."""
    cells: dict = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                key = (rec["section"], rec["figure"], rec.get("column", ""), machine_label(rec["machine"]))
                cells.pop(key, None)
                cells[key] = rec
    return list(cells.values())


def cell(rec: dict) -> str:
    """A record's value as a table cell: numbers with thousands separators, then the unit."""
    value = rec["value"]
    if isinstance(value, float):
        value = f"{value:,.2f}"
    elif isinstance(value, int):
        value = f"{value:,}"
    return f"{value} {rec['unit']}".strip() if rec.get("unit") else str(value)


def cpu(rec: dict) -> str:
    """The CPU column: the machine's label, its note, and 'shared' where others loaded it."""
    parts = [machine_label(rec["machine"]), rec.get("machine_note", "")]
    return ", ".join(p for p in parts if p) + (", shared" if rec.get("shared") else "")


def table(recs: list[dict], first: str = "figure") -> list[str]:
    """One Markdown table: a row per (figure, machine, date, command), a column per record column;
    ``first`` heads the rows' column."""
    columns = list(dict.fromkeys(r.get("column") or "value" for r in recs))
    rows: dict = {}
    for r in recs:
        rows.setdefault((r["figure"], cpu(r), r["date"], r["command"]), {})[r.get("column") or "value"] = cell(r)
    out = [f"| {first} | " + " | ".join(columns) + " | CPU | date | command |",
           "| --- | " + " | ".join("---" for _ in columns) + " | --- | --- | --- |"]
    previous = None
    for (figure, machine, date, command), values in rows.items():
        shown = "the same" if command == previous else f"`{command}`"
        previous = command
        out.append(f"| {figure} | " + " | ".join(values.get(c, "-") for c in columns) + f" | {machine} | {date} | {shown} |")
    return out


def machines(recs: list[dict]) -> list[str]:
    """The machines the tables name, each as the harness described it."""
    seen = {}
    for r in recs:
        m = r["machine"]
        seen.setdefault(machine_label(m), m)
    out = ["Machines:"]
    for label, m in seen.items():
        ident = " ".join(f"{k} {m[k]}" for k in ("family", "model") if m.get(k)) or "family and model not kept"
        out.append(f"- **{label}**: {m.get('model_name') or m.get('vendor')}, {ident}; "
                   f"{', '.join(m.get('flags', [])) or 'no listed flags'}; {m.get('cores', '?')} cores")
    return out + [""]


def render(recs: list[dict], folder: Path = RECORDS) -> str:
    """RESULTS.md's text: the header, each section's intro and table in ``sections.json``'s order, the notes."""
    sections = json.loads((folder / "sections.json").read_text(encoding="utf-8"))
    lines = [HEADER] + machines(recs)
    known = {s["title"] for s in sections}
    for extra in dict.fromkeys(r["section"] for r in recs if r["section"] not in known):
        sections.append({"title": extra, "intro": ""})
    for s in sections:
        mine = [r for r in recs if r["section"] == s["title"]]
        if not mine:
            continue
        lines += [f"## {s['title']}"] + ([s["intro"], ""] if s["intro"] else []) + table(mine, s.get("row", "figure")) + [""]
    notes = folder / "notes.md"
    if notes.exists():
        lines.append(notes.read_text(encoding="utf-8").rstrip() + "\n")
    return "\n".join(lines)


def report(args) -> None:
    """Write RESULTS.md (or print it with ``--check``: exit 1 when the file differs from the records)."""
    text = render(load())
    target = Path(__file__).resolve().parent / "RESULTS.md"
    if getattr(args, "check", False):
        if target.read_text(encoding="utf-8") != text:
            raise SystemExit("RESULTS.md differs from the records: run python -m benchmarks report")
        return
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target} ({len(text.splitlines())} lines)")
