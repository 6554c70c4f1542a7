"""The exported web page (``attnmt export web``) in headless Chromium against native ``attnmt
translate``, on the same test_2016_flickr sentences, in one run.

Measured:
- download size: what a first visit fetches (page, module, ONNX Runtime Web's WebAssembly, the
  model folder), float32 and int8 exports;
- time to first translation: a fresh browser context (empty cache) from navigation to the first
  sentence translated (greedy), the page served by a local static server (``python -m
  http.server`` with or without the COOP/COEP headers);
- sentences/s, greedy and beam 5, the page's two ways of translating: ``one at a time``
  (``window.attnmt.translate`` per sentence, as a visitor types them) and ``batched``
  (``window.attnmt.translateBatch``: ``--page-batch`` sentences searched together, one session run
  per step for all their hypotheses, as native batches them); native ``attnmt translate`` with its
  configured batch size (its own log line's decode seconds). The page's time is the wall time of
  the call seen from the page, its worker's tokenization and search included;
- "of native": the page's sentences/s over native's at the same beam (issue 39 asks >= 50% at
  beam 5 on one thread: the plain server, no COOP/COEP, against native ``--threads 1``);
- BLEU (sacreBLEU) of the page's output and of native's, at the same settings, and the share of
  lines identical to native's.

Both follow the model's decode section (length penalty, length limits, stopping rule). Prints a
Markdown table and one JSON object.

Usage (from the repository root, with a model directory trained on Multi30k de-en and the page
built: npm ci && npm run build in src/attnmt/web):
    .venv/bin/python benchmarks/web.py --model runs/de-en --data "$ATTNMT_DATA"
    # the issue 39 figure only: beam 5, float32, one thread, batched page against native
    .venv/bin/python benchmarks/web.py --model runs/de-en --data "$ATTNMT_DATA" --beams 5 \
        --quantizations float32 --servers plain --modes batched
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from attnmt.evaluate import corpus_scores  # noqa: E402
from attnmt.interop.web import export_web  # noqa: E402
from attnmt.rundir import read_config  # noqa: E402
from benchmarks.presets import machine  # noqa: E402

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


class _Handler(http.server.SimpleHTTPRequestHandler):
    isolated = False

    def end_headers(self):
        if self.isolated:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


def _serve(root: Path, isolated: bool) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = type("Handler", (_Handler,), {"isolated": isolated})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_port}/"


def _size_mib(site: Path) -> tuple[float, float]:
    """(model folder, everything) in MiB."""
    model = sum(p.stat().st_size for p in (site / "model").rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    return model / 2**20, total / 2**20


def _page_run(browser, url: str, sentences: list[str], beam: int, mode: str, page_batch: int
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


def _native(model: Path, src: Path, beam: int, threads: int) -> tuple[float, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.txt"
        p = subprocess.run([sys.executable, "-m", "attnmt", "translate", "--model", str(model), "--input", str(src),
                            "--output", str(out), "--beam-size", str(beam), "--threads", str(threads)],
                           capture_output=True, text=True, check=True)
        seconds = float(re.search(r"translated \d+ lines in ([\d.]+) s", p.stderr).group(1))
        return seconds, out.read_text(encoding="utf-8").splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path, help="the folder holding multi30k/")
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--limit", type=int, default=None, help="first N sentences only")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work" / "web")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--quantizations", default="float32,int8", help="exports to measure, comma-separated")
    ap.add_argument("--servers", default="plain,coop-coep", help="plain: no headers (one thread); coop-coep: "
                    "cross-origin isolated (threads)")
    ap.add_argument("--threads", type=int, default=1, help="native attnmt translate's threads (the page: 1, or "
                    "up to 4 with the COOP/COEP headers)")
    ap.add_argument("--beams", default="1,5", help="beam sizes, comma-separated (1: greedy)")
    ap.add_argument("--modes", default="one,batched", help="the page's ways: 'one' sentence per call, 'batched' "
                    "(translateBatch), comma-separated")
    ap.add_argument("--page-batch", type=int, default=32, help="sentences the batched page searches together")
    args = ap.parse_args()
    beams = [int(b) for b in args.beams.split(",") if b.strip().isdigit() and int(b) > 0]
    if len(beams) != len(args.beams.split(",")):
        ap.error(f"--beams {args.beams}: beam sizes are positive integers, comma-separated")
    if not set(args.modes.split(",")) <= {"one", "batched"}:
        ap.error(f"--modes {args.modes}: the modes are 'one' and 'batched'")
    from playwright.sync_api import sync_playwright

    with gzip.open(args.data / "multi30k" / f"{args.split}.de.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[: args.limit]
    with gzip.open(args.data / "multi30k" / f"{args.split}.en.gz", "rt", encoding="utf-8") as f:
        refs = f.read().splitlines()[: args.limit]
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    src = args.work / "src.txt"
    src.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    sites = {q: export_web(args.model, args.work / f"site-{q}", q) for q in args.quantizations.split(",")}

    rows, native = [], {}
    for beam in beams:
        seconds, out = _native(args.model, src, beam, args.threads)
        native[beam] = (len(sentences) / seconds, out)
        rows.append({"what": f"native attnmt translate, {args.threads} thread{'s' if args.threads > 1 else ''}",
                     "beam": beam, "sent_per_s": len(sentences) / seconds, "bleu": corpus_scores(out, refs)["bleu"]})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=CHROMIUM_FLAGS)
        for q, site in sites.items():
            model_mib, total_mib = _size_mib(site)
            for isolated in [name == "coop-coep" for name in args.servers.split(",")]:
                server, url = _serve(site, isolated)
                for mode in args.modes.split(","):
                    for beam in beams:
                        first, seconds, out, threads = _page_run(browser, url, sentences, beam, mode, args.page_batch)
                        native_speed, native_out = native[beam]
                        rows.append({"what": f"page {q}, {mode if mode == 'batched' else 'one at a time'}"
                                     + (f" ({args.page_batch})" if mode == "batched" else "")
                                     + f", {threads} thread{'s' if threads > 1 else ''}"
                                     + (" (COOP/COEP)" if isolated else ""), "beam": beam,
                                     "sent_per_s": len(sentences) / seconds, "of_native": len(sentences) / seconds
                                     / native_speed, "bleu": corpus_scores(out, refs)["bleu"],
                                     "same_as_native": sum(a == b for a, b in zip(out, native_out)) / len(out),
                                     "first_s": first, "model_mib": model_mib, "download_mib": total_mib})
                server.shutdown()
                server.server_close()
        browser.close()
    cpu = machine()
    print(f"{len(sentences)} sentences of {args.split}, {cpu}\n")
    print("| what | beam | sentences/s | of native | BLEU | same as native | first translation (s) | model MiB | "
          "download MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['what']} | {r['beam']} | {r['sent_per_s']:.1f} | {r.get('of_native', 1.0):.0%} | {r['bleu']:.2f} | "
              f"{r.get('same_as_native', 1.0):.1%} | {r.get('first_s', float('nan')):.2f} | "
              f"{r.get('model_mib', float('nan')):.1f} | {r.get('download_mib', float('nan')):.1f} |")
    decode = read_config(args.model).decode
    print(json.dumps({"sentences": len(sentences), "split": args.split, "machine": cpu, "page_batch": args.page_batch,
                      "decode": decode.model_dump(mode="json"), "rows": rows}))


if __name__ == "__main__":
    main()
