#!/usr/bin/env python3
"""Did a change move attnmt's translation speed? The working tree against a git revision.

Translates test_2016_flickr de->en (1000 sentences, raw text) with beam 5 and a batch of 128
sentences, as the suite does, once with the code of ``--base`` (a git revision, checked out as
a worktree under ``benchmarks/work/ab/`` by ab_train.py's helper) and once with the working
tree, alternating ``--rounds`` times in fresh ``attnmt evaluate`` processes, and prints for each
run: decode seconds (as attnmt reports them: search, without loading), sacreBLEU (equal for a
change that keeps the search exact) and the peak RSS of the process tree.

    .venv/bin/python benchmarks/ab_translate.py --model benchmarks/work/ab/runs/working-0 --base HEAD

``--model`` is any model directory of ``attnmt train``; ``benchmarks/ab_train.py --updates 300``
leaves one under benchmarks/work/ab/runs/. Not part of the suite (it does not touch
RESULTS.md): it is the before/after check for one change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ab_train import ab_runs, add_ab_arguments  # noqa: E402  (the before/after helpers)
from measure import run  # noqa: E402  (the suite's process runner: wall seconds and peak RSS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model directory written by 'attnmt train'")
    add_ab_arguments(ap, rounds=3)
    ap.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"),
                    help="folder holding multi30k/test_2016_flickr.{de,en}.gz (default $ATTNMT_DATA)")
    args = ap.parse_args()
    work = HERE / "work" / "ab"
    test = Path(args.data_dir) / "multi30k" / "test_2016_flickr"
    seconds: dict[str, list[float]] = {}  # label -> decode seconds of each round, base first
    print(f"{'code':<14} {'round':>5} {'decode s':>8} {'BLEU':>6} {'peak RSS GiB':>12}", flush=True)
    for rnd, label, src in ab_runs(args.base, args.rounds, work):
        log = work / "translate" / f"{label.split()[0]}-{rnd}.log"
        p = run([sys.executable, "-m", "attnmt", "-q", "evaluate", "--model", args.model,
                 "--src", f"{test}.de.gz", "--ref", f"{test}.en.gz", "--beam-size", "5",
                 "--batch-size", str(args.batch_size), "--threads", str(args.threads),
                 "--precision", args.precision, "--json"], log, env={"PYTHONPATH": str(src)}, capture_stdout=True)
        scores = json.loads(p.stdout.strip().splitlines()[-1])
        seconds.setdefault(label, []).append(scores["decode_seconds"])
        print(f"{label:<14} {rnd + 1:>5} {scores['decode_seconds']:>8.2f} {scores['bleu']:>6.2f} "
              f"{p.peak_rss / 2**30:>12.2f}", flush=True)
    (base, base_s), (_, new_s) = seconds.items()
    print(f"median decode s: {base} {statistics.median(base_s):.2f}, working tree {statistics.median(new_s):.2f} "
          f"(ratio {statistics.median(new_s) / statistics.median(base_s):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
