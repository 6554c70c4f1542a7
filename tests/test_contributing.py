"""The rules CONTRIBUTING.md and docs/architecture.md state, each held by a check of the code (the
layers themselves: import-linter, ``tests/test_layout.py``): which modules know the command
line's parser, HTTP, progress bars and other libraries' formats; that every file is renamed into
place by ``attnmt.atomic`` alone; that the rules between configuration keys live in
``config/rules.py``; that every 503 of the server comes from ``AppState``."""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

import pytest

from attnmt.config import config_from_dict
from attnmt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "attnmt"
CONTRIBUTING = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


def importers(top_levels: set[str], trees: dict[str, ast.Module] | None = None) -> set[str]:
    """The modules (paths under src/attnmt) that import any of ``top_levels`` (a package, or a dotted module
    such as ``urllib.request``: parsing a URL with ``urllib.parse`` is not speaking HTTP), at the top or in a
    function."""
    found = set()
    for name, tree in (trees or _trees()).items():
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            if any(m == t or m.startswith(t + ".") for m in modules for t in top_levels):
                found.add(name)
    return found


def _named_in_contributing(paths: set[str]) -> list[str]:
    """The paths that CONTRIBUTING.md does not name (a package's modules by its name, ``cli``)."""
    return [p for p in sorted(paths) if f"`{p}`" not in CONTRIBUTING and f"`{p.split('/')[0]}`" not in CONTRIBUTING]


def test_the_import_scan_finds_a_nested_import():
    tree = ast.parse("def f():\n    from tqdm import tqdm\n")
    assert importers({"tqdm"}, {"x.py": tree}) == {"x.py"}
    assert importers({"argparse"}, {"x.py": tree}) == set()


def test_only_the_command_line_knows_its_parser():
    assert {p.split("/")[0] for p in importers({"argparse"})} == {"cli"}


@pytest.mark.parametrize("libraries, allowed", [
    ({"urllib.request", "urllib.error", "http", "httpx", "requests", "fastapi", "starlette", "sse_starlette", "uvicorn"},
     {"serve", "cli/serving.py", "data/download.py"}),  # HTTP
    ({"tqdm"}, {"cli", "data/download.py", "data/prepare.py", "train/report.py", "distill.py"}),  # progress bars
    ({"ctranslate2", "onnx", "onnxruntime", "transformers"}, {"interop"}),  # other libraries' model formats
])
def test_the_outside_world_is_known_where_contributing_says(libraries, allowed):
    found = importers(libraries)
    assert found  # the scan sees the imports
    outside = sorted(p for p in found if p not in allowed and p.split("/")[0] not in allowed)
    assert not outside, f"{outside} import {sorted(libraries)}: move the code, or say so in CONTRIBUTING.md"
    assert not _named_in_contributing(allowed), "CONTRIBUTING.md no longer names where they are known"


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
# Flags of other programs that attnmt runs: a compiler's, npm's; and of torchrun, which runs attnmt
# (attnmt.environment names the flag that sets TORCHELASTIC_MAX_RESTARTS).
OTHER_PROGRAMS = {"--version", "--no-audit", "--no-fund", "--max-restarts"}


def _flags_outside_the_command_line() -> dict[str, set[str]]:
    """module -> the flags its strings name (docstrings left out), for every module outside cli/."""
    from tests.test_concepts_names import _docstring_nodes

    out = {}
    for name, tree in _trees().items():
        if name.startswith("cli/"):
            continue
        docstrings = _docstring_nodes(tree)
        flags = {f for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docstrings for f in FLAG.findall(node.value)} - OTHER_PROGRAMS
        if flags:
            out[name] = flags
    return out


def test_messages_outside_the_command_line_name_only_real_flags_and_model_and_search_none():
    from tests.test_docs import _subcommand_flags

    real = set().union(*_subcommand_flags().values())
    named = _flags_outside_the_command_line()
    assert "--set" in named["config/loading.py"]  # the scan reads the messages
    wrong = {name: sorted(flags - real) for name, flags in named.items() if flags - real}
    assert not wrong, f"messages name flags the command line does not have: {wrong}"
    assert not [name for name in named if name.split("/")[0] in ("model", "search")]


def test_files_are_renamed_into_place_by_attnmt_atomic_alone():
    renames = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    node.func.attr == "rename" or ast.unparse(node.func) in ("os.replace", "shutil.move")):
                renames.append(f"{name}:{node.lineno}")
    assert renames and all(r.startswith("atomic.py:") for r in renames), renames
    for writer in ("data/manifest.py", "data/download.py", "data/shards.py", "rundir.py", "train/checkpoint.py"):
        assert "from attnmt.atomic import" in (SRC / writer).read_text(encoding="utf-8"), writer
    assert "`attnmt.atomic`" in CONTRIBUTING and "`atomic`" in ARCHITECTURE


def test_the_manifest_is_fsynced_before_it_is_renamed(tmp_path, monkeypatch):
    import os

    from attnmt import atomic
    from attnmt.data.manifest import MANIFEST, Manifest

    events = []
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: events.append("fsync"))
    real_replace = os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("rename"), real_replace(a, b)))
    manifest = Manifest.__new__(Manifest)
    monkeypatch.setattr(Manifest, "to_dict", lambda self: {"format": "x"})
    manifest.save(tmp_path)
    assert (tmp_path / MANIFEST).read_text(encoding="utf-8").startswith("{")
    assert events == ["fsync", "rename", "fsync"]  # the file, the rename, the directory


# ConfigErrors outside config/ that name two keys, and why each is not a rule between keys (they
# need what the keys point at); any other is a rule that belongs in config/rules.py.
NOT_KEY_RULES = {
    "languages.py": "the target languages of the training corpora, read from the dataset registry",
    "distill.py": "what the distill command needs of the student configuration",
    "train/data.py": "the number of batches the prepared data holds, against the processes",
}
KEY = re.compile(r"\b(?:data|tokenizer|model|train|decode)\.[a-z_]+\b")


def test_rules_between_keys_live_in_config_rules():
    found = {}
    for name, tree in _trees().items():
        if name.startswith("config/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and ast.unparse(
                    node.exc.func) == "ConfigError" and len(set(KEY.findall(ast.unparse(node.exc)))) >= 2:
                found.setdefault(name, []).append(node.lineno)
    assert set(found) == set(NOT_KEY_RULES), found
    assert "`config/rules.py`" in CONTRIBUTING and "`rules.py`" in ARCHITECTURE


@pytest.mark.parametrize("settings, key", [
    ({"tokenizer": {"target_languages": ["de", "fr"], "joint": False}}, "tokenizer.target_languages"),
    ({"tokenizer": {"target_languages": ["de", "fr"]}, "train": {"subword_alpha": 0.1}}, "train.subword_alpha"),
])
def test_a_multilingual_model_s_rules_are_checked_when_the_configuration_is_read(settings, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(settings)


def test_a_model_found_multilingual_in_its_data_is_held_to_the_same_rules():
    from attnmt import languages

    config = config_from_dict({"data": {"train": [
        {"src": "a.de", "tgt": "a.en", "src_lang": "de", "tgt_lang": "en"},
        {"src": "b.de", "tgt": "b.fr", "src_lang": "de", "tgt_lang": "fr"}]}, "tokenizer": {"joint": False}})
    with pytest.raises(ConfigError, match="one SentencePiece vocabulary"):
        languages.resolve(config)


def test_every_503_comes_from_app_state():
    # A 503 written anywhere in serve/ is a call in AppState (app.py); the OpenAPI descriptions'
    # keys in routes.py are not calls.
    made = []
    for path in sorted((SRC / "serve").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == 503
                                                  for a in [*node.args, *(k.value for k in node.keywords)]):
                made.append(f"{path.name}:{node.lineno}")
    assert made and all(m.startswith("app.py:") for m in made), made
    assert "`AppState`" in ARCHITECTURE


def test_health_while_loading_is_a_503_with_retry_after():
    from fastapi.testclient import TestClient

    from attnmt.serve.app import create_app
    from attnmt.serve.settings import ServeSettings

    release = threading.Event()

    def loader():
        release.wait(30)
        raise RuntimeError("no model here")

    with TestClient(create_app(loader, ServeSettings(retry_after_s=9))) as client:
        loading = client.get("/health")
        release.set()
    assert loading.status_code == 503 and loading.json() == {"status": "loading"}
    assert loading.headers["retry-after"] == "9"
