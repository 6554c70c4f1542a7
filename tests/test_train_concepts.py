"""The training package's concepts, where a reader looks for them: one stop policy, a trainer
without files or log text, messages naming command-line flags left to the CLI, modules that
hold one concept (at most 400 lines each, without packed lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "attnmt"
TRAIN = SRC / "train"
SPLIT = ("trainer.py", "loop.py", "stop.py", "checkpoint.py", "setup.py", "report.py")  # the training run's parts


def functions_reading(root: Path, attributes: set[str]) -> dict[str, set[str]]:
    """For each attribute name, the functions ('path:function') of the .py files under ``root``
    that read it (``x.name`` loaded, not assigned)."""
    found: dict[str, set[str]] = {name: set() for name in attributes}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and node.attr in attributes and isinstance(node.ctx, ast.Load):
                    found[node.attr].add(f"{path.relative_to(root).as_posix()}:{function.name}")
    return found


def test_patience_and_max_epochs_are_read_in_one_function_the_stop_policy():
    found = functions_reading(SRC, {"stop_patience", "max_epochs"})
    assert found["stop_patience"] == {"train/stop.py:stop_reason"}, found
    assert found["max_epochs"] == {"train/stop.py:stop_reason"}, found


def test_the_scan_sees_a_second_reader(tmp_path):
    # the rule above could fail: a function elsewhere that reads train.stop_patience is found
    (tmp_path / "other.py").write_text("def early(tc):\n    return tc.stop_patience > 0\n", encoding="utf-8")
    (tmp_path / "assign.py").write_text("def set_it(tc):\n    tc.max_epochs = 3\n", encoding="utf-8")
    found = functions_reading(tmp_path, {"stop_patience", "max_epochs"})
    assert found == {"stop_patience": {"other.py:early"}, "max_epochs": set()}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_the_trainer_writes_no_file_and_no_log_text():
    imports = imported_modules(TRAIN / "trainer.py")
    for module in ("logging", "tqdm", "os", "json", "shutil", "pathlib", "attnmt.rundir", "attnmt.train.metrics",
                   "attnmt.train.checkpoint", "attnmt.train.report"):
        assert not any(name == module or name.startswith(module + ".") for name in imports), module
    calls = {node.func.id for node in ast.walk(ast.parse((TRAIN / "trainer.py").read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not calls & {"open", "print"}, calls & {"open", "print"}


def string_constants(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


@pytest.mark.parametrize("name", SPLIT)
def test_the_training_run_names_no_command_line_flag(name):
    # messages that name --resume or --output are the CLI's (attnmt.cli words the typed errors)
    texts = [t for t in string_constants(TRAIN / name) if "--resume" in t or "--output" in t]
    assert not texts, texts


@pytest.mark.parametrize("name", SPLIT)
def test_each_part_is_one_small_module_without_packed_lines(name):
    path = TRAIN / name
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign):  # 'a, b = x, y': two assignments on one line
            assert not (isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)), \
                f"{name}:{node.lineno} packs values into one assignment"
        if isinstance(node, ast.IfExp):
            inner = [n for n in ast.walk(node) if isinstance(n, ast.IfExp) and n is not node]
            assert not inner, f"{name}:{node.lineno} nests a conditional expression"
