"""Every figure README.md and docs/*.md quote as measured is a record's value (``benchmarks/records/``).

A figure is a number next to BLEU, tok/s, s, ms, MiB, GiB or x ("43.27 BLEU", "BLEU of 43.27", "9.53 s",
"2.1x") in prose (code blocks and inline code are commands and settings, not figures). It must equal,
at the precision the text shows, a record's value of that unit (an ``x`` also the ratio of two records of
one section and unit, a BLEU the difference of two), unless its sentence says it is not a measurement: it contains the words
``not a measurement`` (CONTRIBUTING.md), as a published figure from a paper or a setting does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = "not a measurement"
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
UNITS = {"BLEU": "BLEU", "tok/s": "tok/s", "ms": "ms", "s": "s", "MiB": "MiB", "GiB": "GiB", "x": "x", "×": "x"}
AFTER = re.compile(r"(?<![\w.,/#-])" + NUMBER + r" ?(BLEU|tok/s|ms|s|MiB|GiB|x|×)(?![\w/.-]\w)(?![\w/])")
BEFORE = re.compile(r"\bBLEU (?:of |score of )?" + NUMBER + r"(?![\w.]*\d)")


def prose(text: str) -> str:
    """Markdown without what is not prose: fenced and inline code, link targets, HTML comments, emphasis."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"[*_]{1,2}(?=\S)|(?<=\S)[*_]{1,2}", "", text)


def sentences(text: str) -> list[str]:
    """The sentences of a Markdown text's prose (paragraphs joined, split after . ! ? before a capital)."""
    out = []
    for paragraph in re.split(r"\n\s*\n", prose(text)):
        joined = " ".join(line.strip() for line in paragraph.splitlines())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(\[\"])", joined) if s]
    return out


def figures(text: str) -> list[tuple[float, str, int, str]]:
    """(number, unit, decimals shown, sentence) of every figure outside the sentences marked as no measurement."""
    out = []
    for sentence in sentences(text):
        if MARKER in sentence.lower():
            continue
        for m in AFTER.finditer(sentence):
            out.append((m.group(1), UNITS[m.group(2)], sentence))
        for m in BEFORE.finditer(sentence):
            out.append((m.group(1), "BLEU", sentence))
    return [(float(n.replace(",", "")), unit, len(n.split(".")[1]) if "." in n else 0, s) for n, unit, s in out]


def record_values(folder: Path) -> dict[str, set[float]]:
    """Unit -> the values of the records (an ``x``: "times" records and ratios of two records of one section and
    unit; a BLEU also the difference of two BLEU records of one section, as in "gains 18.8 BLEU")."""
    by_unit: dict[str, set[float]] = {}
    sections: dict = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            values = rec["value"] if isinstance(rec["value"], list) else [rec["value"]]
            unit = "x" if rec["unit"] == "times" else rec["unit"]
            by_unit.setdefault(unit, set()).update(values)
            sections.setdefault((rec["section"], rec["unit"]), set()).update(v for v in values if v)
    ratios = by_unit.setdefault("x", set())
    for (_, unit), values in sections.items():
        ratios.update(a / b for a in values for b in values if a > b)
        if unit == "BLEU":
            by_unit["BLEU"].update(a - b for a in values for b in values if a > b)
    return by_unit


def unbacked(text: str, values: dict[str, set[float]]) -> list[str]:
    """The figures of ``text`` that no record holds, each with its sentence."""
    out = []
    for number, unit, decimals, sentence in figures(text):
        if not any(round(v, decimals) == number for v in values.get(unit, ())):
            out.append(f"{number:g} {unit}: \"{sentence[:160]}\"")
    return out


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_figure_a_doc_quotes_is_a_record(path):
    problems = unbacked(path.read_text(encoding="utf-8"), record_values(REPO / "benchmarks" / "records"))
    assert not problems, (f"{path.relative_to(REPO)}: figures no record holds (measure them with python -m "
                          f"benchmarks, or say in the sentence that it is {MARKER!r}):\n  " + "\n  ".join(problems))


def test_a_number_typed_into_a_doc_without_a_record_fails_and_the_marker_exempts_it():
    values = {"BLEU": {43.27}, "s": {20.39, 25.13}, "x": {25.13 / 20.39}}
    assert unbacked("See benchmarks: 43.28 BLEU.", values) == ['43.28 BLEU: "See benchmarks: 43.28 BLEU."']
    assert unbacked("The preset scores **43.27** BLEU. Early stopping took 20.39 s.", values) == []
    assert unbacked("Early stopping is 1.2x faster (20.39 s against 25.13 s).", values) == []
    typed = "The preset scores 44.1 BLEU on test2016, and a BLEU of 41.9 on val."
    assert unbacked(typed, values) == [f'44.1 BLEU: "{typed}"', f'41.9 BLEU: "{typed}"']
    assert unbacked("It runs 3x faster in 0.5 s.", values) == ['3 x: "It runs 3x faster in 0.5 s."',
                                                              '0.5 s: "It runs 3x faster in 0.5 s."']
    cited = "The paper reports 27.3 BLEU on WMT14 (published, not a measurement of attnmt)."
    assert unbacked(cited, values) == []
    code = "Run `attnmt serve --timeout 30 s` and\n\n```\nsleep 5 s\n```\n"
    assert unbacked(code, values) == []
    assert unbacked("a 2048x2048 matmul, test2016 x 3, [link](results.md#ctranslate2s-speed)", values) == []
