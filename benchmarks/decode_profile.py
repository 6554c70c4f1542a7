"""Where a native beam search's time goes: matrix products against everything else.

A beam search of test_2016_flickr de->en (repeated ``--repeat`` times) through
``Translator.translate_ids`` on ``--threads`` threads, with the model's decode settings and
batches of 128, timed plainly (after one warm-up batch), then once more under
``torch.profiler``: the self seconds of ``aten::addmm`` and ``aten::mm`` (products with weight
matrices: the projections, the feed-forward layers, the output layer), of ``aten::bmm`` (the
attention products) and of the ``--top`` other most costly operators. Also the seconds a fresh
``python -c "import torch, attnmt.cli"`` takes, the start-up every ``attnmt translate`` process
pays before it translates.

Why (issue 39): to say how fast the rest of the search would have to be for a given target time,
e.g. CTranslate2's own time on the same export (``benchmarks/stopping.py``). Prints a Markdown
table and one JSON object; figures go to RESULTS.md only from an otherwise idle machine.

Usage (from the repository root):
    .venv/bin/python benchmarks/decode_profile.py --model runs/de-en --data "$ATTNMT_DATA" --threads 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.presets import machine  # noqa: E402

WEIGHT_PRODUCTS = ("aten::addmm", "aten::mm")
ATTENTION_PRODUCTS = ("aten::bmm",)


def profile_search(model: Path, data: Path, beam: int | None = None, threads: int = 1, repeat: int = 1,
                   top: int = 8) -> dict:
    """The plain and profiled seconds of a native beam search of test_2016_flickr (x ``repeat``),
    the self seconds of its weight and attention products, and the ``top`` other operators."""
    from attnmt.decode.translator import Translator

    torch.set_num_threads(threads)
    translator = Translator.from_dir(model)
    with gzip.open(data / "multi30k/test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ids = translator.encode_sources(f.read().splitlines() * repeat)
    options = translator.options(beam_size=beam)
    translator.translate_ids(ids[:128], options, batch_size=128)  # warm-up
    t = time.perf_counter()
    translator.translate_ids(ids, options, batch_size=128)
    plain = time.perf_counter() - t
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        translator.translate_ids(ids, options, batch_size=128)
    profiled = time.perf_counter() - t
    self_s = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    others = sorted((k for k in self_s if k not in WEIGHT_PRODUCTS + ATTENTION_PRODUCTS), key=lambda k: -self_s[k])
    return {"sentences": len(ids), "beam": options.beam_size, "early_stopping": options.early_stopping,
            "threads": threads, "seconds": plain, "profiled_seconds": profiled,
            "weight_matmul_seconds": sum(self_s.get(k, 0.0) for k in WEIGHT_PRODUCTS),
            "attention_matmul_seconds": sum(self_s.get(k, 0.0) for k in ATTENTION_PRODUCTS),
            "operators_seconds": sum(self_s.values()), "top_others": {k: self_s[k] for k in others[:top]}}


def fastest(fn, runs: int = 1, rounds: int = 3, warmup: int = 0) -> float:
    """Seconds per call of ``fn``: the fastest of ``rounds`` rounds of ``runs`` calls, after
    ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - t) / runs)
    return best


def startup_seconds(rounds: int = 3) -> float:
    """The fastest of ``rounds`` fresh interpreters importing torch and attnmt's command line."""
    return fastest(lambda: subprocess.run([sys.executable, "-c", "import torch, attnmt.cli"], check=True),
                   rounds=rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a de-en model directory")
    ap.add_argument("--data", type=Path, required=True, help="the directory holding multi30k/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, help="beam size (default: the model's)")
    ap.add_argument("--repeat", type=int, default=1, help="test2016 repeated this many times")
    ap.add_argument("--top", type=int, default=8, help="other operators listed")
    args = ap.parse_args()
    res = profile_search(args.model, args.data, args.beam, args.threads, args.repeat, args.top)
    res["startup_seconds"] = startup_seconds()
    res["machine"] = machine()
    s = res["seconds"]
    print(f"native beam {res['beam']} (early stopping {res['early_stopping']}), {res['sentences']} sentences, "
          f"{args.threads} thread(s), {res['machine']}\n")
    print("| part | seconds | share of the plain search |")
    print("| --- | ---: | ---: |")
    print(f"| plain search (profiled: {res['profiled_seconds']:.2f}) | {s:.2f} | 100% |")
    for name, key in (("products with weights (addmm, mm)", "weight_matmul_seconds"),
                      ("attention products (bmm)", "attention_matmul_seconds")):
        print(f"| {name} | {res[key]:.2f} | {res[key] / s:.0%} |")
    rest = s - res["weight_matmul_seconds"] - res["attention_matmul_seconds"]
    print(f"| everything else (plain search minus the products) | {rest:.2f} | {rest / s:.0%} |")
    for k, v in res["top_others"].items():
        print(f"| of which {k} | {v:.2f} | {v / s:.0%} |")
    print(f"| start-up of a process (`import torch, attnmt.cli`) | {res['startup_seconds']:.2f} | - |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
