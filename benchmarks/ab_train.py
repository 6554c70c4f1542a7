#!/usr/bin/env python3
"""Did a change move attnmt's training speed or memory? The working tree against a git revision.

Trains the suite's attnmt setting (benchmarks/configs/attnmt.yaml: Multi30k de->en, d_model 256,
3+3 layers, joint SentencePiece unigram 8000, 4096-token batches) for ``--updates`` updates,
once with the code of ``--base`` (a git revision, checked out as a worktree under
``benchmarks/work/ab/``) and once with the working tree, alternating ``--rounds`` times in fresh
``attnmt train`` processes, and prints for each run: target tokens/s (the suite's measure:
logged windows after the first), peak RSS of the process tree (GiB, sampled every 0.1 s as the
suite does), and the validation perplexity at the end (equal for a change that keeps the math).

    .venv/bin/python benchmarks/ab_train.py --base HEAD~1 --updates 150 --precision fp32

On a CPU without bfloat16 kernels, ``--emulate-bf16`` trains in bf16 autocast with the matmuls
computed in float32 (``benchmarks/bf16_emulation.py``): its peak RSS compares two revisions'
bf16 memory, but lacks oneDNN's own (by how much: the record in RESULTS.md), and its speed is
not bf16's.

Not part of the suite (it does not touch RESULTS.md): it is the before/after check for one
change; figures worth keeping go to the hand-kept record at the end of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from measure import run  # noqa: E402  (the suite's process runner: wall seconds and peak RSS)
from setting import fill_template, plain_splits  # noqa: E402  (its config templates and data)
from training import combine_windows  # noqa: E402  (its throughput measure)

LOG_EVERY = 25
# attnmt's allocator settings, from attnmt.memory (attnmt.runtime in revisions before it)
TUNE_ALLOCATOR = ("try:\n    from attnmt.memory import tune_allocator\n"
                  "except ModuleNotFoundError:\n    from attnmt.runtime import tune_allocator")


def worktree(rev: str, work: Path) -> tuple[str, Path]:
    """A checkout of ``rev`` under ``work`` (made once per commit)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = work / f"base-{sha}"
    if not (path / "src" / "attnmt").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(path), sha], check=True)
    return sha, path


def add_ab_arguments(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options every before/after check has: --base, --rounds, --threads."""
    ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=2)


def ab_runs(base: str, rounds: int, work: Path):
    """The runs of a before/after check, in order: (round, label, folder to put on PYTHONPATH)
    for the code of ``base`` (a worktree under ``work``) and the working tree, alternating which
    goes first from one round to the next."""
    sha, base_tree = worktree(base, work)
    trees = {f"base {sha}": base_tree / "src", "working tree": ROOT / "src"}
    for rnd in range(rounds):
        for label in list(trees) if rnd % 2 == 0 else list(trees)[::-1]:
            yield rnd, label, trees[label]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ab_arguments(ap, rounds=2)
    ap.add_argument("--updates", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=200, help="learning-rate warmup steps, as in the suite")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--emulate-bf16", action="store_true",
                    help="bf16 with float32 matmuls (benchmarks/bf16_emulation.py): memory comparisons only")
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"),
                    help="folder holding multi30k/{train,val}.{de,en}.gz (default $ATTNMT_DATA)")
    args = ap.parse_args()
    if args.emulate_bf16:
        args.precision = "bf16"
    work = HERE / "work" / "ab"
    data = work / "data"
    plain_splits(Path(args.data_dir) / "multi30k", data, ("train", "val"))
    cfg = work / f"attnmt-{args.precision}-{args.updates}.yaml"
    cfg.write_text(fill_template("attnmt.yaml", data=data, updates=args.updates, warmup=args.warmup,
                                 precision=args.precision, threads=args.threads, log_every=LOG_EVERY,
                                 decode_batch=128), encoding="utf-8")
    print(f"{'code':<14} {'round':>5} {'tgt tok/s':>9} {'peak RSS GiB':>12} {'valid ppl':>9}", flush=True)
    for rnd, label, src in ab_runs(args.base, args.rounds, work):
        out = work / "runs" / f"{label.split()[0]}-{rnd}"
        shutil.rmtree(out, ignore_errors=True)
        train_args = ["train", str(cfg), "--output", str(out)]
        if args.emulate_bf16:  # the allocator settings, the override, then the CLI
            cmd = [sys.executable, "-c", f"import sys\n{TUNE_ALLOCATOR}\ntune_allocator()\n"
                   "import bf16_emulation; from attnmt.cli import main; "
                   f"sys.exit(main({train_args!r}))"]
        else:
            cmd = [sys.executable, "-m", "attnmt", *train_args]
        path = [str(src), str(HERE)] if args.emulate_bf16 else [str(src)]
        p = run(cmd, out.with_suffix(".log"), env={"PYTHONPATH": os.pathsep.join(path)})
        records = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
        rate = combine_windows([(r["step"], r["tgt_tokens_per_s"]) for r in records if r["kind"] == "train"],
                               LOG_EVERY)
        valid = [r["valid_ppl"] for r in records if r["kind"] == "valid"]
        print(f"{label:<14} {rnd + 1:>5} {rate:>9,.0f} {p.peak_rss / 2**30:>12.2f} {valid[-1]:>9.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
