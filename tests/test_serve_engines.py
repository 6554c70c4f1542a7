"""``attnmt serve`` over every engine, ``/v1/models`` for every kind of model directory, and the
LibreTranslate face checked with the clients people use (libretranslatepy, deep-translator)
against a live server."""

from __future__ import annotations

import shutil
import urllib.error

import pytest
from fastapi.testclient import TestClient

from attnmt.config import Config
from attnmt.decode.translator import Translator
from attnmt.rundir import CONFIG, WEIGHTS, read_config, save_weights, write_config
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import live_server, wait_ready
from tests.test_serve_api import SENTENCES

pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def dirs(dictionary_model_dir, tmp_path_factory):
    """Model directories: trained, imported (no data section, the pair in the weights'
    metadata, as 'attnmt import marian' writes it), and the two exports."""
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.onnx import export_onnx

    tmp = tmp_path_factory.mktemp("serve_engines")
    imported = tmp / "imported"
    shutil.copytree(dictionary_model_dir, imported, ignore=shutil.ignore_patterns("checkpoints", "data", "*.jsonl"))
    config = read_config(imported)
    (imported / CONFIG).unlink()
    write_config(Config(model=config.model, decode=config.decode), imported)
    tr = Translator.from_dir(imported)
    save_weights(tr.model, imported / WEIGHTS, metadata={"imported_from": "Helsinki-NLP/opus-mt-de-en"})
    return {"trained": dictionary_model_dir, "imported": imported,
            "ctranslate2": export_ctranslate2(dictionary_model_dir, tmp / "ct2"),
            "onnxruntime": export_onnx(dictionary_model_dir, tmp / "onnx")}


def _translator(dirs, engine):
    from attnmt.interop.engines import open_translator

    return open_translator(dirs[engine], engine if engine in ("ctranslate2", "onnxruntime") else "native")


def _languages(dirs, kind):
    from attnmt.rundir import model_languages

    return model_languages(dirs[kind])


def test_every_engine_serves_the_same_translations(dirs):
    texts = SENTENCES + [""]
    replies = {}
    for engine in ("trained", "ctranslate2", "onnxruntime"):
        app = create_app(lambda engine=engine: _translator(dirs, engine), ServeSettings(), name=engine,
                         languages=_languages(dirs, engine))
        with TestClient(app) as c:
            wait_ready(c)
            r = c.post("/v1/translate", json={"text": texts, "beam_size": 4, "nbest": 2, "return_scores": True,
                                                 "early_stopping": True})
            assert r.status_code == 200
            replies[engine] = r.json()["translations"]
            m = c.get("/v1/models")
            assert m.status_code == 200
            info = m.json()["data"][0]
            assert (info["source_language"], info["target_language"]) == ("de", "en")
            assert info["engine"]["name"] == {"trained": "native"}.get(engine, engine)
            att = c.post("/v1/translate", json={"text": "hund", "return_attention": True, "early_stopping": True})
            if engine in ("trained", "ctranslate2"):  # CTranslate2: the one layer its export returns
                assert att.status_code == 200 and att.json()["translations"][0]["attention"]["weights"]
            else:
                assert att.status_code == 422
                assert att.json()["detail"] == f"the {engine} engine does not support return_attention"
    for engine in ("ctranslate2", "onnxruntime"):
        for a, b in zip(replies["trained"], replies[engine]):
            # Under early stopping CTranslate2 returns round(K x patience) finished hypotheses where the
            # native search may finish a few more in its last step, so only the best is compared.
            assert len(a["hypotheses"]) == len(b["hypotheses"])
            for ha, hb in zip(a["hypotheses"][:1], b["hypotheses"][:1]):
                assert ha["text"] == hb["text"]
                assert hb["tokens"] == ha["tokens"]
                assert hb["token_probs"] == pytest.approx(ha["token_probs"], abs=1e-3)


def test_models_route_describes_an_imported_model(dirs):
    app = create_app(lambda: _translator(dirs, "imported"), ServeSettings(), name="imported",
                     languages=_languages(dirs, "imported"))
    with TestClient(app) as c:
        wait_ready(c)
        r = c.get("/v1/models")
        assert r.status_code == 200
        info = r.json()["data"][0]
        assert (info["source_language"], info["target_language"]) == ("de", "en")
        assert info["engine"]["name"] == "native" and info["model"]["num_decoder_layers"] == 2
        assert c.get("/languages").json() == [{"code": "de", "name": "German", "targets": ["en"]},
                                              {"code": "en", "name": "English", "targets": []}]


@pytest.fixture(scope="module")
def live(dirs):
    """A live server (uvicorn on a free port, in a thread) with the native engine: its URL."""
    app = create_app(lambda: _translator(dirs, "trained"), ServeSettings(max_sentences=16), name="trained",
                     languages=("de", "en"))
    with live_server(app) as url:
        yield url + "/"


def test_libretranslatepy_gets_what_v1_translate_gives(live):
    import httpx
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(live)
    for text in SENTENCES[:4]:
        ours = httpx.post(live + "v1/translate", json={"text": text}).json()["translations"][0]["text"]
        assert api.translate(text, "de", "en") == ours
    assert {"code": "de", "name": "German", "targets": ["en"]} in api.languages()
    with pytest.raises(urllib.error.HTTPError) as e:
        api.translate(SENTENCES[0], "en", "de")
    assert e.value.code == 400
    assert e.value.read().decode() == '{"error":"German (de) is not available as a target language from English (en)"}'


def test_deep_translator_libre_backend(live):
    import httpx

    libre = pytest.importorskip("deep_translator").LibreTranslator
    tr = libre(source="de", target="en", api_key="unused", custom_url=live)
    ours = httpx.post(live + "v1/translate", json={"text": SENTENCES[1]}).json()["translations"][0]["text"]
    assert tr.translate(SENTENCES[1]) == ours


def test_libretranslate_request_shapes_and_errors(live):
    import httpx

    v1 = httpx.post(live + "v1/translate", json={"text": SENTENCES[:3]}).json()["translations"]
    r = httpx.post(live + "translate", json={"q": SENTENCES[:3], "source": "de", "target": "en"})
    assert r.json() == {"translatedText": [t["text"] for t in v1]}
    r = httpx.post(live + "translate", data={"q": SENTENCES[0] + "\n\n" + SENTENCES[1], "source": "auto",
                                             "target": "en", "format": "text"})
    assert r.json() == {"translatedText": f"{v1[0]['text']}\n\n{v1[1]['text']}",
                        "detectedLanguage": {"confidence": 100.0, "language": "de"}}
    files = httpx.post(live + "translate", files={"q": (None, SENTENCES[2]), "source": (None, "de"),
                                                  "target": (None, "en")})
    assert files.json() == {"translatedText": v1[2]["text"]}
    for body, message in (({"source": "de", "target": "en"}, "Invalid request: missing q parameter"),
                          ({"q": "hund", "target": "en"}, "Invalid request: missing source parameter"),
                          ({"q": "hund", "source": "fr", "target": "en"}, "fr is not supported"),
                          ({"q": "hund", "source": "de", "target": "en", "format": "xml"},
                           "xml format is not supported"),
                          ({"q": ["hund"] * 17, "source": "de", "target": "en"},
                           "Invalid request: request (17) exceeds text limit (16)")):
        r = httpx.post(live + "translate", json=body)
        assert (r.status_code, r.json()) == (400, {"error": message})
