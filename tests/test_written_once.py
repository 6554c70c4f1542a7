"""Concepts written in one place: the hypothesis record (and the output lines of ``attnmt
translate``), the 503 of a busy server for both HTTP APIs, and the stopping rule's defaults.

Each rule is checked on the code (an AST scan of ``src/attnmt``) and on the behaviour it keeps."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from attnmt import cli
from attnmt.decode.output import hypothesis_record
from attnmt.decode.translator import Translator
from attnmt.search.options import stopping_rule
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import wait_ready

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"
RECORD_KEYS = ["text", "score", "log_prob", "tokens", "token_probs", "mean_log_prob", "words", "word_probs"]


def functions_where(root: Path, found) -> set[str]:
    """'path:function' (the innermost enclosing function, or '<module>') of every node of the .py
    files under ``root`` for which ``found(node)`` is true; paths relative to ``src/attnmt`` (to
    ``root`` outside it)."""
    base = SRC if root.is_relative_to(SRC) else root
    places = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owner = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    owner[inner] = node.name  # ast.walk goes outside in: the innermost function wins
        for node in ast.walk(tree):
            if found(node):
                places.add(f"{path.relative_to(base).as_posix()}:{owner.get(node, '<module>')}")
    return places


def sets_record_key(node: ast.AST, keys=frozenset({"token_probs", "mean_log_prob"})) -> bool:
    """``node`` sets a key of the hypothesis record: a dict literal's key, a keyword argument
    (a pydantic model, ``dict.update``) or an assignment to a subscript."""
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value in keys for k in node.keys)
    if isinstance(node, ast.keyword):
        return node.arg in keys
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
        return isinstance(node.slice, ast.Constant) and node.slice.value in keys
    return False


def test_the_hypothesis_record_is_built_in_one_function():
    assert functions_where(SRC, sets_record_key) == {"decode/output.py:hypothesis_record"}


def test_the_record_scan_finds_a_second_builder(tmp_path):
    # The rule above would catch a copy: a server building its own hypothesis dict.
    (tmp_path / "copy.py").write_text("def respond(h):\n    return {'text': h.text, 'token_probs': []}\n")
    (tmp_path / "model.py").write_text("def out(h):\n    return Out(mean_log_prob=h.mean_log_prob)\n")
    found = functions_where(tmp_path, sets_record_key)
    assert {p.split(":")[1] for p in found} == {"respond", "out"}


def names_a_refusal(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("QueueFull", "Closed")


def test_busy_becomes_503_in_one_place():
    # QueueFull and Closed are raised by the batcher; outside it only AppState.busy tells them
    # apart, and every route that catches the batcher's refusal (Busy) answers with it.
    outside = {p for p in functions_where(SRC / "serve", names_a_refusal) if not p.startswith("serve/batcher.py")}
    assert outside == {"serve/app.py:busy"}
    handlers = []
    for path in sorted((SRC / "serve").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None and "Busy" in ast.unparse(node.type):
                calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)]
                handlers.append((path.name, any(ast.unparse(c.func) == "state.busy" for c in calls),
                                 any(isinstance(c, ast.Constant) and c.value == 503 for c in ast.walk(node))))
    assert {name for name, _, _ in handlers} == {"libre.py", "routes.py"}  # both APIs catch it
    assert all(calls_busy and not writes_503 for _, calls_busy, writes_503 in handlers), handlers


def compares_stopping_rule_to_none(node: ast.AST) -> bool:
    """``early_stopping is None``, ``args.patience is not None`` and the like."""
    if not (isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot))):
        return False
    name = node.left.id if isinstance(node.left, ast.Name) else getattr(node.left, "attr", None)
    return name in ("early_stopping", "patience")


def test_the_stopping_rule_defaults_are_written_once():
    assert functions_where(SRC, compares_stopping_rule_to_none) == {"search/options.py:stopping_rule"}


@pytest.mark.parametrize("decode, given, want", [
    ((False, 1.0), (None, None), (False, 1.0)),
    ((True, 1.5), (None, None), (True, 1.5)),
    ((False, 1.0), (True, None), (True, 1.0)),
    ((True, 1.5), (True, None), (True, 1.5)),
    ((True, 1.5), (False, None), (False, 1.0)),  # early stopping off alone: the patience goes back to 1
    ((True, 1.5), (None, 2.0), (True, 2.0)),
    ((False, 1.0), (False, 3.0), (False, 3.0)),  # left for SearchOptions to refuse
])
def test_stopping_rule_defaults(decode, given, want):
    config = SimpleNamespace(early_stopping=decode[0], patience=decode[1])
    assert stopping_rule(config, *given) == want


@pytest.fixture(scope="module")
def translator(dictionary_model_dir):
    return Translator.from_dir(dictionary_model_dir, device="cpu")


def test_cli_and_server_write_the_same_hypothesis_record(dictionary_model_dir, translator, tmp_path):
    sentence = "ein mann sieht hund"
    (tmp_path / "in.txt").write_text(sentence + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert cli.main(["translate", "--model", str(dictionary_model_dir), "--input", str(tmp_path / "in.txt"), "--output",
                     str(out), "--format", "jsonl", "--beam-size", "3", "--nbest", "2", "--device", "cpu"]) == 0
    line = json.loads(out.read_text(encoding="utf-8"))
    with TestClient(create_app(lambda: translator)) as client:
        wait_ready(client)
        body = client.post("/v1/translate", json={"text": sentence, "beam_size": 3, "nbest": 2,
                                                  "return_scores": True}).json()
    served = body["translations"][0]["hypotheses"]
    assert [list(h) for h in line["hypotheses"]] == [RECORD_KEYS, RECORD_KEYS]
    assert [list(h) for h in served] == [RECORD_KEYS, RECORD_KEYS]
    assert [h["tokens"] for h in served] == [h["tokens"] for h in line["hypotheses"]]
    best = translator.translate([sentence], beam_size=3, nbest=2)[0].hypotheses[0]
    want = hypothesis_record(best, translator.confidence)
    assert list(want) == RECORD_KEYS and want["words"] and want["text"] == line["hypotheses"][0]["text"]
    for key in ("score", "log_prob", "token_probs", "mean_log_prob", "word_probs"):
        assert line["hypotheses"][0][key] == pytest.approx(want[key]), key


def test_a_busy_server_is_503_with_retry_after_on_both_apis(translator):
    settings = ServeSettings(max_queue=2, retry_after_s=4)
    with TestClient(create_app(lambda: translator, settings, languages=("src", "tgt"))) as client:
        wait_ready(client)
        full = client.post("/v1/translate", json={"text": ["hund", "katze", "frau"]})
        libre_full = client.post("/translate", json={"q": "hund\nkatze\nfrau", "source": "src", "target": "tgt"})
        client.app.state.attnmt.service.close()  # as on shutdown: the batcher takes no more jobs
        closed = [client.post("/v1/translate", json={"text": "hund"}),
                  client.post("/v1/translate/stream", json={"text": "hund"})]
        libre_closed = client.post("/translate", json={"q": "hund", "source": "src", "target": "tgt"})
    for r in (full, libre_full, *closed, libre_closed):
        assert r.status_code == 503 and r.headers["retry-after"] == "4", r.text
    assert full.json() == {"detail": "too busy: 0 sentences are queued (limit 2)"}
    assert libre_full.json() == {"error": "Slowdown: 0 sentences are queued (limit 2)"}
    assert [r.json() for r in closed] == [{"detail": "the server is shutting down"}] * 2
    assert libre_closed.json() == {"error": "Slowdown: the server is shutting down"}
