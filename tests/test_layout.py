"""The code's shape: layers point one way, functions stay small, no lab notebook in the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "attnmt"
MAX_STATEMENTS = 60


def statement_counts(root: Path) -> dict[str, int]:
    """Statements inside each function of the .py files under ``root`` (nested ones included),
    keyed 'path:line name'."""
    counts = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = sum(isinstance(x, ast.stmt) for x in ast.walk(node)) - 1
                counts[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    return counts


def test_layers_point_one_way():
    # pyproject.toml's import-linter contract: cli on top; train and decode independent of each
    # other; search and rundir below them; model and data (independent) below; then device (which
    # reads config.DEVICE_NAME); config and the small leaf modules at the bottom.
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True) == 0


def test_no_function_over_60_statements():
    counts = statement_counts(SRC)
    assert len(counts) > 100  # the walk found the code
    too_long = {name: n for name, n in counts.items() if n > MAX_STATEMENTS}
    assert not too_long, too_long


def test_no_commit_hashes_or_dated_runs_in_the_source():
    # Measurements with dates and revisions belong in benchmarks/RESULTS.md, not in docstrings.
    hash_like = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b")
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if hash_like.search(line) or date.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, found
