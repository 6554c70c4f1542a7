"""A trained multilingual model served and in the browser.

Three checks on a real model directory, each printed as one JSON line, then a summary:

- ``attnmt serve --model MODEL``: LibreTranslate's ``/languages`` lists every source language
  the model was trained on with every target language it knows (the directions it never saw
  are zero-shot), and includes every trained direction;
- the ``libretranslatepy`` client translates the first ``--sentences`` lines of
  test_2016_flickr de->en and en->fr through that server, and each answer equals the model's
  own translation (``Translator.translate(..., tgt_lang=...)``, the model's decode settings);
- ``attnmt export web --model MODEL``: the page offers the target languages in its picker,
  and for each one chosen in the page (the form, as a user clicks it) the first test sentence
  (from English, or from German into English) comes out as the native translation. A
  screenshot of the page after its last translation is kept in WORK/page.png.

A slow test: ``python -m pytest -m slow tests/test_slow_multilingual_serving.py`` (the README's
``python -m pytest -q`` leaves it out). Its size flags go in ``ATTNMT_SLOW_MULTILINGUAL_SERVING``, e.g.
``ATTNMT_SLOW_MULTILINGUAL_SERVING='--model runs/multilingual --sentences 20'``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from attnmt.decode.translator import Translator  # noqa: E402
from attnmt.languages import corpus_directions, served_languages  # noqa: E402
from harness import machine, read_lines  # noqa: E402
from suite_serve import start_server  # noqa: E402
from suite_web import CHROMIUM_FLAGS, serve_static  # noqa: E402


def check_server(model: Path, tr: Translator, data: Path, sentences: int) -> list[dict]:
    from libretranslatepy import LibreTranslateAPI

    sources, targets = served_languages(tr.config)
    trained = {d for d in corpus_directions(tr.config) if None not in d}
    proc, url = start_server(str(model), 1, [])
    try:
        listed = httpx.get(url + "/languages", timeout=30).json()
        pairs = {(entry["code"], t) for entry in listed for t in entry["targets"]}
        expected = {(s, t) for s in sources for t in targets if s != t}
        results = [{"check": "/languages", "listed": listed, "ok": pairs == expected and trained <= pairs,
                    "directions": len(pairs), "trained_directions": len(trained)}]
        api = LibreTranslateAPI(url + "/")
        for src, tgt in (("de", "en"), ("en", "fr")):
            texts = read_lines(data / "multi30k" / f"test_2016_flickr.{src}.gz", sentences)
            served = [api.translate(text, src, tgt) for text in texts]
            native = [t.text for t in tr.translate(texts, tgt_lang=tgt)]
            same = sum(a == b for a, b in zip(served, native))
            results.append({"check": f"libretranslatepy {src}->{tgt}", "sentences": len(texts), "same_as_native": same,
                            "ok": same == len(texts), "example": [texts[0], served[0]]})
    finally:
        proc.terminate()
        proc.wait(30)
    return results


def check_page(model: Path, tr: Translator, data: Path, work: Path, chromium: str) -> list[dict]:
    from playwright.sync_api import sync_playwright

    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "attnmt", "-q", "export", "web", "--model", str(model), "--output",
                    str(site)], check=True)
    server, url = serve_static(site, False)
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.set_default_timeout(0)
            page.goto(url)
            page.evaluate("window.attnmt.ready")
            offered = page.locator("#tgt-lang option").evaluate_all("(os) => os.map((o) => o.value)")
            results.append({"check": "page picker", "offered": offered, "visible": page.is_visible("#tgt-lang"),
                            "ok": offered == list(tr.config.tokenizer.target_languages)})
            for tgt in offered:
                src = "de" if tgt == "en" else "en"
                text = read_lines(data / "multi30k" / f"test_2016_flickr.{src}.gz", 1)[0]
                page.select_option("#tgt-lang", tgt)
                page.fill("#source", text)
                page.evaluate("delete document.getElementById('translation').dataset.text")
                page.click("#translate")
                page.wait_for_function("document.getElementById('translation').dataset.text !== undefined")
                shown = page.get_attribute("#translation", "data-text")
                native = tr.translate([text], tgt_lang=tgt)[0].text
                results.append({"check": f"page {src}->{tgt}", "source": text, "page": shown, "native": native,
                                "ok": shown == native != ""})
            page.screenshot(path=str(work / "page.png"))
            browser.close()
    finally:
        server.shutdown()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/multilingual", type=Path, help="the multilingual model directory")
    ap.add_argument("--sentences", type=int, default=20, help="test lines sent through libretranslatepy per direction")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work" / "multilingual")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--data", type=Path, default=os.environ.get("ATTNMT_DATA"))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    tr = Translator.from_dir(args.model)
    results = check_server(args.model, tr, args.data, args.sentences)
    results += check_page(args.model, tr, args.data, args.work, args.chromium)
    for r in results:
        print(json.dumps(r, ensure_ascii=False), flush=True)
    failed = [r["check"] for r in results if not r["ok"]]
    print(json.dumps({"machine": machine(), "model": str(args.model), "failed": failed}))
    return 1 if failed else 0


@pytest.mark.slow
def test_multilingual_serving():
    argv = shlex.split(os.environ.get("ATTNMT_SLOW_MULTILINGUAL_SERVING", ""))
    if not os.environ.get("ATTNMT_DATA") or "--model" not in argv and not Path("runs/multilingual").exists():
        pytest.skip("needs ATTNMT_DATA and a trained multilingual model (--model)")
    assert main(argv) == 0
