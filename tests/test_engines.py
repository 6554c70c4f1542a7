"""One engine interface: CTranslate2 (float32) and ONNX Runtime translate as the native engine
does, for every length penalty, greedy and beam search, early stopping with patience (under
which CTranslate2 runs its own search unchanged), mixed lengths in one batch, and where the
length limit binds; their token log-probabilities are the model's. ONNX Runtime also searches
with exact stopping; CTranslate2 refuses it in one line naming ``--early-stopping true``.

The model is the toy German->English dictionary model of conftest (trained in the session).
With ``ATTNMT_TEST_MODEL`` set to a model directory (e.g. the Multi30k de->en preset's run) and
``ATTNMT_DATA`` holding Multi30k, the same checks run on 100 test2016 sentences with it.
"""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

import pytest

from attnmt.data.tokenizers import EOS_ID
from attnmt.decode.engine import Engine, SearchOptions, UnsupportedOption, check_supported
from attnmt.decode.translator import Translator
from attnmt.search.batched import length_batches
from tests.conftest import GERMAN_ENGLISH, multi30k_data

pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

# (name, search options): every native length penalty, greedy and beam 4.
SETTINGS = [(f"{name} beam {beam}", dict(beam_size=beam, **kw))
            for beam in (1, 4)
            for name, kw in (("gnmt 0.6 k 5", dict(length_penalty_type="gnmt", length_penalty=0.6, length_penalty_k=5.0)),
                             ("gnmt 1.4 k 5", dict(length_penalty_type="gnmt", length_penalty=1.4, length_penalty_k=5.0)),
                             ("average", dict(length_penalty_type="average")))]
# The same under early stopping (greedy search is the same under both rules), and a patience.
EARLY = [(f"early stopping, {label}", dict(early_stopping=True, **kw)) for label, kw in SETTINGS] + [
    ("early stopping, patience 1.5, gnmt 1.0 beam 4",
     dict(early_stopping=True, patience=1.5, beam_size=4, length_penalty_type="gnmt", length_penalty=1.0))]


def _engines(model_dir: Path, tmp: Path) -> dict[str, Translator]:
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator
    from attnmt.interop.onnx import export_onnx

    return {"native": open_translator(model_dir, "native", "cpu"),
            "ctranslate2": open_translator(export_ctranslate2(model_dir, tmp / "ct2"), "ctranslate2", "cpu"),
            "onnxruntime": open_translator(export_onnx(model_dir, tmp / "onnx"), "onnxruntime", "cpu")}


def _toy_sentences(n: int) -> list[str]:
    """Mixed lengths, 1 to 12 words (some longer than anything seen in training)."""
    rng, words = random.Random(11), sorted(GERMAN_ENGLISH)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def toy(dictionary_model_dir, tmp_path_factory):
    return _engines(dictionary_model_dir, tmp_path_factory.mktemp("engines")), _toy_sentences(100)


def _compare(engines: dict[str, Translator], sentences: list[str], options: SearchOptions, label: str,
             batch_size: int = 32) -> None:
    """>= 99% of sentences with the native token ids under exact stopping, >= 97% under early
    stopping (CTranslate2 returns round(K x patience) hypotheses ranked by its own length
    penalty, among which the native GNMT ranking with k > 0 picks; each difference printed), and
    every hypothesis' token log-probabilities those of forced decoding under the native model.
    Hypotheses end with EOS, except those cut at their length limit (under every search)."""
    native = engines["native"]
    expected = native.translate(sentences, options=options, batch_size=batch_size)
    src_ids = native.encode_sources(sentences)
    limits = [min(int(options.max_len_a * len(ids) + options.max_len_b), native.config.model.max_positions - 1)
              for ids in src_ids]
    early = options.early_stopping and not options.is_greedy
    share = 0.97 if early else 0.99
    for name in ("ctranslate2", "onnxruntime"):
        if name == "ctranslate2" and not options.is_greedy and not options.early_stopping:
            with pytest.raises(UnsupportedOption, match="exact_stopping; use --early-stopping true"):
                engines[name].translate(sentences, options=options, batch_size=batch_size)
            continue
        got = engines[name].translate(sentences, options=options, batch_size=batch_size)
        same = 0
        for s, a, b in zip(sentences, expected, got):
            if a.hypotheses[0].token_ids == b.hypotheses[0].token_ids:
                same += 1
                assert b.hypotheses[0].score == pytest.approx(a.hypotheses[0].score, abs=1e-3)
            else:
                print(f"{label}, {name} differs on {s!r}:\n  native {a.hypotheses[0].score:.4f} {a.text!r}\n"
                      f"  {name} {b.hypotheses[0].score:.4f} {b.text!r}")
        assert same >= share * len(sentences), f"{label}: {name} equals native on {same} of {len(sentences)}"
        forced = native.engine.forced_log_probs(src_ids, [t.hypotheses[0].token_ids for t in got])
        for t, lps, limit in zip(got, forced, limits):
            h = t.hypotheses[0]
            if len(h.token_ids) == limit and h.token_ids[-1] != EOS_ID:  # cut at the limit: no EOS
                assert h.pieces[-1] != "</s>"
            else:
                assert h.token_ids[-1] == EOS_ID and h.pieces[-1] == "</s>"
            assert h.token_log_probs == pytest.approx(lps, abs=1e-3)
            assert h.log_prob == pytest.approx(sum(h.token_log_probs), abs=1e-4)


@pytest.mark.parametrize("label, settings", SETTINGS + EARLY, ids=[s[0] for s in SETTINGS + EARLY])
def test_engines_equal_native(toy, label, settings):
    engines, sentences = toy
    _compare(engines, sentences, engines["native"].options(**settings), label)


@pytest.mark.parametrize("beam_size, early_stopping", [(1, False), (4, False), (4, True)])
def test_engines_equal_native_where_the_length_limit_binds(toy, beam_size, early_stopping):
    """Output limit 0.5 x source length + 1: most hypotheses end at the limit, cut there without
    EOS under every search (CTranslate2's beam search searching those sentences again with their
    own limit)."""
    engines, sentences = toy
    options = engines["native"].options(beam_size, 1, 1.4, max_len_a=0.5, max_len_b=1, early_stopping=early_stopping)
    native = engines["native"].translate(sentences, options=options)
    limits = [int(0.5 * len(ids) + 1) for ids in engines["native"].encode_sources(sentences)]
    assert sum(len(t.hypotheses[0].token_ids) == n for t, n in zip(native, limits)) >= 50
    _compare(engines, sentences, options, f"limit binds, beam {beam_size}")


@pytest.mark.parametrize("name", ["native", "ctranslate2", "onnxruntime"])
def test_batches_in_parallel_translate_as_one_batch_at_a_time(toy, dictionary_model_dir, tmp_path, name):
    """``inter_threads`` 2 (two batches at once, one thread each; CTranslate2 with two replicas)
    gives every engine the translations and scores of one batch at a time."""
    import torch

    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator
    from attnmt.interop.onnx import export_onnx

    engines, sentences = toy
    options = engines["native"].options(4, 1, 1.0, early_stopping=True)
    expected = engines[name].translate(sentences, options=options, batch_size=16)
    model_dir = {"native": lambda: dictionary_model_dir,
                 "ctranslate2": lambda: export_ctranslate2(dictionary_model_dir, tmp_path / "ct2"),
                 "onnxruntime": lambda: export_onnx(dictionary_model_dir, tmp_path / "onnx")}[name]()
    threads = torch.get_num_threads()  # the native engine sets PyTorch's process-wide thread count
    try:
        parallel = open_translator(model_dir, name, "cpu", threads=1, inter_threads=2)
        assert parallel.inter_threads == 2
        got = parallel.translate(sentences, options=options, batch_size=16)  # 7 batches
    finally:
        torch.set_num_threads(threads)
    assert [t.hypotheses[0].token_ids for t in got] == [t.hypotheses[0].token_ids for t in expected]
    assert [t.hypotheses[0].score for t in got] == pytest.approx([t.hypotheses[0].score for t in expected], abs=1e-4)


class _Recorder:
    """A ``ctranslate2.Translator`` stand-in that records each call's batch size and length limit."""

    def __init__(self, translator):
        self.translator, self.calls = translator, []

    def translate_batch(self, source, **kwargs):
        self.calls.append(("translate_batch", len(source), kwargs.get("max_decoding_length")))
        return self.translator.translate_batch(source, **kwargs)

    def score_batch(self, source, target, **kwargs):
        self.calls.append(("score_batch", len(source), None))
        return self.translator.score_batch(source, target, **kwargs)

    def __getattr__(self, name):
        return getattr(self.translator, name)


def test_ctranslate2_early_stopping_is_one_search_per_batch(toy):
    """One ``translate_batch`` per batch at the batch's longest limit, then one per distinct
    shorter limit only for sentences whose search reached their own, and no ``score_batch``
    without token log-probabilities; the totals are still the model's."""
    engines, sentences = toy
    engine = engines["ctranslate2"].engine
    recorder = engine.translator = _Recorder(engine.translator)
    try:
        options = engines["native"].options(4, 1, 1.0, early_stopping=True, return_token_log_probs=False)
        got = engines["ctranslate2"].translate(sentences, options=options, batch_size=50)
    finally:
        engine.translator = recorder.translator
    src_ids = engines["native"].encode_sources(sentences)
    longest = [max(int(1.5 * len(src_ids[i]) + 10) for i in chunk) for chunk in length_batches(src_ids, 50)]
    assert [c for c in recorder.calls if c[1] == 50] == [("translate_batch", 50, n) for n in longest]
    again = [c for c in recorder.calls if c[1] < 50]
    assert all(c[0] == "translate_batch" and c[2] < max(longest) for c in again) and len(again) < 10
    assert all(t.hypotheses[0].token_log_probs == [] for t in got)
    forced = engines["native"].engine.forced_log_probs(src_ids, [t.hypotheses[0].token_ids for t in got])
    for t, lps in zip(got, forced):
        assert t.hypotheses[0].log_prob == pytest.approx(sum(lps), abs=1e-3)


def test_ctranslate2_greedy_is_one_search_per_batch(toy):
    """Greedy search: one ``translate_batch`` per batch, to the batch's longest limit, and
    forced decoding only of the sentences cut at their own (shorter) limit; the output and
    its log-probabilities are the native search's."""
    engines, sentences = toy
    engine = engines["ctranslate2"].engine
    recorder = engine.translator = _Recorder(engine.translator)
    options = engines["native"].options(1, 1, max_len_a=0.5, max_len_b=1, return_token_log_probs=False)
    try:
        got = engines["ctranslate2"].translate(sentences, options=options, batch_size=50)
    finally:
        engine.translator = recorder.translator
    native = engines["native"].translate(sentences, options=options, batch_size=50)
    src_ids = engines["native"].encode_sources(sentences)
    limits = [int(0.5 * len(ids) + 1) for ids in src_ids]
    longest = [max(limits[i] for i in chunk) for chunk in length_batches(src_ids, 50)]
    assert [c for c in recorder.calls if c[0] == "translate_batch"] == [("translate_batch", 50, n) for n in longest]
    at_limit = sum(len(t.hypotheses[0].token_ids) == n for t, n in zip(native, limits))
    scored = sum(c[1] for c in recorder.calls if c[0] == "score_batch")
    assert 0 < scored <= at_limit
    assert [t.hypotheses[0].token_ids for t in got] == [t.hypotheses[0].token_ids for t in native]
    for t, n in zip(got, native):
        assert t.hypotheses[0].log_prob == pytest.approx(n.hypotheses[0].log_prob, abs=1e-3)


# A process where PyTorch, transformers and CTranslate2's converters cannot be imported, as on a
# machine that has only what the CTranslate2 engine needs (docs/engines.md): any import of them fails.
NO_TORCH = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers") or name.startswith("ctranslate2.converters"):
            raise ImportError(f"No module named {name!r} (not installed here)")
sys.meta_path.insert(0, NotInstalled())
from attnmt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_torch(*args: str, **kwargs):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", NO_TORCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


@pytest.fixture(scope="module")
def ct2_export(dictionary_model_dir, tmp_path_factory):
    from attnmt.interop.ctranslate2 import export_ctranslate2

    return export_ctranslate2(dictionary_model_dir, tmp_path_factory.mktemp("ct2") / "ct2")


@pytest.mark.parametrize("command", ["translate", "evaluate", "score"])
def test_ctranslate2_commands_run_where_pytorch_is_not_installed(toy, ct2_export, tmp_path, command):
    """``translate``, ``evaluate`` and ``score`` with ``--engine ctranslate2`` never import PyTorch,
    transformers or CTranslate2's converters: they run where those are not installed, and the
    translations are the native engine's."""
    engines, sentences = toy
    native = engines["native"].translate(sentences[:20], options=engines["native"].options(4, 1, early_stopping=True))
    src, ref = tmp_path / "in.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(sentences[:20]) + "\n", encoding="utf-8")
    ref.write_text("".join(t.text + "\n" for t in native), encoding="utf-8")
    args = {"translate": ["--input", str(src), "--output", str(tmp_path / "out.txt"), "--beam-size", "4",
                          "--early-stopping", "true"],
            "evaluate": ["--src", str(src), "--ref", str(ref), "--beam-size", "4", "--early-stopping", "true", "--json"],
            "score": ["--src", str(src), "--tgt", str(ref)]}[command]
    out, err = _without_torch(command, "--engine", "ctranslate2", "--model", str(ct2_export), *args).communicate(
        timeout=120)
    assert "not installed here" not in err and "Traceback" not in err, err
    if command == "translate":
        assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [t.text for t in native]
    elif command == "evaluate":
        import json

        assert json.loads(out)["bleu"] == pytest.approx(100.0)  # the native translations as references
    else:
        assert len(out.splitlines()) == 21 and out.splitlines()[-1].startswith("corpus")


def test_ctranslate2_serves_where_pytorch_is_not_installed(toy, ct2_export):
    """``attnmt serve --engine ctranslate2`` starts and translates without PyTorch."""
    import signal
    import socket
    import time

    import httpx

    engines, sentences = toy
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = _without_torch("serve", "--engine", "ctranslate2", "--model", str(ct2_export), "--port", str(port))
    try:
        deadline = time.monotonic() + 60
        answer = None
        # until the server listens and has loaded the model (503 "the model is loading" before)
        while (answer is None or answer.status_code == 503) and time.monotonic() < deadline and proc.poll() is None:
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/v1/translate",
                                    json={"text": sentences[0], "beam_size": 4, "early_stopping": True}, timeout=10)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert answer is not None and answer.status_code == 200, proc.poll()
        native = engines["native"].translate(sentences[:1], options=engines["native"].options(4, 1, early_stopping=True))
        assert answer.json()["translations"][0]["text"] == native[0].text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "not installed here" not in err and "Traceback" not in err, err


def test_nbest_and_empty_lines_alike(toy):
    engines, sentences = toy
    texts = ["", sentences[3], " ", sentences[7]]
    same_rule = dict(early_stopping=True, length_penalty_k=0)  # GNMT with k = 0 is CTranslate2's own ranking
    out = {name: tr.translate(texts, options=tr.options(4, 3, **same_rule)) for name, tr in engines.items()}
    for name, translations in out.items():
        assert [len(t.hypotheses) for t in translations] == [3, 3, 3, 3]
        assert [h.text for h in translations[0].hypotheses + translations[2].hypotheses] == [""] * 6
        assert [[h.token_ids for h in t.hypotheses] for t in translations[1::2]] == \
            [[h.token_ids for h in t.hypotheses] for t in out["native"][1::2]], name


def test_unsupported_option_is_one_line_before_any_work(toy):
    engines, _ = toy
    with pytest.raises(UnsupportedOption, match="^the onnxruntime engine does not support return_attention$"):
        engines["onnxruntime"].translate(["ein mann"], options=engines["onnxruntime"].options(
            4, early_stopping=True, return_attention=True))
    for name in ("ctranslate2", "onnxruntime"):
        engine = engines[name].engine
        assert isinstance(engine, Engine)
        with pytest.raises(UnsupportedOption, match="attention weights"):
            engines[name].attention([5, 2], [2])
    exact = engines["ctranslate2"].options(4, early_stopping=False)
    with pytest.raises(UnsupportedOption, match="^the ctranslate2 engine does not support exact_stopping; "
                                                "use --early-stopping true"):
        engines["ctranslate2"].translate(["ein mann"], options=exact)
    check_supported(engines["native"].engine, SearchOptions(beam_size=2, return_attention=True))
    with pytest.raises(ValueError, match="nbest"):
        SearchOptions(beam_size=2, nbest=3)


def test_trainer_validation_decodes_as_translate(dictionary_model_dir):
    """The trainer's validation translations are ``attnmt translate``'s greedy ones."""
    from attnmt.search.batched import native_search

    tr = Translator.from_dir(dictionary_model_dir, device="cpu")
    sentences = _toy_sentences(20)
    ids = tr.encode_sources(sentences)
    options = SearchOptions.from_config(tr.config.decode, beam_size=1)
    hyps = native_search(tr.model, ids, options, batch_size=7)
    assert [tr.tgt_tokenizer.decode(h.tokens[:-1]) for [h] in hyps] == \
        [t.text for t in tr.translate(sentences, beam_size=1, batch_size=5)]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    model, data = os.environ.get("ATTNMT_TEST_MODEL"), multi30k_data()
    if not model or data is None:
        pytest.skip("set ATTNMT_TEST_MODEL to a Multi30k de->en model directory and ATTNMT_DATA")
    with gzip.open(data / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f][:100]
    return _engines(Path(model), tmp_path_factory.mktemp("real")), sentences


@pytest.mark.parametrize("label, settings", SETTINGS + EARLY, ids=[s[0] for s in SETTINGS + EARLY])
def test_engines_equal_native_on_multi30k(real, label, settings):
    engines, sentences = real
    _compare(engines, sentences, engines["native"].options(**settings), label)
