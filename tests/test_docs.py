"""The documentation: the site builds with ``mkdocs build --strict``; every page of docs/ is in its
navigation; every subcommand of the command line and every configuration key (each with a
description) appears in it; the README and the results record stay short; the YAML examples
of the docs validate; no path of a build machine is committed."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnmt.cli import build_parser
from attnmt.config import Config, config_from_yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "_hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built in strict mode (any warning fails the build)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _nav_pages(nav) -> set[str]:
    pages = set()
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_of_docs_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "#"))
    pages = {p.relative_to(DOCS).as_posix() for pattern in ("*.md", "*.ipynb") for p in DOCS.rglob(pattern)
             if "_hooks" not in p.parts and ".ipynb_checkpoints" not in p.parts}
    assert "tutorial.ipynb" in pages
    assert pages == _nav_pages(config["nav"])


def test_every_cli_subcommand_is_on_the_command_line_page(site):
    text = _text(site / "cli" / "index.html")
    paths = [path for path, _ in _hook()._subcommands(build_parser(), "attnmt")]
    assert len(paths) >= 12 and "attnmt plot-positions" in paths
    for path in paths:
        assert f"usage: {path}" in text, path
        assert re.search(rf"{re.escape(path)}\s*¶", text), f"no section for {path}"


def test_every_configuration_key_is_on_the_configuration_page_with_its_description(site):
    text = _text(site / "configuration" / "index.html")
    rows = _hook().config_rows(Config, "")
    keys = {key for key, *_ in rows}
    assert {"train.t_mul", "model.positional_layout", "decode.beam_size", "tokenizer.min_freq"} <= keys
    for key, _, _, _, description in rows:
        if "." in key:  # the sections themselves are headings
            assert key in text, key
            assert " ".join(description.split("*(")[0].split())[:40].replace("\\|", "|") in text, key


def test_every_configuration_key_has_a_description():
    rows = _hook().config_rows(Config, "")  # raises ValueError naming a key without one
    assert len(rows) > 90 and all(description for *_, description in rows)


def test_a_key_without_a_description_fails(monkeypatch):
    hook = _hook()
    field = Config.model_fields["train"].annotation.model_fields["t_mul"]
    monkeypatch.setattr(field, "description", None)
    with pytest.raises(ValueError, match="train.t_mul has no description"):
        hook.config_rows(Config, "")


def test_the_generated_pages_hold_the_results_and_the_modules(site):
    results = _text(site / "results" / "index.html")
    assert "Training throughput" in results and "AMD EPYC" in results
    architecture = _text(site / "architecture" / "index.html")
    for module in ("attnmt.model.positional", "attnmt.config", "attnmt.visualize"):
        assert module in architecture
    api = _text(site / "api" / "index.html")
    assert "sinusoidal_table" in api and "load_config" in api


def test_the_tutorial_page_holds_its_steps_and_figures(site):
    page = (site / "tutorial" / "index.html").read_text(encoding="utf-8")
    text = _text(site / "tutorial" / "index.html")
    assert all(f"Step {n}." in text for n in range(1, 10))
    assert "fused kernel equals the explicit formula (padding mask): True" in text  # a stored output
    assert page.count('src="data:image/png;base64,') == 5  # the five figures, stored in the notebook


def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_configuration_examples_in_the_readme_and_docs_validate():
    blocks = [(p, b) for p in [REPO / "README.md", *DOCS.glob("*.md")] for b in _yaml_blocks(p)]
    configs = [(p, b) for p, b in blocks if isinstance(yaml.safe_load(b), dict)
               and set(yaml.safe_load(b)) <= set(Config.model_fields) and "data" in yaml.safe_load(b)]
    assert configs, "no configuration example found"
    for path, block in configs:
        config_from_yaml(block, path)


def test_readme_stays_short():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_every_results_table_names_its_cpu_date_and_command():
    """benchmarks/RESULTS.md: per figure (a '## ' section) at most one table, whose header has a
    CPU, a date and a command column."""
    sections = re.split(r"^## ", (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"), flags=re.M)[1:]
    assert len(sections) >= 5
    for section in sections:
        lines = section.splitlines()
        title = lines[0]
        headers = [line for line, below in zip(lines, lines[1:])
                   if line.startswith("|") and re.match(r"^\|\s*-", below)]
        assert len(headers) <= 1, f"{title}: {len(headers)} tables"
        for header in headers:
            columns = [c.strip().lower() for c in header.strip("|").split("|")]
            assert {"cpu", "date", "command"} <= set(columns), f"{title}: columns {columns}"


MACHINE_PATH = re.compile(r"(?<![\w.-])/(?:work|home|root)/")
# In a notebook's outputs also the temporary files and the installed packages of the machine that ran it.
NOTEBOOK_MACHINE_PATH = re.compile(r"(?<![\w.-])/(?:work|home|root|tmp|private|Users)/|site-packages|[A-Z]:\\")


def notebook_machine_paths(path: Path) -> list[str]:
    """'name:cell N: line' for each line of a notebook's cells and text outputs that names a path
    of a machine (its figures, base64 PNG data, are not text and are left out)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    hits = []
    for n, cell in enumerate(cells, start=1):
        texts = [cell["source"]]
        for output in cell.get("outputs", []):
            texts += [output.get("text", ""), output.get("traceback", []), output.get("evalue", "")]
            texts += [value for kind, value in output.get("data", {}).items() if not kind.startswith("image/")]
        for text in texts:
            for line in "".join(text).splitlines():
                pattern = MACHINE_PATH if text is cell["source"] else NOTEBOOK_MACHINE_PATH
                if pattern.search(line):
                    hits.append(f"{path.name}:cell {n}: {line.strip()[:100]}")
    return hits


def test_the_notebook_path_check_finds_a_path_in_an_output(tmp_path):
    cell = {"cell_type": "code", "source": "print(work)", "metadata": {}, "execution_count": 1, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["run in /tmp/attnmt-tutorial-x1/run\n"]},
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBOR+/" + "home/y+/" + "tmp/z"}}]}
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps({"cells": [cell]}), encoding="utf-8")
    assert notebook_machine_paths(path) == ["t.ipynb:cell 1: run in /tmp/attnmt-tutorial-x1/run"]


def test_no_path_of_a_build_machine_is_committed():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    hits = []
    for name in filter(None, files):
        path = REPO / name.decode()
        if path.suffix in {".png", ".gz", ".safetensors", ".model"} or not path.is_file():
            continue
        if path.suffix == ".ipynb":
            hits += notebook_machine_paths(path)
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if MACHINE_PATH.search(line):
                hits.append(f"{name.decode()}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_ci_runs_the_readme_install_lines_and_test_command_as_written():
    """.ci/run runs README command 1's install lines and command 2 verbatim, after installing the
    system packages that README command 1 names for the browser features."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command1, command2 = re.findall(r"```bash\n(.*?)```", readme, re.S)[:2]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install = [line for line in command1.splitlines() if line.startswith(("python3 -m venv", ".venv/bin/pip"))]
    assert len(install) == 3 and all(line in ci for line in install)
    assert command2.strip() == ".venv/bin/python -m pytest -q" and command2.strip() in ci
    packages = re.search(r"apt-get install ([a-z0-9 -]+)", command1).group(1).split()
    assert sorted(packages) == ["chromium", "nodejs", "npm"]
    assert all(re.search(rf"\b{p}\b", "\n".join(ci)) for p in packages)


def test_readme_command_1_is_one_block_for_anyone_s_machine():
    """Command 1 names nothing of this repository's layout (no shared folder, no ATTNMT_DATA: a
    user's machine downloads Multi30k), evaluates a named test set, and says where PyTorch's CPU
    wheel comes from beside its install line; .ci/run points ATTNMT_DATA at the local copy itself."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command1 = re.findall(r"```bash\n(.*?)```", readme, re.S)[0]
    assert "shared" not in command1 and "ATTNMT_DATA" not in command1 and "$DATA" not in command1
    assert "attnmt evaluate --model runs/de-en --testset multi30k:test_2016_flickr" in command1
    lines = command1.splitlines()
    torch = lines.index(".venv/bin/pip install torch==2.13.0")
    assert lines[torch - 1].startswith("#") and "--index-url https://download.pytorch.org/whl/cpu" in lines[torch - 1]
    assert "export ATTNMT_DATA=DIR" in readme.split(command1 + "```")[1].split("```")[0]  # the offline machine's line
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'\[ -d \.\./shared/data/multi30k \]; then export ATTNMT_DATA=', ci)


DOC_PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

# Words that tell the project's history instead of what the code does now.
HISTORY = re.compile("|".join([
    r"\bissues? #?\d+", r"\bPR #?\d+", r"\b(earlier|previous|older) versions?\b", r"\bas before\b",
    r"\bbefore and after\b", r"\bbefore this (change|record|planner|version|release)\b", r"\bthe code before\b",
    r"\bthe estimate it replaces\b", r"\bit replaces\b", r"\blast (round|session|run|time)\b",
    r"\bthis (round|session)\b", r"\bno longer\b", r"\bused to\b", r"\bpreviously\b", r"\bformerly\b",
    r"\bat hand\b", r"\bgit history\b", r"\buntil measured\b", r"\ba slower day\b", r"\bbusy day\b",
    r"\bthat day\b", r"\bnowadays\b", r"\bcommit [0-9a-f]{7,40}\b",
]), re.I)


def _history_hits(text: str, name: str) -> list[str]:
    return [f"{name}:{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), start=1)
            for m in HISTORY.finditer(line)]


def test_the_docs_tell_what_the_code_does_not_its_history():
    hits = [hit for page in DOC_PAGES for hit in _history_hits(page.read_text(encoding="utf-8"), page.name)]
    assert not hits, "\n".join(hits)
    assert _history_hits("Loaded as before; see issue 58 and the estimate it replaces.", "x") == [
        "x:1: 'as before'", "x:1: 'issue 58'", "x:1: 'the estimate it replaces'"]


def _code(text: str) -> list[str]:
    """The code of a page: each line of its fenced blocks (continuation lines joined) and each
    inline code span."""
    blocks = re.findall(r"```[\w-]*\n(.*?)```", text, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```[\w-]*\n.*?```", "", text, flags=re.S))
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()] + spans


def _subcommand_flags() -> dict[str, set[str]]:
    parser = build_parser()
    common = {o for a in parser._actions for o in a.option_strings}
    return {path.removeprefix("attnmt "): common | {o for a in sub._actions for o in a.option_strings}
            for path, sub in _hook()._subcommands(parser, "attnmt")}


def _flags_used(code: list[str], subcommands: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(subcommand, --flag) for each flag written after ``attnmt SUBCOMMAND`` (or at the start of a
    span, ``translate --engine``), up to the end of that command (a pipe, ;, && or the next attnmt)."""
    names = "|".join(sorted(map(re.escape, subcommands), key=len, reverse=True))
    command = re.compile(rf"(?:^|(?<=[\s/(]))(?:attnmt\s+)?({names})(?=\s)(.*)")
    used = []
    for line in code:
        for part in re.split(r"\|(?!\|)|;|&&", line):
            for m in command.finditer(part.strip()):
                if not (m.group(0).startswith("attnmt") or m.start() == 0):
                    continue
                rest = re.split(r"\battnmt\s", m.group(2))[0]
                used += [(m.group(1), flag) for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)]
    return used


def test_every_flag_the_docs_name_exists_in_its_subcommand():
    subcommands = _subcommand_flags()
    used = [(page.name, sub, flag) for page in DOC_PAGES
            for sub, flag in _flags_used(_code(page.read_text(encoding="utf-8")), subcommands)]
    assert len(used) > 150 and len({(s, f) for _, s, f in used}) > 40  # the check reads the pages
    missing = [f"{page}: attnmt {sub} {flag}" for page, sub, flag in used if flag not in subcommands[sub]]
    assert not missing, "\n".join(missing)
    assert _flags_used(["cat x | attnmt translate --model m --beam 3 | attnmt score --ref r"], subcommands) == [
        ("translate", "--model"), ("translate", "--beam"), ("score", "--ref")]


# A dotted name under a section of the configuration: data.train[1].tgt_lang, model.d_model.
CONFIG_KEY = re.compile(r"(?<![\w./$-])((?:%s)(?:\.[A-Za-z_]\w*|\[\d*\])+)(?![\w/-])" % "|".join(Config.model_fields))
# ... that are file names rather than keys (train.de.gz, model.safetensors, train.00000.src.bin).
FILE_PART = {"de", "en", "fr", "cs", "gz", "txt", "bin", "npy", "safetensors", "json", "jsonl", "yaml", "pt",
             "model", "src", "tgt", "vec", "onnx", "hyp"}


def _config_keys_used(code: list[str]) -> list[str]:
    keys = []
    for span in code:
        for m in CONFIG_KEY.finditer(span):
            parts = re.sub(r"\[\d*\]", "", m.group(1)).split(".")
            if parts[-1] not in FILE_PART:
                keys.append(m.group(1))
    return keys


def test_every_configuration_key_the_docs_name_exists():
    known = {key for key, *_ in _hook().config_rows(Config, "")}
    used = [(page.name, key) for page in DOC_PAGES
            for key in _config_keys_used(_code(page.read_text(encoding="utf-8")))]
    assert len(used) > 100 and len({k for _, k in used}) > 50  # the check reads the pages
    unknown = [f"{page}: {key}" for page, key in used
               if re.sub(r"\[\d*\]", "[]", key) not in known and key not in {"train.lr_rate"}]  # a typo shown as one
    assert not unknown, "\n".join(unknown)
    assert _config_keys_used(["--set train.max_minutes=30 data.train[1].tgt_lang train.de.gz model.safetensors"]) == [
        "train.max_minutes", "data.train[1].tgt_lang"]


def test_every_link_to_a_results_section_names_one(site):
    """The docs cite a figure by its section of benchmarks/RESULTS.md (results.md#SECTION): each
    such anchor is a heading of the built results page."""
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    links = [(page.name, anchor) for page in DOCS.glob("*.md")
             for anchor in re.findall(r"\]\(results\.md#([\w-]+)\)", page.read_text(encoding="utf-8"))]
    assert len(links) >= 10
    missing = [f"{page}: results.md#{anchor}" for page, anchor in links if f'id="{anchor}"' not in results]
    assert not missing, "\n".join(missing)
