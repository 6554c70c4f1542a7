"""The served page in a real headless browser (Debian's chromium driven by playwright), and the
server process: `attnmt serve` on 127.0.0.1, then SIGTERM with requests in flight."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from attnmt.decode.translator import Translator
from tests.conftest import skip_without

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SENTENCE = "ein mann sieht katze und hund"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model_dir, *extra):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnmt", "serve", "--model", str(model_dir), "--port", str(port),
                             "--threads", "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.1)


def translate_on_page(playwright, url: str, text: str, beam_size: int, nbest: int):
    """Headless Chromium on the server's page at ``url``: ``text`` translated with ``beam_size``
    and ``nbest`` through the form, waited for until its tokens show; (browser, page)."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(url + "/")
    page.fill("#source", text)
    page.fill("#beam-size", str(beam_size))
    page.fill("#nbest", str(nbest))
    page.click("#translate")
    page.wait_for_selector("#translation .tok")
    return browser, page


@pytest.fixture(scope="module")
def server(dictionary_model_dir):
    proc, url = _start(dictionary_model_dir)
    yield url
    proc.terminate()
    proc.wait(30)


def test_page_shows_translation_confidence_and_attention(server, tmp_path):
    skip_without("chromium")
    from playwright.sync_api import sync_playwright

    api = httpx.post(server + "/v1/translate", json={"text": SENTENCE, "beam_size": 3, "nbest": 2,
                                                     "return_scores": True, "return_attention": True}).json()
    expected = api["translations"][0]
    with sync_playwright() as p:
        browser, page = translate_on_page(p, server, SENTENCE, beam_size=3, nbest=2)
        shown = page.get_attribute("#translation", "data-text")
        tokens = page.locator("#translation .tok")
        assert shown == expected["text"] != ""
        assert tokens.count() == len(expected["attention"]["tgt_tokens"])
        assert page.locator("#nbest-list li").count() == 2
        assert page.locator("#heatmap tbody tr").count() == tokens.count()
        for i in (1, 3):  # hover an output word: the outlined source word is the most attended one
            tokens.nth(i).hover()
            top = page.locator("#source-tokens .tok.top")
            assert top.count() == 1
            row = expected["attention"]["weights"][i]
            assert int(top.get_attribute("data-index")) == row.index(max(row))
            assert top.inner_text() == expected["attention"]["src_tokens"][row.index(max(row))].lstrip("\u2581")
        page.screenshot(path=str(tmp_path / "serve_page.png"), full_page=True)
        browser.close()
    assert (tmp_path / "serve_page.png").stat().st_size > 10_000


def test_page_translates_a_paragraph_sentence_by_sentence(server):
    """Two paragraphs of three sentences: three translations, each the API's for that sentence
    alone, with the blank line between the paragraphs; hovering a word of the second sentence shows
    that sentence's n-best list and attention."""
    skip_without("chromium")
    from playwright.sync_api import sync_playwright

    sentences = ["ein mann sieht katze!", "kind spielt ball.", "frau fährt auto."]
    api = httpx.post(server + "/v1/translate", json={"text": sentences, "beam_size": 3, "nbest": 2,
                                                     "return_attention": True}).json()
    expected = [t["text"] for t in api["translations"]]
    assert all(expected)
    with sync_playwright() as p:
        browser, page = translate_on_page(p, server, f"{sentences[0]} {sentences[1]}\n\n{sentences[2]}", 3, 2)
        page.wait_for_function("document.getElementById('translation').dataset.text !== ''")
        shown = page.locator("#translation .sentence")
        assert [shown.nth(i).get_attribute("data-text") for i in range(shown.count())] == expected
        assert page.get_attribute("#translation", "data-text") == f"{expected[0]} {expected[1]}\n\n{expected[2]}"
        assert page.locator("#translation br").count() == 2
        assert "3 sentences translated" in page.inner_text("#status")
        second = shown.nth(1).locator(".tok")
        second.nth(0).hover()
        assert page.locator("#translation .sentence.chosen").get_attribute("data-index") == "1"
        assert page.locator("#nbest-list li").first.inner_text().startswith(expected[1])
        assert page.locator("#heatmap tbody tr").count() == second.count() == len(
            api["translations"][1]["attention"]["tgt_tokens"])
        browser.close()


def test_sigterm_finishes_the_requests_in_flight(dictionary_model_dir):
    # Sentences wait up to 1.5 s for company, so SIGTERM arrives while they are queued.
    proc, url = _start(dictionary_model_dir, "--set", "max_wait_ms=1500")
    texts = ["hund", "katze sieht ball", "frau fährt auto", "kind spielt"]
    with ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(httpx.post, url + "/v1/translate", json={"text": t}, timeout=60) for t in texts]
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        replies = [f.result() for f in futures]
    assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    assert [r.status_code for r in replies] == [200] * len(texts)
    translator = Translator.from_dir(dictionary_model_dir)
    assert [r.json()["translations"][0]["text"] for r in replies] == [t.text for t in translator.translate(texts)]
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
