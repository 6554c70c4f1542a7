"""``attnmt serve`` of a multilingual model: ``tgt_lang`` in ``/v1/translate`` and the stream,
its languages in ``/v1/models``, the LibreTranslate face (``/languages`` with every direction,
the libretranslatepy client), the page's language picker, and a bilingual model as before."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error

import httpx
import pytest
from fastapi.testclient import TestClient

from attnmt.decode.alignment import format_alignment
from attnmt.decode.translator import Translator
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import ENGLISH_FRENCH, GERMAN_ENGLISH, skip_without, toy_sentence, wait_ready
from tests.test_serve_page import CHROMIUM, _start
from tests.test_serve_stream import _stream

GERMAN = ["ein mann sieht ein auto", "kind spielt ball und katze", "frau fährt rot auto"]
LANGUAGES = "de, en, fr"
WORDS = {"de": set(GERMAN_ENGLISH), "en": set(ENGLISH_FRENCH), "fr": set(ENGLISH_FRENCH.values())}


def _in(lang: str, text: str) -> bool:
    """Whether ``text`` is made of the toy task's words of ``lang`` (the toy model is too small to
    get every sentence right, but it answers in the language asked for)."""
    return bool(text) and set(text.split()) <= WORDS[lang]


@pytest.fixture(scope="module")
def translator(multilingual_model_dir):
    return Translator.from_dir(multilingual_model_dir)


@pytest.fixture(scope="module")
def url(multilingual_model_dir):
    """``attnmt serve --model`` the multilingual model, in a process of its own: its base URL."""
    proc, base = _start(multilingual_model_dir)
    yield base
    proc.terminate()
    proc.wait(30)


def _batches(url: str) -> float:
    return float(re.search(r"^attnmt_batches_total (\S+)", httpx.get(url + "/metrics").text, re.M).group(1))


def test_v1_translate_into_the_requested_language(url, translator):
    r = httpx.post(url + "/v1/translate", json={"text": GERMAN[0], "tgt_lang": "en"}, timeout=60)
    assert r.status_code == 200 and r.json()["translations"][0]["text"] == "a man sees a car"
    for src_lang, tgt_lang in (("de", "en"), ("en", "fr"), ("fr", "en"), ("en", "de"), ("de", "fr")):
        sources = [toy_sentence(g, src_lang) for g in GERMAN]
        r = httpx.post(url + "/v1/translate", json={"text": sources, "tgt_lang": tgt_lang}, timeout=60)
        texts = [t["text"] for t in r.json()["translations"]]
        assert texts == [t.text for t in translator.translate(sources, tgt_lang=tgt_lang)]
        if (src_lang, tgt_lang) != ("de", "fr"):  # zero-shot: the toy model answers in English
            assert all(_in(tgt_lang, t) for t in texts), (src_lang, tgt_lang, texts)


def test_attention_and_alignments_with_the_tag(url, translator):
    body = {"text": GERMAN[0], "tgt_lang": "fr", "return_attention": True, "alignments": True}
    t = httpx.post(url + "/v1/translate", json=body, timeout=60).json()["translations"][0]
    assert t["attention"]["src_tokens"][0] == "<2fr>"  # the tag is a source token the model attends to
    expected = translator.translate([GERMAN[0]], tgt_lang="fr", alignments=True)[0]
    assert t["alignment"] == format_alignment(expected.alignment)  # alignments count the words only
    assert max(int(pair.split("-")[0]) for pair in t["alignment"].split()) < len(GERMAN[0].split())


def test_a_missing_or_unknown_tgt_lang_is_a_422_naming_the_languages_before_any_work(url):
    before = _batches(url)
    for route in ("/v1/translate", "/v1/translate/stream"):
        for extra, message in (({}, "choose one"), ({"tgt_lang": "cs"}, "unknown target language 'cs'")):
            r = httpx.post(url + route, json={"text": GERMAN[0], **extra}, timeout=60)
            assert r.status_code == 422 and message in r.json()["detail"] and LANGUAGES in r.json()["detail"]
    r = httpx.post(url + "/v1/translate", json={"text": GERMAN[0], "tgt_lang": 3}, timeout=60)
    assert r.status_code == 422  # not a string
    assert _batches(url) == before


def test_stream_with_tgt_lang(url, translator):
    for tgt_lang in ("en", "fr"):
        events = _stream(url, {"text": GERMAN[0], "tgt_lang": tgt_lang, "beam_size": 1})
        words = [data["word"] for event, data, _ in events if event == "word"]
        [done] = [data for event, data, _ in events if event == "done"]
        assert done["text"] == " ".join(words) == translator.translate([GERMAN[0]], beam_size=1,
                                                                       tgt_lang=tgt_lang)[0].text


def test_models_lists_the_languages(url):
    info = httpx.get(url + "/v1/models").json()["data"][0]
    assert info["multilingual"] is True
    assert (info["source_languages"], info["target_languages"]) == (["de", "en", "fr"], ["de", "en", "fr"])
    assert (info["source_language"], info["target_language"]) == (None, None)


def test_libretranslate_languages_lists_every_direction(url):
    assert httpx.get(url + "/languages").json() == [
        {"code": "de", "name": "German", "targets": ["en", "fr"]},
        {"code": "en", "name": "English", "targets": ["de", "fr"]},
        {"code": "fr", "name": "French", "targets": ["de", "en"]}]


def test_libretranslatepy_translates_de_en_and_en_fr(url):
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(url + "/")
    assert [(lang["code"], lang["targets"]) for lang in api.languages()] == [
        ("de", ["en", "fr"]), ("en", ["de", "fr"]), ("fr", ["de", "en"])]
    for source, target, text in (("de", "en", GERMAN[0]), ("en", "fr", toy_sentence(GERMAN[0], "en"))):
        ours = httpx.post(url + "/v1/translate", json={"text": text, "tgt_lang": target}).json()
        assert api.translate(text, source, target) == ours["translations"][0]["text"]
        assert _in(target, ours["translations"][0]["text"])
    assert api.translate(GERMAN[0], "de", "en") == "a man sees a car"
    for source, target, message in (
            ("auto", "en", "auto detection is not supported by a multilingual model; give source (one of de, en, fr)"),
            ("de", "cs", "cs is not supported"),
            ("en", "en", "English (en) is not available as a target language from English (en)")):
        with pytest.raises(urllib.error.HTTPError) as e:
            api.translate(GERMAN[0], source, target)
        assert e.value.code == 400 and json.loads(e.value.read()) == {"error": message}


def test_languages_share_a_batch(translator):
    """Requests into three languages at once: fewer batches than requests, each its own result."""
    app = create_app(lambda: translator, ServeSettings(max_wait_ms=300))
    asks = [(g, lang) for g in GERMAN for lang in ("de", "en", "fr")]

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as c:
                while (await c.get("/health")).status_code != 200:
                    await asyncio.sleep(0.02)
                replies = await asyncio.gather(*(c.post("/v1/translate", json={"text": g, "tgt_lang": lang})
                                                 for g, lang in asks))
                return replies, (await c.get("/metrics")).text

    replies, metrics = asyncio.run(main())
    assert [r.json()["translations"][0]["text"] for r in replies] == [
        translator.translate([g], tgt_lang=lang)[0].text for g, lang in asks]
    assert 1 <= float(re.search(r"^attnmt_batches_total (\S+)", metrics, re.M).group(1)) < len(asks)


def test_the_page_offers_the_target_languages(url):
    skip_without("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_selector("#tgt-lang-label", state="visible")
        assert page.locator("#tgt-lang option").all_inner_texts() == ["de", "en", "fr"]
        english = toy_sentence(GERMAN[0], "en")
        page.fill("#source", english)
        page.select_option("#tgt-lang", "fr")
        page.click("#translate")
        page.wait_for_selector("#translation .tok")
        shown = page.get_attribute("#translation", "data-text")
        browser.close()
    ours = httpx.post(url + "/v1/translate", json={"text": english, "tgt_lang": "fr"}).json()["translations"][0]
    assert shown == ours["text"] and _in("fr", shown)


def test_a_bilingual_model_takes_its_own_target_or_none(dictionary_model_dir):
    with TestClient(create_app(lambda: Translator.from_dir(dictionary_model_dir), languages=("de", "en"))) as c:
        wait_ready(c)
        info = c.get("/v1/models").json()["data"][0]
        assert (info["multilingual"], info["source_languages"], info["target_languages"]) == (False, ["de"], ["en"])
        plain = c.post("/v1/translate", json={"text": "frau sieht hund"}).json()
        assert c.post("/v1/translate", json={"text": "frau sieht hund", "tgt_lang": "en"}).json() == plain
        r = c.post("/v1/translate", json={"text": "frau sieht hund", "tgt_lang": "fr"})
        assert (r.status_code, r.json()) == (422, {"detail": "this model translates into en only, not 'fr'"})
        assert c.get("/languages").json() == [{"code": "de", "name": "German", "targets": ["en"]},
                                              {"code": "en", "name": "English", "targets": []}]
