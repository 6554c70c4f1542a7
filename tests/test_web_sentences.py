"""The exported page translates a pasted text sentence by sentence: cut by the browser's
Intl.Segmenter (src/attnmt/web/src/sentences.js, whose own cases run under ``node --test``), each
sentence translated as the native model translates it alone, the line breaks between them kept;
in headless Chromium, as tests/test_web_export.py runs the page (and skips without it)."""

from __future__ import annotations

from attnmt.decode.translator import Translator
from tests.test_web_export import _one_torch_thread, _open, browser, site  # noqa: F401  (fixtures)

PARAGRAPH = "ein mann sieht katze! kind spielt ball."
SENTENCES = ["ein mann sieht katze!", "kind spielt ball."]


def test_page_translates_a_paragraph_sentence_by_sentence(browser, site, dictionary_model_dir):  # noqa: F811
    text = PARAGRAPH + "\n\nfrau fährt auto."
    expected = [t.text for t in Translator.from_dir(dictionary_model_dir).translate(SENTENCES + ["frau fährt auto."])]
    assert all(expected)
    page, server = _open(browser, site, False)
    try:
        assert page.evaluate("(x) => window.attnmt.sentences(x)", PARAGRAPH) == SENTENCES
        assert page.evaluate("(x) => window.attnmt.translateText(x)", PARAGRAPH) == f"{expected[0]} {expected[1]}"
        page.fill("#source", text)
        page.click("#translate")
        page.wait_for_function("document.getElementById('translation').dataset.text !== undefined")
        shown = page.locator("#translation .sentence")
        assert [shown.nth(i).get_attribute("data-text") for i in range(shown.count())] == expected
        assert page.get_attribute("#translation", "data-text") == f"{expected[0]} {expected[1]}\n\n{expected[2]}"
        assert page.locator("#translation br").count() == 2  # the blank line between the paragraphs
        assert page.inner_text("#status").startswith("3 sentences translated in")
        # the heatmap is the chosen sentence's: one row per output piece of that sentence
        for i in (0, 1):
            shown.nth(i).click()
            assert page.locator("#heatmap tbody tr").count() == shown.nth(i).locator(".tok").count()
            assert page.locator("#translation .sentence.chosen").get_attribute("data-index") == str(i)
    finally:
        page.close()
        server.close()
