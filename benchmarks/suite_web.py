"""web: the page of ``attnmt export web`` in headless Chromium against native ``attnmt translate``.

On the same test_2016_flickr sentences, for each export (``--quantizations``), static server
(``--servers``: plain, or with the COOP/COEP headers that allow threads), way of translating
(``--modes``: ``one`` sentence per ``window.attnmt.translate`` call, or ``batched``
``translateBatch`` of ``--page-batch``) and beam: download MiB (model folder, whole site), seconds
from navigation to the first translation in a fresh context, sentences/s and its share of native
``attnmt translate --threads N`` at the same beam, BLEU, and the share of lines identical to native.
Needs the page built (``npm ci && npm run build`` in src/attnmt/web) and Chromium.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
import time
from pathlib import Path

import harness as h

PARTS = {"page": []}
SMOKE = {"model": h.smoke_model, "limit": 4, "beams": "1", "modes": "batched", "quantizations": "int8",
         "servers": "plain"}
MODELS = ("model",)
SECTION = "In the browser"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def add_arguments(p) -> None:
    p.add_argument("--model", type=Path, help="a model trained on Multi30k de-en")
    p.add_argument("--limit", type=int, help="first N sentences only")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    p.add_argument("--quantizations", default="float32,int8", help="exports to measure, comma-separated")
    p.add_argument("--servers", default="plain,coop-coep", help="plain (one thread), coop-coep (threads)")
    p.add_argument("--threads", type=int, default=1, help="native attnmt translate's threads")
    p.add_argument("--beams", default="1,5", help="beam sizes, comma-separated")
    p.add_argument("--modes", default="one,batched", help="'one' sentence per call, 'batched' (translateBatch)")
    p.add_argument("--page-batch", type=int, default=32, help="sentences the batched page searches together")


class _Handler(http.server.SimpleHTTPRequestHandler):
    isolated = False

    def end_headers(self):
        if self.isolated:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


def serve_static(root: Path, isolated: bool) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A static server of ``root`` on a free port of 127.0.0.1 (``isolated``: with the COOP/COEP headers)."""
    handler = type("Handler", (_Handler,), {"isolated": isolated})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_port}/"


def size_mib(site: Path) -> tuple[float, float]:
    """(model folder, everything) in MiB."""
    model = sum(p.stat().st_size for p in (site / "model").rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    return model / 2**20, total / 2**20


def page_run(browser, url: str, sentences: list[str], beam: int, mode: str, page_batch: int
              ) -> tuple[float, float, list[str], int]:
    """(seconds to the first translation from navigation, seconds for all sentences, outputs, threads)
    in a fresh context; ``mode`` 'one' translates one sentence per call, 'batched' all in one call."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(0)
    t0 = time.perf_counter()
    page.goto(url)
    page.evaluate("(x) => window.attnmt.translate(x, {beamSize: 1})", sentences[0])
    first = time.perf_counter() - t0
    if mode == "one":
        script = ("async ([xs, k]) => { const t = performance.now(), out = []; for (const x of xs) "
                  "out.push(await window.attnmt.translate(x, {beamSize: k})); return [performance.now() - t, out]; }")
    else:
        script = ("async ([xs, k, n]) => { const t = performance.now(); const r = await window.attnmt.translateBatch("
                  "xs, {beamSize: k, batchSize: n}); return [performance.now() - t, r.map((x) => x.text)]; }")
    ms, outputs = page.evaluate(script, [sentences, beam, page_batch])
    threads = page.evaluate("window.attnmt.threads()")
    context.close()
    return first, ms / 1000, outputs, threads


def run(args) -> None:
    from attnmt.evaluate import corpus_scores
    from attnmt.interop.web import export_web
    from playwright.sync_api import sync_playwright

    h.model_dir(args.model)
    out = args.work / args.suite
    shutil.rmtree(out, ignore_errors=True)
    sentences = h.read_lines(h.corpus(args, "test_2016_flickr", "de"), args.limit)
    refs = h.read_lines(h.corpus(args, "test_2016_flickr", "en"), args.limit)
    src = h.write_lines(out / "src.txt", sentences)
    beams = [int(b) for b in args.beams.split(",")]
    native = {}
    for beam in beams:
        res = h.translate(args.model, src, out / f"native-{beam}.hyp", beam=beam, threads=args.threads)
        native[beam] = (len(sentences) / res["decode_seconds"], h.read_lines(res["output"]))
        figure = f"native attnmt translate, beam {beam}, {args.threads} thread(s)"
        h.record(args, SECTION, figure, "sentences/s", round(native[beam][0], 1), "sentences/s")
        h.record(args, SECTION, figure, "BLEU", round(corpus_scores(native[beam][1], refs)["bleu"], 2), "BLEU")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=CHROMIUM_FLAGS)
        for q in args.quantizations.split(","):
            site = export_web(args.model, out / f"site-{q}", q)
            model_mib, total_mib = size_mib(site)
            h.record(args, SECTION, f"page {q}", "download: model folder", round(model_mib, 1), "MiB")
            h.record(args, SECTION, f"page {q}", "download: whole site", round(total_mib, 1), "MiB")
            for isolated in [name == "coop-coep" for name in args.servers.split(",")]:
                server, url = serve_static(site, isolated)
                for mode in args.modes.split(","):
                    for beam in beams:
                        first, seconds, hyps, threads = page_run(browser, url, sentences, beam, mode, args.page_batch)
                        rate = len(sentences) / seconds
                        same = sum(a == b for a, b in zip(hyps, native[beam][1])) / len(hyps)
                        figure = (f"page {q}, beam {beam}, {'batched' if mode == 'batched' else 'one at a time'}, "
                                  f"{threads} thread(s){' (COOP/COEP)' if isolated else ''}")
                        for column, value, unit in (
                                ("sentences/s", round(rate, 1), "sentences/s"),
                                ("share of native", round(rate / native[beam][0], 3), "share"),
                                ("BLEU", round(corpus_scores(hyps, refs)["bleu"], 2), "BLEU"),
                                ("lines identical to native", round(same, 3), "share"),
                                ("first translation s", round(first, 2), "s")):
                            h.record(args, SECTION, figure, column, value, unit, sentences=len(sentences))
                server.shutdown()
                server.server_close()
        browser.close()
