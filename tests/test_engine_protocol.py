"""Engines behind one protocol: the step model that attnmt's search drives, capabilities declared
by each engine (never found by type checks), one factory, and ``attnmt score --engine``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attnmt.decode.translator as translator_module
from attnmt import cli
from attnmt.decode.engine import CAPABILITIES, UnsupportedOption, require
from attnmt.interop.engines import ENGINES, open_translator
from attnmt.search.step_model import StepModel

pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

PAIRS = [("alpha bravo charlie", "alpha bravo charlie"), ("delta echo", "delta golf"), ("hotel", "")]


@pytest.fixture(scope="module")
def engines(tiny_run, tmp_path_factory) -> dict:
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.onnx import export_onnx

    tmp = tmp_path_factory.mktemp("protocol")
    dirs = {"native": tiny_run, "ctranslate2": export_ctranslate2(tiny_run, tmp / "ct2"),
            "onnxruntime": export_onnx(tiny_run, tmp / "onnx")}
    opened = {name: (open_translator(path, name, "cpu"), path) for name, path in dirs.items()}
    for tr, _ in opened.values():  # the stopping rule every engine has (CTranslate2 has no exact stopping)
        tr.config.decode.early_stopping = True
    return opened


def test_native_and_onnx_models_are_step_models(engines):
    native, onnx = engines["native"][0].engine, engines["onnxruntime"][0].engine
    assert isinstance(native.model, StepModel) and isinstance(onnx.model, StepModel)
    assert not hasattr(engines["ctranslate2"][0].engine, "model")  # a whole-search engine


def test_capabilities_are_declared_and_checked(engines):
    assert engines["native"][0].engine.capabilities == frozenset(CAPABILITIES)
    assert engines["ctranslate2"][0].engine.capabilities == {"score"}
    assert engines["onnxruntime"][0].engine.capabilities == frozenset()
    ct2, onnx = engines["ctranslate2"][0], engines["onnxruntime"][0]
    for call, message in ((lambda: ct2.model, "a PyTorch model"), (lambda: ct2.set_precision("bf16"), "--precision"),
                          (lambda: ct2.attention([5, 3], [3]), "attention weights"),
                          (lambda: onnx.score(["alpha"], ["alpha"]), "forced decoding")):
        with pytest.raises(UnsupportedOption, match="^the (ctranslate2|onnxruntime) engine does not support"):
            call()
        with pytest.raises(UnsupportedOption, match=re.escape(message)):
            call()
    assert ct2.attention_kind is None and engines["native"][0].attention_kind == "explicit"
    with pytest.raises(ValueError, match="unknown engine capability"):
        require(ct2.engine, "teleport", "teleporting")


def test_ctranslate2_scores_as_native(engines):
    """Forced decoding through CTranslate2's score_batch gives the native log-probabilities."""
    sources, targets = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    native = engines["native"][0].score(sources, targets)
    ct2 = engines["ctranslate2"][0].score(sources, targets, batch_size=2)
    for a, b in zip(native, ct2):
        assert a.token_ids == b.token_ids and a.pieces == b.pieces
        assert b.token_log_probs == pytest.approx(a.token_log_probs, abs=1e-4)
        assert b.log_prob == pytest.approx(a.log_prob, abs=1e-4)


def test_cli_score_takes_every_engine_that_can(engines, tmp_path, capsys):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    outputs = {}
    for name in ("native", "ctranslate2"):
        assert cli.main(["score", "--model", str(engines[name][1]), "--src", str(src), "--tgt", str(tgt),
                         "--engine", name, "--device", "cpu"]) == 0
        outputs[name] = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert len(outputs["native"]) == len(PAIRS) + 1  # one line per pair, then the corpus line
    for a, b in zip(*outputs.values()):
        assert a[0] == b[0] and a[2] == b[2]  # id, tokens
        assert float(b[1]) == pytest.approx(float(a[1]), abs=1e-3)
    assert cli.main(["score", "--model", str(engines["onnxruntime"][1]), "--src", str(src), "--tgt", str(tgt),
                     "--engine", "onnxruntime"]) == 2
    err = capsys.readouterr().err
    assert err == "attnmt: error: the onnxruntime engine does not support forced decoding (attnmt score)\n"


def test_options_are_checked_once_per_request(engines, monkeypatch):
    calls = []
    check = translator_module.check_supported
    monkeypatch.setattr(translator_module, "check_supported", lambda e, o: calls.append(o) or check(e, o))
    for name in ENGINES:
        calls.clear()
        tr = engines[name][0]
        tr.translate(["alpha bravo", "charlie", "delta echo foxtrot", "golf"], beam_size=2, batch_size=1)
        assert len(calls) == 1, name


def test_one_factory_refuses_what_an_engine_lacks(engines):
    with pytest.raises(ValueError, match="unknown engine 'marian'"):
        open_translator(engines["native"][1], "marian")
    with pytest.raises(UnsupportedOption,
                       match=r"^the ctranslate2 engine does not support precision \(--precision\): the native engine has it$"):
        open_translator(engines["ctranslate2"][1], "ctranslate2", precision="int8")
    with pytest.raises(UnsupportedOption,
                       match=r"^the onnxruntime engine does not support compute_type \(--compute-type\): the ctranslate2"):
        open_translator(engines["onnxruntime"][1], "onnxruntime", compute_type="int8")


def test_no_type_checks_of_engines_in_decode():
    decode = Path(translator_module.__file__).parent
    for path in decode.glob("*.py"):
        assert not re.search(r"isinstance\([^)]*(NativeEngine|CTranslate2Engine|OnnxEngine)", path.read_text()), path


def test_onnx_source_side_is_bound_once_per_set_of_sentences(engines, monkeypatch):
    """The source keys and values become ONNX Runtime values when a batch starts and each time
    sentences leave it, never at the other steps (no per-step copy of the source side)."""
    import onnxruntime as ort

    from attnmt.interop.onnx import OnnxCache

    model = engines["onnxruntime"][0].engine.model
    events = []  # "value" (an OrtValue made), "step", "move" (sentences left)
    from_numpy, step, reorder = ort.OrtValue.ortvalue_from_numpy, model.decode_step, OnnxCache.reorder
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                        staticmethod(lambda *a: events.append("value") or from_numpy(*a)))
    monkeypatch.setattr(model, "decode_step", lambda *a: events.append("step") or step(*a))
    monkeypatch.setattr(OnnxCache, "reorder", lambda self, rows, sources=None: (
        events.append("move" if sources is not None else "keep"), reorder(self, rows, sources))[1])
    engines["onnxruntime"][0].translate(["alpha bravo", "charlie delta echo foxtrot golf hotel", "india"],
                                        beam_size=3, batch_size=3)
    per_set = 1 + 2 * model.num_layers  # src_mask and each layer's keys and values
    moves = [i for i, e in enumerate(events) if e == "move" and "step" in events[i:]]  # followed by a step
    assert events.count("value") == per_set * (1 + len(moves))
    assert events.count("step") > 1 + len(moves)  # most steps made no value


def test_onnx_step_graph_takes_the_source_once_per_sentence(tiny_run, tmp_path):
    """The decoder step of an export with attention (the web page's) gives the same log-probabilities,
    caches and attention whether a sentence's source rows come once for its K hypotheses or once
    per hypothesis, and its attention is the native model's."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from attnmt.data.batching import pad_sequences
    from attnmt.interop.onnx import DECODER_STEP, ENCODER, export_onnx

    out = export_onnx(tiny_run, tmp_path / "onnx", attention=True)
    encoder, decoder = (ort.InferenceSession(str(out / name)) for name in (ENCODER, DECODER_STEP))
    native = open_translator(tiny_run, "native", "cpu")
    sources = native.encode_sources(["alpha bravo charlie", "delta"])
    src = pad_sequences(sources).numpy()  # (2, S), the second padded
    kv = encoder.run(None, {"src": src})
    layers, beams = native.config.model.num_decoder_layers, 3
    heads, head_dim = kv[0].shape[1], kv[0].shape[3]
    start = native.config.model.decoder_start_id
    tokens = np.full((2 * beams, 1), start, dtype=np.int64)
    empty = [np.zeros((2 * beams, heads, 0, head_dim), np.float32)] * (2 * layers)
    names = [i.name for i in decoder.get_inputs()]
    once = decoder.run(None, dict(zip(names, [tokens, np.array([0]), src != 0, *empty, *kv])))
    each = decoder.run(None, dict(zip(names, [tokens, np.array([0]), np.repeat(src != 0, beams, 0), *empty,
                                              *[np.repeat(a, beams, 0) for a in kv]])))
    for a, b in zip(once, each):
        assert a.shape == b.shape and np.allclose(a, b, atol=1e-5)
    attention = once[-1]  # (2K, L, S)
    for i, ids in enumerate(sources):
        want = native.attention(ids, [3])["source"][:, :, 0].mean(dim=1)  # (L, S), the first step's
        for k in range(beams):
            got = torch.from_numpy(attention[i * beams + k, :, :len(ids)])
            assert torch.allclose(got, want, atol=1e-5)
            assert float(attention[i * beams + k, :, len(ids):].sum()) == 0.0  # padding gets nothing


def test_inter_threads_reach_the_search_from_the_command_line(tiny_run, tmp_path, monkeypatch, capsys):
    """``--inter-threads 2 --threads 1``: the batches go to two workers, the translations are those
    of one batch at a time; ``--inter-threads 0`` is a one-line usage error."""
    import torch

    src = tmp_path / "src.txt"
    src.write_text("\n".join(["alpha bravo", "charlie", "delta echo foxtrot", "golf", "hotel india"]) + "\n")
    workers = []
    search = translator_module.search_in_batches
    monkeypatch.setattr(translator_module, "search_in_batches",
                        lambda *args: workers.append(args[4]) or search(*args))
    threads = torch.get_num_threads()
    try:
        outs = []
        for flags in ([], ["--inter-threads", "2", "--threads", "1"]):
            out = tmp_path / f"out{len(flags)}.txt"
            assert cli.main(["translate", "--model", str(tiny_run), "--input", str(src), "--output", str(out),
                             "--beam-size", "2", "--batch-size", "2", "--device", "cpu", *flags]) == 0
            outs.append(out.read_text())
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert workers == [1, 2] and outs[0] == outs[1]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "--model", str(tiny_run), "--input", str(src), "--inter-threads", "0"])
    assert exit_info.value.code == 2 and "--inter-threads" in capsys.readouterr().err
