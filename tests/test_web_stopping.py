"""The web page's beam search under early stopping (``decode.early_stopping`` / ``patience`` in
the export's config.json): its token ids equal the native search's, with a patience and where the
length limit cuts hypotheses without EOS. The comparison is tests/test_web_export.py's."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from attnmt.cli import main
from attnmt.decode.translator import Translator
from tests.test_web_export import (  # noqa: F401  (browser: the Chromium fixture)
    AGREEMENT, _agreement, _open, _page_batch_tokens, _page_tokens, _require_page, _sentences, browser)

pytest.importorskip("onnxruntime")

# (label, decode keys): patience 1.5; and an output limit of 0.5 x source length + 1, which most
# hypotheses reach (then cut without EOS).
SETTINGS = [("patience 1.5", {"early_stopping": True, "patience": 1.5}),
            ("limit binds", {"early_stopping": True, "max_len_a": 0.5, "max_len_b": 1})]


@pytest.mark.parametrize("label, decode", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_page_equals_native_under_early_stopping(browser, dictionary_model_dir, tmp_path, label, decode):
    _require_page()
    model = tmp_path / "model"
    shutil.copytree(dictionary_model_dir, model)
    config = yaml.safe_load((model / "config.yaml").read_text(encoding="utf-8"))
    config["decode"].update(decode)
    (model / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    site = tmp_path / "site"
    assert main(["-q", "export", "web", "--model", str(model), "--output", str(site)]) == 0
    written = json.loads((site / "model" / "config.json").read_text())["decode"]
    assert written["early_stopping"] is True and written["patience"] == decode.get("patience", 1.0)
    native = Translator.from_dir(model, device="cpu")
    sentences = _sentences(20, seed=5)
    expected = native.translate(sentences, beam_size=4)
    if label == "limit binds":  # cut at the limit, without EOS, in most sentences
        assert sum(t.hypotheses[0].token_ids[-1] != 3 for t in expected) >= 10
    page, server = _open(browser, site, False)
    try:
        assert _agreement(_page_tokens(page, sentences, 4), expected) >= AGREEMENT, label
        assert _agreement(_page_batch_tokens(page, sentences, 4, 7), expected) >= AGREEMENT, label
    finally:
        page.close()
        server.close()
