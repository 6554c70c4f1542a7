"""Concept rules about names: the export file names are written in one module, torchrun's
``RANK`` is read in one module, and no module of ``attnmt.decode`` outgrows one concept."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt import torchrun
from attnmt.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"


def _docstring_nodes(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def modules_with_string(pattern: str) -> list[str]:
    """The modules of src/attnmt (relative paths) with a string literal, other than a docstring,
    that ``pattern`` matches (f-string parts included)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and re.search(pattern, node.value):
                found.append(path.relative_to(SRC).as_posix())
                break
    return found


@pytest.mark.parametrize("name", ["model.bin", "encoder.onnx", "decoder_step.onnx"])
def test_each_export_file_name_is_written_in_one_module(name):
    # rundir.py names every file of a model directory; exporters, engines, the CLI's checks and
    # distillation use its constants. A word boundary keeps MarianMT's pytorch_model.bin apart.
    assert modules_with_string(rf"(?<![\w.]){re.escape(name)}\b") == ["rundir.py"]


def test_the_name_rules_see_literals_in_f_strings_and_skip_docstrings():
    # The detector itself: a name inside an f-string counts, the same name in a docstring does not.
    tree = ast.parse('"""model.bin in a docstring."""\nx = f"{d}: no model.bin"\n')
    docs = _docstring_nodes(tree)
    hits = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and "model.bin" in n.value]
    assert hits == [": no model.bin"]


def test_torchrun_rank_is_read_in_one_module():
    assert modules_with_string(r"^RANK$") == ["environment.py"]


def test_the_main_process_is_rank_0_or_no_torchrun():
    assert torchrun.is_main_process({})
    assert torchrun.is_main_process({"RANK": "0", "WORLD_SIZE": "2"})
    assert not torchrun.is_main_process({"RANK": "1", "WORLD_SIZE": "2"})
    assert not torchrun.is_main_process({"RANK": "x"})  # not rank 0; training refuses it in from_env
    with pytest.raises(ConfigError, match="^RANK='x'"):
        torchrun.from_env({"RANK": "x"})
    assert torchrun.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == torchrun.Ranks(1, 2, 1)


def test_the_rank_reader_and_the_command_line_import_no_torch():
    # The CLI asks for the rank for every command, --help included: that must not load PyTorch.
    code = "import sys, attnmt.torchrun, attnmt.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_decode_module_over_400_lines():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in (SRC / "decode").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
    assert "translator.py" in sizes
