"""The code's shape: layers point one way, a module holds one concept (no module over 400 lines, as the
outcome of splitting by concept, not of packing lines), no lab notebook in the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "attnmt"


def modules() -> dict[str, ast.Module]:
    """Every module of src/attnmt, parsed, keyed by its path under src/attnmt."""
    return {str(path.relative_to(SRC)): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(SRC.rglob("*.py"))}


def test_layers_point_one_way():
    # pyproject.toml's import-linter contract: cli on top; train and decode independent of each
    # other; search and rundir below them; model and data (independent) below; then device (which
    # reads config.DEVICE_NAME); config and the small leaf modules at the bottom.
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True) == 0


def test_no_module_over_400_lines():
    # One concept per module: a module a reader can hold in mind.
    lengths = {str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
               for path in SRC.rglob("*.py")}
    assert len(lengths) > 50  # the walk found the code
    too_long = {name: n for name, n in lengths.items() if n > 400}
    assert not too_long, too_long


def test_no_conditional_expression_nests_another():
    # ``a if x else b if y else c`` reads as a puzzle: an if statement or a small function says it.
    nested = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.IfExp) and any(isinstance(inner, ast.IfExp) and inner is not node
                                                   for inner in ast.walk(node)):
                nested.append(f"{name}:{node.lineno}")
    assert not nested, nested


def packed_assignments(tree: ast.Module) -> list[int]:
    """Lines of ``a, b, c = x, y, z``: three or more values unpacked from a tuple written out, unless
    every value is a constant (an enumeration such as the special token ids)."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple) and len(node.value.elts) >= 3
                and not all(isinstance(v, ast.Constant) for v in node.value.elts)):
            lines.append(node.lineno)
    return lines


def test_packed_assignments_are_found():
    code = "a, b, c = [], 0, None\nPAD, UNK, BOS = 0, 1, 2\nk, v = key, value\n"
    assert packed_assignments(ast.parse(code)) == [1]


def test_no_assignment_packs_unrelated_values():
    # One name, one statement: a tuple of three unrelated values unpacked on one line saves lines,
    # not reading time (pairs such as ``k, v`` or ``src, tgt`` are one thing and stay).
    packed = [f"{name}:{line}" for name, tree in modules().items() for line in packed_assignments(tree)]
    assert not packed, packed


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
