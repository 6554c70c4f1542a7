"""`attnmt serve` under 200 concurrent clients driven by wrk (C), against offline `attnmt
translate` with the same engine and model, side by side in one run.

Order: offline, server, offline again (the machine may be shared: both offline runs are
reported and the server is compared with their mean). The server runs `attnmt serve --engine
ENGINE` on 127.0.0.1 (a free port); wrk (Debian's `wrk`, 2 threads) keeps CLIENTS connections
busy for SECONDS with one sentence per request (benchmarks/wrk_translate.lua, bodies cycling
through the test set) after a warm-up. Reports sentences/s of each, the server's share of the
offline rate, wrk's latency percentiles, the server's peak resident memory (VmHWM), the
batcher's mean batch size, and the load average before each part.

    python benchmarks/serve_wrk.py --engine ctranslate2 --model CT2_INT8_DIR --clients 200 --seconds 60

Library: wrk (load generator), httpx (health and metrics).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def _sentences(path: Path, limit: int | None) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:limit]


def _status_kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


def offline(args, sentences_file: Path, n: int) -> dict:
    cmd = [sys.executable, "-m", "attnmt", "translate", "--engine", args.engine, "--model", args.model,
           "--input", str(sentences_file), "--output", os.devnull, "--threads", str(args.threads)]
    load = os.getloadavg()[0]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    seconds = float(re.search(r"translated \d+ lines in ([\d.]+) s", p.stderr).group(1))
    return {"sentences": n, "decode_s": seconds, "sentences_per_s": round(n / seconds, 1), "load_before": load}


def serve(args, bodies: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "attnmt", "-q", "serve", "--engine", args.engine, "--model", args.model,
           "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads)]
    for item in args.set:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("the server did not start")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        wrk = ["wrk", "-t2", f"-c{args.clients}", "--timeout", "60s", "-s", str(HERE / "wrk_translate.lua")]
        subprocess.run(wrk + ["-d5s", url, "--", str(bodies)], capture_output=True, check=True)  # warm-up
        load = os.getloadavg()[0]
        out = subprocess.run(wrk + [f"-d{args.seconds}s", url, "--", str(bodies)], capture_output=True, text=True,
                             check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        metrics = httpx.get(url + "/metrics").text
        value = lambda name: float(re.search(rf"^{name} (\S+)", metrics, re.M).group(1))  # noqa: E731
        result.update(sentences_per_s=round((result["requests"] - result["non_2xx"]) / result["seconds"], 1),
                      peak_rss_mib=round(_status_kib(proc.pid, "VmHWM") / 1024),
                      mean_batch_sentences=round(value("attnmt_batch_sentences_sum") / value("attnmt_batches_total"), 1),
                      load_before=load, command=" ".join(["attnmt"] + cmd[3:]))
        return result
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (an export for ctranslate2 / onnxruntime)")
    ap.add_argument("--engine", default="ctranslate2", choices=["native", "ctranslate2", "onnxruntime"])
    ap.add_argument("--input", type=Path, help="source sentences (default $ATTNMT_DATA/multi30k/test_2016_flickr.de.gz)")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2, help="engine threads of the server and the offline run")
    ap.add_argument("--limit", type=int, help="use only the first N sentences")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a server setting")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "serve_wrk")
    args = ap.parse_args()
    src = args.input or Path(os.environ["ATTNMT_DATA"]) / "multi30k" / "test_2016_flickr.de.gz"
    sentences = _sentences(src, args.limit)
    args.work.mkdir(parents=True, exist_ok=True)
    plain, bodies = args.work / "input.de", args.work / "bodies.jsonl"
    plain.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    bodies.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences), encoding="utf-8")
    first = offline(args, plain, len(sentences))
    server = serve(args, bodies)
    second = offline(args, plain, len(sentences))
    rate = (first["sentences_per_s"] + second["sentences_per_s"]) / 2
    report = {"engine": args.engine, "model": args.model, "clients": args.clients, "server": server,
              "offline": [first, second], "server_share_of_offline": round(server["sentences_per_s"] / rate, 3)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
