"""`attnmt export web`: the exported static page, loaded in headless Chromium (playwright) from a
local static server with and without the cross-origin isolation headers, must translate as the
native search does, token for token, one sentence at a time and in batches; it must stay
responsive while its worker translates; its decoder-step graph must gather its cache rows as the
search asks; its JavaScript tokenizer must give Python SentencePiece's ids; and the JavaScript
side's own tests (`node --test`) run here too.

The page's assets are built by `npm ci && npm run build` in src/attnmt/web, which the package build
runs (`pip install -e .` where npm is on PATH); the export copies them, as it does from a wheel.
Without chromium, node or the built page the tests that need them skip, naming the package.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import json
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from attnmt.cli import main
from attnmt.decode.translator import Translator
from tests.conftest import GERMAN_ENGLISH, skip_without
from tests.test_interop_marian import _data_dir, marian  # noqa: F401  (the tiny MarianMT fixture)

pytest.importorskip("onnxruntime")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
WEB = Path(__file__).resolve().parents[1] / "src" / "attnmt" / "web"
AGREEMENT = 0.95


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Native translation on one thread: these tiny models gain nothing from two, and on a
    loaded machine two spinning threads made them a hundred times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sentences(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    words = sorted(GERMAN_ENGLISH)
    return [" ".join(rng.sample(words, rng.randint(2, 7))) for _ in range(n)]


class _Handler(http.server.SimpleHTTPRequestHandler):
    isolated = False

    def end_headers(self):
        if self.isolated:  # what makes a page cross-origin isolated: ONNX Runtime Web may use threads
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


class _Server:
    """A static file server for ``root`` on 127.0.0.1 (as ``python -m http.server``), optionally
    sending the COOP/COEP headers."""

    def __init__(self, root: Path, isolated: bool):
        handler = type("Handler", (_Handler,), {"isolated": isolated})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    skip_without("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def _open(browser, root: Path, isolated: bool):
    """(page, server) with the exported page loaded and its model ready."""
    server = _Server(root, isolated)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith((server.url, "data:", "blob:")) else errors.append(r.url))
    page.goto(server.url)
    page.evaluate("window.attnmt.ready")
    assert not errors, errors  # no script error, and nothing fetched from elsewhere (no CDN)
    return page, server


def _page_tokens(page, sentences: list[str], beam_size: int) -> list[list[int]]:
    return page.evaluate("async ([xs, k]) => { const out = []; for (const x of xs) "
                         "out.push((await window.attnmt.translateFull(x, {beamSize: k})).tokens); return out; }",
                         [sentences, beam_size])


def _page_batch_tokens(page, sentences: list[str], beam_size: int, batch_size: int) -> list[list[int]]:
    return page.evaluate("async ([xs, k, n]) => (await window.attnmt.translateBatch(xs, {beamSize: k, batchSize: n}))"
                         ".map((r) => r.tokens)", [sentences, beam_size, batch_size])


def _agreement(ours: list[list[int]], native) -> float:
    return sum(a == t.hypotheses[0].token_ids for a, t in zip(ours, native)) / len(native)


def _require_page():
    skip_without("page")


@pytest.fixture(scope="module")
def site(dictionary_model_dir, tmp_path_factory):
    """The CLI's export of the toy-task model (float32)."""
    _require_page()
    out = tmp_path_factory.mktemp("web") / "site"
    assert main(["-q", "export", "web", "--model", str(dictionary_model_dir), "--output", str(out)]) == 0
    return out


def test_export_writes_a_static_site(site, dictionary_model_dir):
    files = {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}
    assert {"index.html", "attnmt.js", "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs",
            "model/config.json", "model/encoder.onnx", "model/decoder_step.onnx", "model/spm.model",
            "model/pieces.json"} <= files
    config = json.loads((site / "model" / "config.json").read_text())
    native = Translator.from_dir(dictionary_model_dir).config
    assert config["decode"]["beam_size"] == native.decode.beam_size == 4
    assert config["decode"]["max_len_a"] == native.decode.max_len_a
    assert config["model"]["decoder_start_id"] == 2 and config["special_ids"]["eos"] == 3
    html = (site / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


@pytest.mark.parametrize("isolated", [False, True], ids=["plain", "coop-coep"])
def test_page_equals_native_greedy_and_beam(browser, site, dictionary_model_dir, isolated):
    """20 sentences, greedy and beam 4: the page's token ids equal the native search's on >= 95%;
    threads only where the page is cross-origin isolated."""
    sentences = _sentences(20)
    native = Translator.from_dir(dictionary_model_dir)
    page, server = _open(browser, site, isolated)
    try:
        assert page.evaluate("crossOriginIsolated") is isolated
        assert (page.evaluate("window.attnmt.threads()") > 1) is isolated
        for beam in (1, 4):
            expected = native.translate(sentences, beam_size=beam)
            assert _agreement(_page_tokens(page, sentences, beam), expected) >= AGREEMENT
            # searched 7 at a time (length-sorted, the last batch smaller), as native batches them
            assert _agreement(_page_batch_tokens(page, sentences, beam, 7), expected) >= AGREEMENT
            assert page.evaluate("(x) => window.attnmt.translate(x, {beamSize: %d})" % beam,
                                 sentences[0]) == expected[0].text != ""
        assert page.evaluate("window.attnmt.translate('   ')") == ""
    finally:
        page.close()
        server.close()


def test_page_shows_words_time_and_attention(browser, site, dictionary_model_dir, tmp_path):
    """The DOM: the translation's words, the time, and a heatmap row per output token whose most
    attended source word is the native model's (decoder layer 1, head average)."""
    sentence = "ein mann sieht katze und hund"
    native = Translator.from_dir(dictionary_model_dir)
    expected = native.translate([sentence], beam_size=4, return_attention=True)[0]
    page, server = _open(browser, site, False)
    try:
        page.fill("#source", sentence)
        page.click("#translate")
        page.wait_for_function("document.getElementById('translation').dataset.text !== undefined")
        assert page.get_attribute("#translation", "data-text") == expected.text
        assert "ms" in page.inner_text("#status")
        assert page.locator("#translation .tok").count() == len(expected.hypotheses[0].pieces)
        rows = page.locator("#heatmap tbody tr")
        assert rows.count() == len(expected.hypotheses[0].pieces)
        assert page.input_value("#layer") == "1"
        weights = expected.attention[1].mean(dim=0)  # (T, S), layer 1, head average
        for i in range(rows.count()):
            cells = rows.nth(i).locator("td")
            shown = [float(cells.nth(j).get_attribute("title").rsplit(": ", 1)[1]) for j in range(cells.count())]
            assert shown == pytest.approx(weights[i].tolist(), abs=2e-3)
        page.screenshot(path=str(tmp_path / "web.png"), full_page=True)
    finally:
        page.close()
        server.close()
    assert (tmp_path / "web.png").stat().st_size > 10_000


def test_page_stays_responsive_while_translating(browser, site, dictionary_model_dir):
    """The search runs in a Web Worker: while the worker translates a batch of sentences that
    takes seconds, a click on the translate button and typing in the source box are handled
    before the batch ends (on the page's own thread, the search would hold both back until it
    ended). The clicked translation runs after the batch and is then shown."""
    sentences = _sentences(400, seed=3)
    page, server = _open(browser, site, False)
    try:
        started = time.perf_counter()
        _page_batch_tokens(page, sentences[:40], 8, 1)
        n = min(len(sentences), max(40, int(40 * 4.0 / max(time.perf_counter() - started, 1e-3))))  # ~4 s
        page.evaluate("""(xs) => {
            window.handled = [];
            for (const [id, kind] of [['translate', 'click'], ['source', 'input']])
                document.getElementById(id).addEventListener(kind, () => handled.push([kind, performance.now()]));
            window.batchEnded = null;
            window.attnmt.translateBatch(xs, {beamSize: 8, batchSize: 1}).then(() => { batchEnded = performance.now(); });
        }""", sentences[:n])
        page.fill("#source", "")
        page.locator("#source").press_sequentially("ein hund")
        page.click("#translate")
        handled, ended = page.evaluate("[window.handled, window.batchEnded]")
        assert ended is None, "the page handled the click only after the translation"
        assert [kind for kind, _ in handled][-1] == "click" and "input" in [kind for kind, _ in handled]
        assert page.inner_text("#status").startswith("translating")  # the click's handler ran
        page.wait_for_function("document.getElementById('translation').dataset.text !== undefined", timeout=120_000)
        handled, ended = page.evaluate("[window.handled, window.batchEnded]")
        assert ended is not None and max(t for _, t in handled) < ended
        expected = Translator.from_dir(dictionary_model_dir).translate(["ein hund"], beam_size=4)[0].text
        assert page.get_attribute("#translation", "data-text") == expected != ""
    finally:
        page.close()
        server.close()


def test_page_reports_a_model_its_worker_cannot_load(browser, site, tmp_path):
    """A site missing its decoder graph: the worker's load fails, the page says which file in its
    status line, and window.attnmt's calls reject with the same message instead of waiting."""
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    (broken / "model" / "decoder_step.onnx").unlink()
    server = _Server(broken, False)
    page = browser.new_page()
    try:
        page.goto(server.url)
        page.wait_for_function("document.getElementById('status').className === 'error'", timeout=60_000)
        assert "decoder_step.onnx: HTTP 404" in page.inner_text("#status")
        message = page.evaluate("window.attnmt.translate('ein hund').then(() => 'translated', (e) => e.message)")
        assert "decoder_step.onnx: HTTP 404" in message
        assert page.is_disabled("#translate")
    finally:
        page.close()
        server.close()


def test_web_graph_gathers_the_rows_it_is_told(tiny_run, tmp_path, caplog):
    """attnmt.interop.web_graph: the rewritten decoder step, given the previous step's caches
    (P rows), the source of every sentence of the batch and the row indices, computes what the
    exported graph computes on those rows gathered beforehand, bit for bit: here 2 of 3 sentences
    (the third has finished), 2 hypotheses each, continuing rows 4, 0 | 0, 1 of 5. The export
    shows no tracer warning, and the int8 quantizer's chatter on the root logger is not shown."""
    import logging
    import warnings

    import numpy as np
    import onnxruntime as ort
    import torch

    from attnmt.interop.onnx import export_onnx
    from attnmt.interop.web import _quantize_int8
    from attnmt.interop.web_graph import gather_rows_in_graph

    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        out = export_onnx(tiny_run, tmp_path / "onnx", attention=True)
    caplog.set_level(logging.INFO)
    _quantize_int8(out / "encoder.onnx", tmp_path / "encoder_int8.onnx")
    assert (tmp_path / "encoder_int8.onnx").stat().st_size > 0
    assert not [r for r in caplog.records if r.name == "root"]
    shutil.copyfile(out / "decoder_step.onnx", tmp_path / "web_step.onnx")
    gather_rows_in_graph(tmp_path / "web_step.onnx")
    with pytest.raises(ValueError, match="already has"):
        gather_rows_in_graph(tmp_path / "web_step.onnx")
    with pytest.raises(ValueError, match="not a decoder-step graph"):
        gather_rows_in_graph(out / "encoder.onnx")
    encoder, plain, web = (ort.InferenceSession(str(p)) for p in (out / "encoder.onnx", out / "decoder_step.onnx",
                                                                  tmp_path / "web_step.onnx"))
    assert {i.name for i in web.get_inputs()} == {i.name for i in plain.get_inputs()} | {"parent", "sentence"}
    src = np.array([[5, 6, 7, 3], [8, 9, 3, 0], [6, 5, 3, 0]], dtype=np.int64)
    src_kv = encoder.run(None, {"src": src})
    layers = len(src_kv) // 2
    _, heads, _, head_dim = src_kv[0].shape
    rng = np.random.default_rng(0)
    prev = [rng.standard_normal((5, heads, 2, head_dim)).astype(np.float32) for _ in range(2 * layers)]
    parent, sentence = np.array([4, 0, 0, 1]), np.array([2, 0])
    self_names = [f"self_{k}_{i}" for i in range(layers) for k in ("key", "value")]
    src_names = [f"src_{k}_{i}" for i in range(layers) for k in ("key", "value")]
    common = {"tokens": rng.integers(4, 30, (4, 1)), "position": np.array([2])}
    expected = plain.run(None, {**common, "src_mask": (src != 0)[sentence],
                                **{n: t[parent] for n, t in zip(self_names, prev)},
                                **{n: t[sentence] for n, t in zip(src_names, src_kv)}})
    got = web.run(None, {**common, "src_mask": src != 0, "parent": parent, "sentence": sentence,
                         **dict(zip(self_names, prev)), **dict(zip(src_names, src_kv))})
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert got[1].shape == (4, heads, 3, head_dim) and got[-1].shape == (4, layers, 4)


def test_int8_export_is_smaller_and_translates(browser, site, dictionary_model_dir, tmp_path):
    out = tmp_path / "int8"
    assert main(["-q", "export", "web", "--model", str(dictionary_model_dir), "--output", str(out),
                 "--quantization", "int8"]) == 0
    for name in ("encoder.onnx", "decoder_step.onnx"):
        assert (out / "model" / name).stat().st_size < 0.6 * (site / "model" / name).stat().st_size
    sentences = _sentences(20, seed=5)
    native = Translator.from_dir(dictionary_model_dir).translate(sentences, beam_size=1)
    page, server = _open(browser, out, False)
    try:
        assert _agreement(_page_tokens(page, sentences, 1), native) >= 0.9
    finally:
        page.close()
        server.close()


def test_imported_marian_model_in_the_page(browser, marian, tmp_path):  # noqa: F811
    """An imported MarianMT model (decoder start = pad, pad forbidden, two SentencePiece models
    over vocab.json): the page's greedy and beam outputs equal the native ones (8 sentences of
    a random model whose outputs run long: >= 7 of them)."""
    _require_page()
    hf_dir, _, sentences = marian
    model_dir, out = tmp_path / "imported", tmp_path / "site"
    assert main(["-q", "import", "marian", str(hf_dir), "--output", str(model_dir)]) == 0
    assert main(["-q", "export", "web", "--model", str(model_dir), "--output", str(out)]) == 0
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["tokenizer"]["mapped"] and config["model"]["decoder_start_id"] == 0
    native = Translator.from_dir(model_dir)
    page, server = _open(browser, out, False)
    try:
        for beam in (1, 3):
            expected = native.translate(sentences[:8], beam_size=beam)
            assert _agreement(_page_tokens(page, sentences[:8], beam), expected) >= 7 / 8
        assert page.evaluate("(x) => window.attnmt.translate(x, {beamSize: 3})", sentences[0]) == expected[0].text
    finally:
        page.close()
        server.close()


def test_export_errors_are_one_line(dictionary_model_dir, site, tmp_path, capsys):
    assert main(["export", "web", "--model", str(dictionary_model_dir), "--output", str(site)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmt: error:") and "not empty" in err and err.count("\n") == 1
    assert main(["export", "web", "--model", str(dictionary_model_dir), "--output", str(tmp_path / "x"),
                 "--quantization", "int16"]) == 2
    assert "int8 or float32" in capsys.readouterr().err and not (tmp_path / "x").exists()


def _multi30k_lines() -> list[str]:
    """500 Multi30k sentences (German and English), plus punctuation, digits and rare Unicode."""
    data = _data_dir() / "multi30k"
    lines = []
    for lang in ("de", "en"):
        with gzip.open(data / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f][:230]
    return lines + [
        "Ein Mann (45) kauft 3,5 kg Äpfel für 12,99 € – am 1.1.2024!", "„Hallo“, sagte sie… «Ça va?»",
        "x² + y³ = z⁴; ½ ⅓ ¼ № ™ ©", "Straße ẞ ǅ ﬁ ﬂ Å Ω K", "日本語のテキスト 中文 한국어", "emoji 😀👍🏽 🇩🇪 family 👨‍👩‍👧",
        "tab\tseparated  double  spaces ", "Ελληνικά русский עברית العربية हिन्दी", "zero\u200bwidth\u00a0nbsp",
        "Cafe\u0301 vs Café (NFD vs NFC)", "123456789 0.001 -42 +7 1e10 #hashtag @user https://example.org/a?b=c",
        "'quotes' \"double\" `back` <tag> [b] {c} | \\ / ~ ^ % $", "ÀÉÎÕÜ àéîõü ÇçÑñ ßæøå", "…",
        "Ⅻ ① ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "", "a" * 300, "mixed   spaces\u3000ideographic",
    ] + [f"Nummer {i}: {i * 37 % 1000} Hunde, {i / 7:.3f} Katzen." for i in range(22)]


def _spm(lines: list[str], model_type: str) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=800,
                                   model_type=model_type, character_coverage=0.9995, pad_id=0, unk_id=1,
                                   bos_id=2, eos_id=3, minloglevel=2, num_threads=1)
    return buf.getvalue()


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_javascript_tokenizer_equals_sentencepiece(model_type, tmp_path):
    """The page's tokenizer (SentencePiece compiled to WebAssembly, run by node) gives Python
    SentencePiece's ids on 500 sentences with punctuation, digits and rare Unicode."""
    import sentencepiece as spm

    skip_without("node", "packages")
    lines = _multi30k_lines()
    assert len(lines) == 500
    data = _data_dir() / "multi30k"
    with gzip.open(data / "train.de.gz", "rt", encoding="utf-8") as f:
        train = [next(f).strip() for _ in range(3000)]
    proto = _spm(train, model_type)
    (tmp_path / "m.model").write_bytes(proto)
    run = subprocess.run(["node", str(WEB / "tools" / "encode.mjs"), str(tmp_path / "m.model")],
                         input="\n".join(json.dumps(x) for x in lines) + "\n", capture_output=True, text=True,
                         timeout=120, check=True)
    ours = [json.loads(x) for x in run.stdout.splitlines()]
    expected = spm.SentencePieceProcessor(model_proto=proto).encode(lines)
    assert any(1 in ids for ids in expected)  # rare characters hit UNK
    assert ours == expected


def test_node_test_runner_passes():
    """The JavaScript side's own tests (search.js against hand-computed cases)."""
    skip_without("node")
    run = subprocess.run(["node", "--test", "test/"], cwd=WEB, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout
