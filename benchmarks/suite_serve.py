"""serve: ``attnmt serve`` on 127.0.0.1 under concurrent clients, against offline ``attnmt translate``.

The server (``--engine``, ``--threads``, ``--set`` settings) starts on a free port; after
``/health`` answers, ``--clients`` clients send one test_2016_flickr sentence per request for
``--seconds`` seconds after a warm-up. ``--driver httpx``: asyncio httpx clients in this process;
``--driver wrk``: wrk (C, 2 threads, ``wrk_translate.lua``) keeps the connections busy. Recorded:
sentences/s, errors, p50/p99 latency, the batcher's mean batch (from ``/metrics``), the server
tree's resident memory once loaded, after warm-up, at the end and at its peak; and offline
``attnmt translate`` of the same sentences with the same engine and threads, before and after the
server (the server's rate as a share of their mean).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness as h

PARTS = {"httpx": ["--driver", "httpx"], "wrk": ["--driver", "wrk"]}
SMOKE = {"model": h.smoke_model, "clients": 4, "seconds": 2, "warmup": 1, "limit": 20}
MODELS = ("model",)
SECTION = "Serving under load"


def add_arguments(p) -> None:
    p.add_argument("--driver", choices=("httpx", "wrk"), default="httpx")
    p.add_argument("--model", type=Path, help="model directory (an export for ctranslate2 / onnxruntime)")
    p.add_argument("--engine", default="native", choices=("native", "ctranslate2", "onnxruntime"))
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the measured part")
    p.add_argument("--threads", type=int, default=1, help="engine threads of the server and the offline runs")
    p.add_argument("--limit", type=int, help="only the first N sentences")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a server setting")


def start_server(model, threads: int | None, settings: list[str], engine: str = "native") -> tuple[subprocess.Popen, str]:
    """``attnmt serve`` on a free port of 127.0.0.1, once ``/health`` answers: the process and its URL."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = h.attnmt("-q", "serve", "--model", model, "--engine", engine, "--host", "127.0.0.1", "--port", port)
    cmd += ["--threads", str(threads)] if threads else []
    for item in settings:
        cmd += ["--set", item]
    proc, url = subprocess.Popen(cmd), f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    sys.exit("the server did not become ready")


async def httpx_load(url: str, sentences: list[str], clients: int, seconds: float) -> dict:
    """``clients`` asyncio httpx clients for ``seconds``: requests, errors, latencies."""
    import httpx

    latencies: list[float] = []
    errors, sent, deadline = 0, 0, time.perf_counter() + seconds

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal sent, errors
        while time.perf_counter() < deadline:
            sentence, t0 = sentences[sent % len(sentences)], time.perf_counter()
            sent += 1
            try:
                ok = (await c.post(url + "/v1/translate", json={"text": sentence})).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=900) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    q = statistics.quantiles(sorted(latencies), n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"requests": sent, "errors": errors, "seconds": time.perf_counter() - started, "ok": len(latencies),
            "p50_s": q[49], "p99_s": q[98]}


def wrk_load(url: str, bodies: Path, clients: int, seconds: float) -> dict:
    """wrk with ``wrk_translate.lua`` for ``seconds``: its JSON summary line."""
    cmd = ["wrk", "-t2", f"-c{clients}", "--timeout", "60s", "-s", str(h.HERE / "wrk_translate.lua"),
           f"-d{int(seconds)}s", url, "--", str(bodies)]
    r = json.loads(h.run(cmd).output.strip().splitlines()[-1])
    return {"requests": r["requests"], "errors": r["non_2xx"], "seconds": r["seconds"],
            "ok": r["requests"] - r["non_2xx"], "p50_s": r["p50_ms"] / 1000, "p99_s": r["p99_ms"] / 1000}


def run(args) -> None:
    import httpx

    h.model_dir(args.model)
    out = args.work / args.suite
    sentences = [s for s in h.read_lines(h.corpus(args, "test_2016_flickr", "de"), args.limit) if s.strip()]
    plain = h.write_lines(out / "input.de", sentences)
    bodies = h.write_lines(out / "bodies.jsonl", [json.dumps({"text": s}) for s in sentences])
    engine = None if args.engine == "native" else args.engine
    offline = [h.translate(args.model, plain, out / "offline.hyp", threads=args.threads, engine=engine)]
    proc, url = start_server(args.model, args.threads, args.set, args.engine)
    try:
        with h.PeakRSS(proc.pid) as rss:
            time.sleep(0.5)
            loaded = rss.current
            load = (lambda s: asyncio.run(httpx_load(url, sentences, args.clients, s))) if args.driver == "httpx" \
                else (lambda s: wrk_load(url, bodies, args.clients, s))
            load(args.warmup)
            warm, load_avg = rss.current, os.getloadavg()[0]
            result = load(args.seconds)
            end = rss.current
        metrics = httpx.get(url + "/metrics").text
    finally:
        proc.terminate()
        proc.wait(60)
    offline.append(h.translate(args.model, plain, out / "offline.hyp", threads=args.threads, engine=engine))
    metric = {name: float(re.search(rf"^{name} (\S+)", metrics, re.M).group(1))
              for name in ("attnmt_batch_sentences_sum", "attnmt_batches_total")}
    rate = result["ok"] / result["seconds"]
    offline_rates = [len(sentences) / o["decode_seconds"] for o in offline]
    mib = 2**20
    figures = {"requests": (result["requests"], "requests"), "errors": (result["errors"], "requests"),
               "sentences/s": (round(rate, 1), "sentences/s"), "p50 latency": (round(result["p50_s"], 3), "s"),
               "p99 latency": (round(result["p99_s"], 3), "s"),
               "mean batch": (round(metric["attnmt_batch_sentences_sum"] / max(metric["attnmt_batches_total"], 1), 1),
                              "sentences"),
               "RSS loaded": (round(loaded / mib), "MiB"), "RSS after warm-up": (round(warm / mib), "MiB"),
               "RSS at the end": (round(end / mib), "MiB"), "peak RSS": (round(rss.peak / mib), "MiB"),
               "offline attnmt translate before": (round(offline_rates[0], 1), "sentences/s"),
               "offline attnmt translate after": (round(offline_rates[-1], 1), "sentences/s"),
               "server against offline mean": (round(rate / statistics.mean(offline_rates), 3), "share")}
    figure = f"{args.engine} engine ({args.driver}, {args.clients} clients)"
    for column, (value, unit) in figures.items():
        h.record(args, SECTION, figure, column, value, unit, load_before=load_avg, threads=args.threads,
                 sentences=len(sentences))
