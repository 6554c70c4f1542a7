"""The HTTP API against a model trained in the test session: results, limits, loading, batching."""

from __future__ import annotations

import asyncio
import math
import re
import sys
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnmt import cli
from attnmt.decode.translator import Translator
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import wait_ready

SENTENCES = ["ein mann sieht hund", "frau fährt auto", "kind spielt ball und katze sieht haus", "groß rot",
             "hund und katze", "mann fährt rot auto durch stadt", "frau sieht kind", "katze"]


@pytest.fixture(scope="module")
def translator(dictionary_model_dir):
    return Translator.from_dir(dictionary_model_dir)


@pytest.fixture(scope="module")
def client(translator):
    settings = ServeSettings(max_sentences=8, max_chars=60, max_beam_size=6, max_body_bytes=3000)
    with TestClient(create_app(lambda: translator, settings, name="dictionary")) as c:
        wait_ready(c)
        yield c


def test_translations_in_input_order_equal_one_by_one(client, translator):
    texts = SENTENCES[:5] + [""] + SENTENCES[5:7]
    r = client.post("/v1/translate", json={"text": texts, "return_scores": True})
    assert r.status_code == 200
    out = r.json()["translations"]
    assert len(out) == len(texts)
    for text, t in zip(texts, out):
        alone = translator.translate([text])[0].hypotheses[0]
        assert t["text"] == alone.text and t["hypotheses"][0]["tokens"] == alone.pieces
        assert t["hypotheses"][0]["score"] == pytest.approx(alone.score, abs=1e-4)
    assert out[5] == {"text": "", "hypotheses": [{"text": "", "score": 0.0, "log_prob": 0.0, "tokens": [],
                                                    "token_probs": [], "mean_log_prob": 0.0, "words": [],
                                                    "word_probs": []}]}
    single = client.post("/v1/translate", json={"text": SENTENCES[0]}).json()["translations"]
    assert [t["text"] for t in single] == [out[0]["text"]] and "tokens" not in single[0]["hypotheses"][0]


def test_scores_nbest_and_attention(client, translator):
    r = client.post("/v1/translate", json={"text": SENTENCES[2], "beam_size": 5, "nbest": 3, "return_scores": True,
                                           "return_attention": True})
    t = r.json()["translations"][0]
    hyps = t["hypotheses"]
    assert len(hyps) == 3 and [h["score"] for h in hyps] == sorted((h["score"] for h in hyps), reverse=True)
    for h in hyps:
        assert sum(map(math.log, h["token_probs"])) == pytest.approx(h["log_prob"], abs=1e-3)
    att = t["attention"]
    assert att["layer"] == 2 and att["tgt_tokens"] == hyps[0]["tokens"]
    assert att["src_tokens"][-1] == "</s>" and len(att["weights"]) == len(att["tgt_tokens"])
    src_ids = translator.encode_sources([SENTENCES[2]])[0]
    expected = translator.source_attention(src_ids, translator.translate([SENTENCES[2]], beam_size=5)[0]
                                           .hypotheses[0].token_ids)[1].mean(dim=0)  # layer 2, head average
    assert len(att["weights"][0]) == len(src_ids) == len(att["src_tokens"])
    for row, want in zip(att["weights"], expected.tolist()):
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
        assert row == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("body, code, detail", [
    ({"text": ["hund"] * 9}, 422, "9 sentences; at most 8"),
    ({"text": "hund " * 13}, 422, "at most 60"),
    ({"text": "hund", "beam_size": 7}, 422, "over the limit 6"),
    ({"text": "hund", "beam_size": 2, "nbest": 3}, 422, "nbest 3 is larger"),
    ({"text": 5}, 422, "string"),
    ({"text": ["hund", 3]}, 422, "string"),
    ({"text": "hund", "beam_size": "5"}, 422, "integer"),
    ({"text": "hund", "beam_size": 0}, 422, "greater than or equal to 1"),
    ({"text": "hund", "colour": "red"}, 422, "Extra inputs"),
    ({}, 422, "Field required"),
    ({"text": "hund " * 700}, 413, "over 3000 bytes"),
])
def test_limits_and_bad_requests_give_the_documented_codes(client, body, code, detail):
    r = client.post("/v1/translate", json=body)
    assert r.status_code == code
    assert detail in str(r.json()["detail"])


def test_malformed_json_and_an_oversized_body_without_length(client):
    r = client.post("/v1/translate", content=b'{"text": "hund"', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    chunks = (b'{"text": "' + b"x" * 1000 for _ in range(5))  # streamed: no Content-Length header
    r = client.post("/v1/translate", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_models_and_metrics(client):
    m = client.get("/v1/models").json()["data"][0]
    assert (m["id"], m["source_language"], m["target_language"]) == ("dictionary", "de", "en")
    assert m["model"]["num_decoder_layers"] == 2 and m["decode"]["beam_size"] == 4
    assert m["limits"]["max_sentences"] == 8
    text = client.get("/metrics").text
    assert re.search(r'^attnmt_requests_total\{code="413"\} [1-9]', text, re.M)
    assert re.search(r'^attnmt_requests_total\{code="200"\} [1-9]', text, re.M)
    assert "attnmt_queue_seconds_bucket" in text and "attnmt_request_seconds_count" in text


def test_health_before_and_after_loading(translator):
    loaded = threading.Event()

    def slow_loader():
        loaded.wait(30)
        return translator

    with TestClient(create_app(slow_loader, ServeSettings(retry_after_s=7))) as c:
        health = c.get("/health")
        assert health.json() == {"status": "loading"} and health.status_code == 503
        assert health.headers["retry-after"] == "7"  # every 503 carries it (AppState)
        r = c.post("/v1/translate", json={"text": "hund"})
        assert r.status_code == 503 and r.headers["retry-after"] == "7"
        assert c.get("/v1/models").status_code == 503
        loaded.set()
        wait_ready(c)
        assert c.get("/health").json() == {"status": "ready"}
        assert c.post("/v1/translate", json={"text": "hund"}).status_code == 200


def test_failed_loading_is_reported(tmp_path):
    with TestClient(create_app(lambda: Translator.from_dir(tmp_path))) as c:
        deadline = time.monotonic() + 30
        while (h := c.get("/health").json())["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert h["status"] == "failed" and "CheckpointError" in h["detail"]
        assert c.post("/v1/translate", json={"text": "hund"}).status_code == 500


def test_queue_full_and_timeout(translator):
    settings = ServeSettings(max_queue=2, retry_after_s=3, request_timeout_s=0.001, max_wait_ms=200)
    with TestClient(create_app(lambda: translator, settings)) as c:
        wait_ready(c)
        r = c.post("/v1/translate", json={"text": SENTENCES[:3]})
        assert r.status_code == 503 and r.headers["retry-after"] == "3" and "queued" in r.json()["detail"]
        r = c.post("/v1/translate", json={"text": SENTENCES[0]})  # waits 200 ms for company; gives up after 1 ms
        assert r.status_code == 504 and "0.001" in r.json()["detail"]
        assert c.post("/v1/translate", json={"text": ""}).status_code == 200  # no search, no wait


def test_attention_layer_setting(translator):
    with TestClient(create_app(lambda: translator, ServeSettings(attention_layer=1))) as c:
        wait_ready(c)
        att = c.post("/v1/translate", json={"text": "hund", "return_attention": True}).json()["translations"][0]
    att = att["attention"]
    src_ids = translator.encode_sources(["hund"])[0]
    out_ids = translator.translate(["hund"])[0].hypotheses[0].token_ids
    assert att["layer"] == 1
    expected = translator.source_attention(src_ids, out_ids)[0].mean(0)  # layer 1, head average: (T, S)
    assert torch.tensor(att["weights"]) == pytest.approx(expected, abs=1e-4)


def test_concurrent_requests_are_batched(translator):
    """Sixteen requests at once: fewer batches than requests in /metrics, and each its own result."""
    app = create_app(lambda: translator, ServeSettings(max_wait_ms=300))
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(16)]

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
                while (await c.get("/health")).status_code != 200:
                    await asyncio.sleep(0.02)
                replies = await asyncio.gather(*(c.post("/v1/translate", json={"text": t}) for t in texts))
                return replies, (await c.get("/metrics")).text

    replies, metrics = asyncio.run(main())
    expected = {t: translator.translate([t])[0].text for t in set(texts)}
    assert [r.json()["translations"][0]["text"] for r in replies] == [expected[t] for t in texts]
    batches = float(re.search(r"^attnmt_batches_total (\S+)", metrics, re.M).group(1))
    sentences = float(re.search(r"^attnmt_batch_sentences_sum (\S+)", metrics, re.M).group(1))
    assert sentences == 16 and 1 <= batches < 16
    assert float(re.search(r"^attnmt_sentences_total (\S+)", metrics, re.M).group(1)) == 16


def test_cli_serve_errors_are_one_line(dictionary_model_dir, tmp_path, monkeypatch, capsys):
    for args, message in ((["--model", str(tmp_path)], "config.yaml"),
                          (["--model", str(dictionary_model_dir), "--set", "max_wait_ms=-1"], "max_wait_ms"),
                          (["--model", str(dictionary_model_dir), "--set", "max_wait"], "NAME=VALUE")):
        assert cli.main(["serve", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("attnmt: error:") and message in err
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the serve extra were not installed
    assert cli.main(["serve", "--model", str(dictionary_model_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'attnmt[serve]'" in err



def test_cli_serve_passes_settings_to_uvicorn(dictionary_model_dir, monkeypatch):
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append((app, kwargs)))
    assert cli.main(["serve", "--model", str(dictionary_model_dir), "--port", "8123", "--set", "keep_alive_s=12",
                     "--set", "max_sentences=3"]) == 0
    app, kwargs = calls[0]
    assert (kwargs["host"], kwargs["port"], kwargs["timeout_keep_alive"]) == ("127.0.0.1", 8123, 12.0)
    assert app.state.attnmt.settings.max_sentences == 3
