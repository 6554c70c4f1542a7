"""docs/tutorial.ipynb: it calls attnmt's modules and holds no model code of its own; it runs top to
bottom in a fresh kernel without a cell error; its seeded cells' stored outputs are those the
current code prints; neither stored nor fresh outputs name a path of the machine."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from tests.test_docs import notebook_machine_paths

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "tutorial.ipynb"

nbformat = pytest.importorskip("nbformat", reason="nbformat is missing: pip install -e '.[test]'")

# Model code written out in the notebook: an nn.Module subclass, or the attention formula (a softmax
# over a product of queries and keys).
MODULE_SUBCLASS = re.compile(r"class\s+\w+\s*\([^)]*\bModule\b")
ATTENTION_FORMULA = re.compile(r"softmax\([^\n]*(@|matmul|bmm|einsum)|(@|matmul\(|bmm\()[^\n]*?\.(transpose|mT\b|T\b)|einsum\(")
STEP = re.compile(r"^## Step (\d+)\.", re.M)


def _steps(nb) -> dict[int, tuple[str, str]]:
    """Step number -> (its Markdown, its code), each step from its '## Step N.' heading to the next."""
    steps: dict[int, tuple[str, str]] = {}
    current = None
    for cell in nb.cells:
        heading = STEP.search(cell.source) if cell.cell_type == "markdown" else None
        if heading:
            current = int(heading.group(1))
            steps[current] = (cell.source, "")
        elif current is not None:
            markdown, code = steps[current]
            steps[current] = (markdown + "\n" + cell.source, code) if cell.cell_type == "markdown" else (
                markdown, code + "\n" + cell.source)
    return steps


def _attnmt_names(nb) -> dict[str, str]:
    """Every name the notebook imports from attnmt -> its module."""
    names = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnmt"):
                    names.update({alias.asname or alias.name: node.module for alias in node.names})
    return names


def _used(code: str, names: dict[str, str]) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name) and node.id in names}


def _model_code(source: str) -> list[str]:
    return [line for line in source.splitlines() if MODULE_SUBCLASS.search(line) or ATTENTION_FORMULA.search(line)]


def test_the_model_code_check_finds_a_module_and_the_attention_formula():
    assert _model_code("class Attention(nn.Module):\n    pass")
    assert _model_code("class Block(torch.nn.Module): ...")
    assert _model_code("w = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)")
    assert _model_code("scores = torch.matmul(q, k.transpose(-2, -1))")
    assert _model_code("scores = torch.einsum('bhqd,bhkd->bhqk', q, k)")
    assert not _model_code("out, weights = scaled_dot_product_attention(q, k, v, pad)")
    assert not _model_code("recomputed = torch.log_softmax(model.decode(prefix, memory, src_mask).logits[0], dim=-1)")


def test_the_notebook_writes_no_model_code_and_each_step_names_what_it_calls():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    hits = [line for source in code for line in _model_code(source)]
    assert not hits, "model code in the notebook:\n" + "\n".join(hits)
    steps = _steps(nb)
    assert sorted(steps) == list(range(1, 10))
    names = _attnmt_names(nb)
    for number in range(1, 9):
        markdown, source = steps[number]
        used = _used(source, names)
        assert used, f"step {number} calls nothing of attnmt"
        unnamed = sorted(name for name in used if name not in markdown)
        assert not unnamed, f"step {number}'s Markdown does not name {unnamed}"
        assert re.search(r"\b(section|equation)s? \d", markdown), f"step {number} names no section or equation"
        printed = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" and cell.source in source
                          for o in cell.outputs)
        assert re.search(r"\(\d+(, \d+)+\)", printed), f"step {number} prints no tensor shape"


def _text_outputs(cell) -> list[str]:
    """A code cell's printed text (stdout, then stderr, each whole: the kernel may send one print
    in several messages) and its text results; figures left out."""
    outputs = cell.get("outputs", [])
    streams = ["".join(o.text for o in outputs if o.output_type == "stream" and o.name == name)
               for name in ("stdout", "stderr")]
    return [text for text in streams if text] + [o.data.get("text/plain", "") for o in outputs
                                                 if o.output_type == "execute_result"]


def _kernel_manager(kernels: Path):
    """A kernel manager for a kernel of this interpreter (the venv's python, with attnmt), whatever
    kernels the machine has installed."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    (kernels / "attnmt-test").mkdir(parents=True)
    (kernels / "attnmt-test" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "attnmt tests", "language": "python"}), encoding="utf-8")
    return KernelManager(kernel_name="attnmt-test", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook run top to bottom in a fresh kernel (cells of the stored notebook, outputs
    cleared); the test fails on the first cell that raises."""
    pytest.importorskip("nbclient", reason="nbclient is missing: pip install -e '.[test]'")
    pytest.importorskip("ipykernel", reason="ipykernel is missing: pip install -e '.[test]'")
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from attnmt.data.corpus import dataset_pair_files
    from attnmt.errors import DataError

    try:  # as step 6 reads it: $ATTNMT_DATA, else the registry's download
        for split in ("train", "val", "test_2016_flickr"):
            dataset_pair_files("multi30k", "de-en", split)
    except DataError as e:
        pytest.skip(f"Multi30k is neither in $ATTNMT_DATA nor downloadable: {e}")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, km=_kernel_manager(tmp_path_factory.mktemp("kernels")), timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"a cell of {NOTEBOOK.name} failed:\n{str(e)[-3000:]}")
    return nb


def test_the_notebook_runs_top_to_bottom_with_the_stored_outputs_of_its_seeded_cells(executed):
    stored = nbformat.read(NOTEBOOK, as_version=4)
    assert len(stored.cells) == len(executed.cells)
    seeded = [(old, new) for old, new in zip(stored.cells, executed.cells) if "seeded" in old.metadata.get("tags", [])]
    assert len(seeded) >= 6
    for old, new in seeded:
        assert _text_outputs(new), f"a seeded cell printed nothing:\n{new.source[:200]}"
        assert _text_outputs(new) == _text_outputs(old), (
            f"stored outputs differ from the current code's; rerun the notebook and store them:\n{old.source[:200]}")
    figures = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs
               if "image/png" in o.get("data", {})]
    assert len(figures) == 4
    assert "BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in "".join(
        t for cell in executed.cells if cell.cell_type == "code" for t in _text_outputs(cell))


def test_fresh_outputs_name_no_path_of_the_machine(executed, tmp_path):
    path = tmp_path / "executed.ipynb"
    nbformat.write(executed, path)
    assert notebook_machine_paths(path) == []
