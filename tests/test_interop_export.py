"""CTranslate2 and ONNX Runtime exports of a model trained here (the copy task of
test_end_to_end, a short run): they must translate as attnmt's own beam search does."""

from __future__ import annotations

import random
import sys

import pytest

from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.decode.translator import Translator
from attnmt.errors import AttnmtError
from attnmt.evaluate import corpus_scores
from attnmt.interop.extras import require
from attnmt.train.loop import train
from tests.test_end_to_end import _config, _sentences

pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

BEAM, ALPHA = 4, 1.0  # alpha 1 with k = 0: average log-probability, the same in all three engines


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model directory, native Translator with k = 0, 60 test sentences, native outputs)."""
    tmp = tmp_path_factory.mktemp("export")
    raw = _config(tmp, max_steps=200)
    raw["train"].update(valid_every=200, log_every=100)
    run_dir = tmp / "run"
    train(config_from_dict(raw), run_dir, progress=False)
    sentences = _sentences(random.Random(7), 60)
    native = Translator.from_dir(run_dir)
    native.config.decode.length_penalty_k = 0.0
    hyps = native.translate(sentences, beam_size=BEAM, length_penalty=ALPHA)
    return run_dir, native, sentences, hyps


def _agreement(a, b) -> float:
    return sum(x.text == y.text for x, y in zip(a, b)) / len(a)


def test_ctranslate2_float32_equals_native_beam_search(trained, tmp_path):
    """>= 95% identical translations; where identical, the CTranslate2 engine's score equals
    attnmt's log P / |Y| (alpha 1, k 0; |Y| counting EOS)."""
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator

    run_dir, _, sentences, native = trained
    ct2 = open_translator(export_ctranslate2(run_dir, tmp_path / "ct2"), "ctranslate2", "cpu")
    ct2.config.decode.length_penalty_k = 0.0  # as the native translator's (the engine honours k)
    ct2.config.decode.early_stopping = True  # CTranslate2's stopping rule, the only one the engine has
    ours = ct2.translate(sentences, beam_size=BEAM, length_penalty=ALPHA, batch_size=16)
    assert _agreement(native, ours) >= 0.95
    same = [(a, b) for a, b in zip(native, ours) if a.text == b.text]
    for a, b in same:
        assert a.hypotheses[0].token_ids == b.hypotheses[0].token_ids
        assert b.hypotheses[0].score == pytest.approx(a.hypotheses[0].score, abs=2e-3)
    # n-best as the native engine gives it, empty lines included (nbest empty hypotheses)
    both = [engine.translate(["", sentences[0], " "], beam_size=BEAM, nbest=3, length_penalty=ALPHA)
            for engine in (trained[1], ct2)]
    for translations in both:
        assert [len(t.hypotheses) for t in translations] == [3, 3, 3]
        assert [h.text for h in translations[0].hypotheses + translations[2].hypotheses] == [""] * 6
    assert both[1][1].hypotheses[0].token_ids == both[0][1].hypotheses[0].token_ids


def test_ctranslate2_int8_within_half_a_bleu(trained, tmp_path):
    """int8 weights: BLEU against the references within 0.5 of the native float32 output."""
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator

    run_dir, _, sentences, native = trained
    ct2 = open_translator(export_ctranslate2(run_dir, tmp_path / "ct2", quantization="int8"), "ctranslate2", "cpu")
    ct2.config.decode.length_penalty_k = 0.0
    ct2.config.decode.early_stopping = True
    ours = ct2.translate(sentences, beam_size=BEAM, length_penalty=ALPHA)
    refs = sentences  # the copy task
    native_bleu = corpus_scores([t.text for t in native], refs)["bleu"]
    int8_bleu = corpus_scores([t.text for t in ours], refs)["bleu"]
    assert native_bleu > 50 and abs(int8_bleu - native_bleu) <= 0.5


def test_int8_rows_quantizer():
    """7 bits: |q| <= 63 and each row's largest weight at 63; within half a step of the weight;
    a zero row stays zero (without a numpy warning); 8 bits reach 127; other widths are refused."""
    import warnings

    import numpy as np

    from attnmt.interop.ctranslate2 import quantize_int8_rows

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 40)).astype(np.float32) * np.array([[1], [3], [0.01], [0], [5], [1]], np.float32)
    for bits, qmax in ((7, 63), (8, 127)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the zero row must not overflow a division
            q, scale = quantize_int8_rows(w, bits)
        assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (6,)
        assert np.abs(q).max() == qmax
        assert [int(np.abs(row).max()) for row in q] == [qmax, qmax, qmax, 0, qmax, qmax]
        assert np.all(np.abs(q / scale[:, None] - w) <= 0.5 / scale[:, None] + 1e-7)
        assert scale[3] == 1.0
    with pytest.raises(ValueError, match="7 or 8 bits"):
        quantize_int8_rows(w, 4)


def test_ctranslate2_7bit_weights_dequantize_to_the_model(trained, tmp_path):
    """The 7-bit int8 export in CTranslate2's layout: loaded at compute type float32 (CTranslate2
    multiplies back by 1 / scale) it translates as the native model does on >= 95% of
    sentences; the 8-bit export (CTranslate2's quantizer) is a different file."""
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator

    run_dir, _, sentences, native = trained
    seven = export_ctranslate2(run_dir, tmp_path / "ct2-7", quantization="int8")
    ct2 = open_translator(seven, "ctranslate2", "cpu", compute_type="float32")
    ct2.config.decode.length_penalty_k = 0.0
    ct2.config.decode.early_stopping = True
    ours = ct2.translate(sentences, beam_size=BEAM, length_penalty=ALPHA)
    assert _agreement(native, ours) >= 0.95
    eight = export_ctranslate2(run_dir, tmp_path / "ct2-8", quantization="int8", int8_weight_bits=8)
    assert (seven / "model.bin").read_bytes() != (eight / "model.bin").read_bytes()
    with pytest.raises(ValueError, match="7 or 8 bits"):
        export_ctranslate2(run_dir, tmp_path / "ct2-6", quantization="int8", int8_weight_bits=6)
    # bits that would change nothing are refused, not ignored
    for quantization, bits, message in ((None, 8, "not float32"), ("float16", 7, "not float16"),
                                        ("int8_float16", 7, "int8_float16 takes CTranslate2's own 8-bit")):
        with pytest.raises(ValueError, match=message):
            export_ctranslate2(run_dir, tmp_path / "ct2-x", quantization=quantization, int8_weight_bits=bits)
        assert not (tmp_path / "ct2-x").exists()


def test_onnxruntime_equals_native_search(trained, tmp_path):
    """attnmt's beam search over the ONNX graphs: >= 95% identical translations, scores equal
    within 1e-3; greedy search (beam 1) too, in batches of another size (dynamic axes)."""
    from attnmt.interop.engines import open_translator
    from attnmt.interop.onnx import export_onnx

    run_dir, native_tr, sentences, native = trained
    onnx_tr = open_translator(export_onnx(run_dir, tmp_path / "onnx"), "onnxruntime", "cpu")
    onnx_tr.config.decode.length_penalty_k = 0.0
    ours = onnx_tr.translate(sentences, beam_size=BEAM, length_penalty=ALPHA, batch_size=16)
    assert _agreement(native, ours) >= 0.95
    for a, b in zip(native, ours):
        if a.text == b.text:
            assert b.hypotheses[0].score == pytest.approx(a.hypotheses[0].score, abs=1e-3)
    greedy_native = native_tr.translate(sentences, beam_size=1, batch_size=7)
    assert _agreement(greedy_native, onnx_tr.translate(sentences, beam_size=1, batch_size=7)) >= 0.95


def test_cli_export_and_engines(trained, tmp_path, capsys):
    """``attnmt export`` then ``attnmt translate --engine``: one line out per line in, the
    Python API's translations; an export into a non-empty directory is a one-line error."""
    run_dir, _, sentences, _ = trained
    (tmp_path / "in.txt").write_text("\n".join(sentences[:8]) + "\n\n")
    native = Translator.from_dir(run_dir).translate(sentences[:8], beam_size=4)
    for fmt, engine in (("ctranslate2", "ctranslate2"), ("onnx", "onnxruntime")):
        assert main(["-q", "export", fmt, "--model", str(run_dir), "--output", str(tmp_path / fmt)]) == 0
        capsys.readouterr()
        assert main(["-q", "translate", "--engine", engine, "--model", str(tmp_path / fmt), "--input",
                     str(tmp_path / "in.txt"), "--beam-size", "4"]
                    + (["--early-stopping", "true"] if engine == "ctranslate2" else [])) == 0
        lines = capsys.readouterr().out.split("\n")
        assert len(lines) == 10 and lines[8] == ""  # 9 lines (one empty) + the final newline
        if engine == "onnxruntime":  # attnmt's own search, k = 5 as natively
            assert sum(o == t.text for o, t in zip(lines, native)) >= 7
    assert main(["export", "onnx", "--model", str(run_dir), "--output", str(tmp_path / "onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmt: error:") and err.count("\n") == 1
    assert main(["export", "onnx", "--model", str(run_dir), "--output", str(tmp_path / "onnx2"),
                 "--int8-weight-bits", "8"]) == 2
    err = capsys.readouterr().err
    assert "--int8-weight-bits" in err and err.count("\n") == 1 and not (tmp_path / "onnx2").exists()


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(AttnmtError, match=r"pip install 'attnmt\[export\]'"):
        require("onnxruntime")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(AttnmtError, match=r"attnmt\[hf\]"):
        require("transformers")
