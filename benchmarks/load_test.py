"""Load test of `attnmt serve` on the loopback interface, and the same sentences offline.

Starts `attnmt serve` on 127.0.0.1 (a free port), waits until /health is ready, then runs
CLIENTS concurrent asyncio clients (httpx), each sending one sentence per request, cycling
through the source file, until SECONDS have passed or MAX_REQUESTS were sent (both bounds
always apply). Reports errors, sentences per second, latency percentiles, the batcher's
mean batch size (from /metrics), and the server's resident memory (VmRSS) once loaded,
after warm-up and at the end. Then `attnmt translate` translates the same sentences
offline, with the same threads, for comparison.

    python benchmarks/load_test.py --model benchmarks/work/m30k --clients 200 --seconds 300 \
        --output benchmarks/work/load_test.json

Library: httpx (async client), asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

DEFAULT_INPUT = (Path(os.environ["ATTNMT_DATA"]) / "multi30k" / "test_2016_flickr.de.gz"
                 if os.environ.get("ATTNMT_DATA") else None)


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.M).group(1)) / 1024


def read_sentences(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def start_server(model: str, threads: int | None, settings: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "attnmt", "-q", "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--threads", str(threads)] if threads else []
    for item in settings:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    sys.exit("the server did not become ready in 300 s")


async def run_clients(url: str, sentences: list[str], clients: int, seconds: float, max_requests: int,
                      on_warm) -> dict:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    samples: list[str] = []
    sent = 0
    started = time.perf_counter()
    deadline = started + seconds
    warm_at = started + min(30.0, seconds / 10)

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal sent, warm_at
        while time.perf_counter() < deadline and sent < max_requests:
            sentence = sentences[sent % len(sentences)]
            sent += 1
            t0 = time.perf_counter()
            try:
                r = await c.post(url + "/v1/translate", json={"text": sentence})
                key = None if r.status_code == 200 else f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                key = type(e).__name__
                if len(samples) < 10:
                    samples.append(f"{time.perf_counter() - started:.1f} s, after {time.perf_counter() - t0:.1f} s: "
                                   f"{key}: {e!r} {e.__cause__!r}")
            if key is None:
                latencies.append(time.perf_counter() - t0)
            else:
                errors[key] = errors.get(key, 0) + 1
            if warm_at and time.perf_counter() >= warm_at:
                warm_at = 0
                on_warm()

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=900) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"requests": sent, "ok": len(latencies), "errors": errors, "error_samples": samples, "seconds": round(elapsed, 1),
            "sentences_per_s": round(len(latencies) / elapsed, 2),
            "latency_p50_s": round(q[49], 3), "latency_p99_s": round(q[98], 3),
            "latency_max_s": round(latencies[-1], 3) if latencies else None}


def batch_stats(url: str) -> dict:
    text = httpx.get(url + "/metrics").text
    value = lambda name: float(re.search(rf"^{name} (\S+)", text, re.M).group(1))  # noqa: E731
    batches = value("attnmt_batches_total")
    return {"batches": int(batches), "mean_batch_sentences": round(value("attnmt_batch_sentences_sum") / batches, 2),
            "mean_queue_s": round(value("attnmt_queue_seconds_sum") / value("attnmt_queue_seconds_count"), 3)}


def offline(model: str, sentences: list[str], threads: int | None, work: Path) -> dict:
    path = work / "offline_input.de"
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    cmd = [sys.executable, "-m", "attnmt", "-q", "translate", "--model", model, "--input", str(path),
           "--output", os.devnull]
    cmd += ["--threads", str(threads)] if threads else []
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - t0
    n = len(sentences)
    return {"command": " ".join(cmd[1:]), "sentences": n, "seconds": round(seconds, 1),
            "sentences_per_s": round(n / seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="source sentences (default test_2016_flickr.de.gz)")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=300.0, help="test length bound")
    ap.add_argument("--max-requests", type=int, default=200_000, help="request count bound")
    ap.add_argument("--threads", type=int, help="torch threads of the server and of the offline run")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a server setting")
    ap.add_argument("--offline-sentences", type=int, help="translate only the first N sentences offline "
                    "(default: all); 0 skips the offline comparison")
    ap.add_argument("--output", type=Path, help="also write the report here (JSON)")
    args = ap.parse_args()
    if args.input is None:
        ap.error("--input FILE, or ATTNMT_DATA naming the directory that holds multi30k/")
    sentences = read_sentences(args.input)
    proc, url = start_server(args.model, args.threads, args.set)
    report = {"clients": args.clients, "input": str(args.input), "server_settings": args.set,
              "threads": args.threads or "torch default", "rss_mib": {"loaded": round(rss_mib(proc.pid), 1)}}
    try:
        warm = lambda: report["rss_mib"].__setitem__("warm", round(rss_mib(proc.pid), 1))  # noqa: E731
        report["load"] = asyncio.run(run_clients(url, sentences, args.clients, args.seconds, args.max_requests, warm))
        report["rss_mib"]["end"] = round(rss_mib(proc.pid), 1)
        report["batching"] = batch_stats(url)
    finally:
        proc.terminate()
        proc.wait(60)
    if args.offline_sentences != 0:
        work = (args.output or Path("load_test.json")).resolve().parent
        report["offline"] = offline(args.model, sentences[:args.offline_sentences], args.threads, work)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
