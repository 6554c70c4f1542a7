"""docs/tutorial.ipynb: it calls attnmt's modules and holds no model code of its own (a formula
written out in one line is allowed where the same cell checks it with ``torch.allclose`` against
attnmt's module); it runs top to bottom in a fresh kernel without a cell error; its seeded cells'
stored outputs are those the current code prints; every claim a cell prints holds when it runs
(cache equals recomputation, score = log P / lp, the logged learning rates on equation 3, the loss
falls, BLEU in the range of the tiny run, the repetition it explains is in the output); neither
stored nor fresh outputs name a path of the machine."""

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


ASSIGNED = re.compile(r"^\s*(\w+)\s*=")


def _model_code(source: str) -> list[str]:
    """Lines of a cell that write model code: a Module subclass, or the attention formula unless the
    line assigns it to a name that the same cell compares with ``torch.allclose`` (a formula shown
    and checked against attnmt's module, which the notebook still uses)."""
    checked = " ".join(line for line in source.splitlines() if "torch.allclose(" in line)
    hits = []
    for line in source.splitlines():
        name = ASSIGNED.match(line)
        if MODULE_SUBCLASS.search(line) or ATTENTION_FORMULA.search(line) and not (
                name and re.search(rf"\b{name.group(1)}\b", checked)):
            hits.append(line)
    return hits


def test_the_model_code_check_finds_a_module_and_the_attention_formula():
    assert _model_code("class Attention(nn.Module):\n    pass")
    assert _model_code("class Block(torch.nn.Module): ...")
    assert _model_code("w = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)")
    assert _model_code("scores = torch.matmul(q, k.transpose(-2, -1))")
    assert _model_code("scores = torch.einsum('bhqd,bhkd->bhqk', q, k)")
    assert not _model_code("out, weights = scaled_dot_product_attention(q, k, v, pad)")
    assert not _model_code("recomputed = torch.log_softmax(model.decode(prefix, memory, src_mask).logits[0], dim=-1)")
    formula = "w = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)\n"
    assert not _model_code(formula + "print(torch.allclose(w, weights))")  # shown and checked
    assert _model_code(formula + "print(torch.allclose(other, weights))")
    assert _model_code("class Block(torch.nn.Module): ...\nprint(torch.allclose(Block, x))")


def test_the_notebook_writes_no_model_code_and_each_step_names_what_it_calls():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    hits = [line for source in code for line in _model_code(source)]
    assert sum("torch.allclose(" in source for source in code) >= 8  # the formulas it writes out are checked
    assert sum("inspect.getsource(" in source for source in code) >= 8  # and attnmt's code is shown
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
    assert len(figures) == 5  # steps 1, 3, 6 (the smoothed distribution; the training curves), 8
    assert "BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in "".join(
        t for cell in executed.cells if cell.cell_type == "code" for t in _text_outputs(cell))


def test_fresh_outputs_name_no_path_of_the_machine(executed, tmp_path):
    path = tmp_path / "executed.ipynb"
    nbformat.write(executed, path)
    assert notebook_machine_paths(path) == []


def _printed(nb) -> str:
    return "\n".join(t for cell in nb.cells if cell.cell_type == "code" for t in _text_outputs(cell))


def _number(pattern: str, text: str) -> tuple[float, ...]:
    found = re.search(pattern, text)
    assert found, f"the notebook no longer prints {pattern!r}"
    return tuple(float(g) for g in found.groups())


def test_every_true_or_false_the_notebook_prints_is_true(executed):
    text = _printed(executed)
    claims = re.findall(r"^(.*?):\s*(True|False)\b", text, re.M) + re.findall(r"\| ([^|:\n]+): (True|False)", text)
    assert len(claims) >= 20, claims  # the claims are printed
    assert all(value == "True" for _, value in claims), [claim for claim, value in claims if value == "False"]
    for claim in ("equal recomputation: True", "equal to greedy_search's tokens: True",
                  "equal to best_extensions' best K (scores, beams, pieces): True", "every score equals log P / lp: True",
                  "by hand equals MultiHeadAttention: True", "equals PositionwiseFeedForward: True",
                  "one M_5 for all: True", "padded in the batch or alone: True", "lower: True"):
        assert claim in text


def test_scaling_by_sqrt_dk_is_what_the_notebook_says(executed):
    text = _printed(executed)
    raw, scaled = _number(r"variance of q\.k ([\d.]+) \(about d_k\), of q\.k / sqrt\(d_k\) ([\d.]+)", text)
    assert 54 < raw < 74 and 0.85 < scaled < 1.15  # 10,000 samples: within 15% of 64 and of 1
    unscaled_top, unscaled_saturated = _number(r"unscaled softmax\(q\.k\): largest weight of a row ([\d.]+) on "
                                               r"average; rows above 0\.99 \(saturated\) (\d+)%", text)
    scaled_top, scaled_saturated = _number(r"divided by sqrt\(d_k\): largest weight of a row ([\d.]+) on average; "
                                           r"rows above 0\.99 \(saturated\) (\d+)%", text)
    assert unscaled_top > 0.8 and scaled_top < 0.6 and unscaled_saturated > 30 >= scaled_saturated


def test_each_score_is_the_log_probability_over_the_length_penalty(executed):
    text = _printed(executed)
    rows = re.findall(r"beam 4, length penalty alpha ([\d.]+):\n((?:  score .*\n?)+)", text)
    assert [alpha for alpha, _ in rows] == ["0.0", "0.6", "2.0"]
    for alpha, lines in rows:
        for score, log_prob, length, lp in re.findall(r"score +(-?[\d.]+) = log P +(-?[\d.]+) / lp\((\d+)\) ([\d.]+)",
                                                      lines):
            assert float(lp) == pytest.approx(((5 + int(length)) / 6) ** float(alpha), abs=1e-3)
            assert float(score) == pytest.approx(float(log_prob) / float(lp), abs=2e-3)


def test_the_tiny_run_follows_equation_3_learns_and_scores_in_its_range(executed):
    text = _printed(executed)
    logged, distance = _number(r"(\d+) logged learning rates, the largest relative distance from equation 3: "
                               r"([\d.e+-]+)", text)
    assert logged >= 20 and distance < 1e-3
    updates, _ = _number(r"(\d+) updates, ([\d.]+) epochs", text)
    first, first_step, last, last_step = _number(r"training loss per token ([\d.]+) at update (\d+) -> ([\d.]+) at "
                                                 r"update (\d+)", text)
    assert first_step <= 25 and last_step == updates and last < first - 1.5  # it learned, not drifted
    # A few hundred updates of a 64-wide model on 10,000 pairs (step 6): far above the BLEU of a
    # model that has learned only the target language (about 5: fluent captions that ignore the
    # source, as after 400 updates of 1,500 tokens), far below the preset's 42 after 56 minutes;
    # the stored run's score moves by a few points with the thread count and library versions.
    (bleu,) = _number(r"(?m)^BLEU ([\d.]+), chrF", text)
    assert 10 <= bleu <= 30


def test_the_repetition_the_notebook_explains_is_in_its_output(executed):
    text = _printed(executed)
    found = re.search(r"repeats itself: sentence (\d+)'s output holds (\d+) copies in a row of (\[.*?\]), and ended at "
                      r"(.*)", text)
    assert found, "the explanation of the repeated output is no longer printed"
    copies, pieces = int(found.group(2)), ast.literal_eval(found.group(3))
    assert copies >= 3
    assert found.group(4).startswith("the length limit")  # greedy decoding ran on, as the Markdown says
    unit = "".join(p.replace("\u2581", "") for p in pieces)
    hypotheses = re.findall(r"^     -> (.*)  \(log P", text, re.M)
    assert any(unit * copies in h.replace(" ", "") for h in hypotheses), (unit, copies, hypotheses)
