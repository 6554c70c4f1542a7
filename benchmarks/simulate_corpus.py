"""A simulated corpus of up to 100 million pairs: what opening it, planning an epoch and
reaching the first update cost, per process, in one process and under torchrun x2.

For each size N (default 1M, 10M, 100M pairs) the benchmark writes a prepared directory
(``attnmt.data.shards`` layout and manifest) whose lengths are drawn, pair by pair, from the
(source, target) lengths of Multi30k de-en train as ``attnmt prepare`` encodes it with the
preset's 8k SentencePiece model (prepared once into the work directory; that model is the
simulated corpus's tokenizer). The token files are sparse: their size is that of N real pairs'
ids, but they hold no data on disk (reading them gives id 0, padding), so 100M pairs take the
disk of their lengths and offsets alone; the tensors of a batch have the shapes real text
would give them. Then, each as its own process:

- ``plan``: open the directory (``ShardedCorpus``) and plan epoch 0 (``attnmt.train.data``'s
  buckets, ``attnmt.data.plan.epoch_plan`` and the rank's share), as rank 0 of 1, and as ranks
  0 and 1 of 2 running at once: seconds and peak RSS after opening and after planning;
- ``train``: ``attnmt train`` with ``data.prepared`` for ``--updates`` updates (the preset's
  model, no validation set), one process and ``torchrun --nproc_per_node 2``: wall seconds,
  seconds to the first update (its train record) and each process's peak RSS.

Usage (from the repository root; ATTNMT_DATA or --data-dir holds multi30k/):
    python benchmarks/simulate_corpus.py --sizes 1000000 10000000 100000000

Prints a markdown table and writes WORK/simulate.json. 100M pairs take about 2.4 GB of disk
(lengths 0.8 GB, offsets 1.6 GB; the token files, 5.2 GB apparent, hold nothing) and, to plan,
about 1 GB of memory per process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpora  # noqa: E402  (the process-tree measurements and the preset's configuration)

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8], help="pairs of each simulated corpus")
    p.add_argument("--updates", type=int, default=2, help="updates of each training run")
    p.add_argument("--skip", nargs="*", default=[], choices=["plan", "plan2", "train", "torchrun"],
                   help="measurements to leave out")
    p.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="holds multi30k/ (default $ATTNMT_DATA)")
    p.add_argument("--work", default=str(REPO / "benchmarks" / "work" / "simulate"), help="scratch directory")
    p.add_argument("--plan", nargs=3, metavar=("DIR", "RANK", "WORLD"), help=argparse.SUPPRESS)  # one plan process
    return p.parse_args(argv)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plan_process(directory: str, rank: int, world: int) -> dict:
    """Open ``directory`` and plan epoch 0 as ``rank`` of ``world`` (the preset's batch_tokens
    and seed), as a training process does; seconds and peak RSS (MiB) after each step."""
    from attnmt.data import plan, shards
    from attnmt.memory import tune_allocator

    tune_allocator()  # as the CLI does
    t0 = time.monotonic()
    corpus = shards.ShardedCorpus(directory)
    opened, opened_mib = time.monotonic() - t0, _peak_mib()
    t0 = time.monotonic()
    buckets = plan.Buckets.from_chunks(lambda: ((s + 1, t + 1) for s, t in corpus.length_chunks()))
    share = plan.epoch_plan(buckets, corpus.corpora, 4096, None, 1, 0).share(rank, world)
    del buckets
    return {"rank": rank, "world": world, "pairs": len(corpus), "open_s": round(opened, 2),
            "open_peak_mib": round(opened_mib), "plan_s": round(time.monotonic() - t0, 2),
            "plan_peak_mib": round(_peak_mib()), "batches": share.total,
            "share_mib": round(share.indices.nbytes / 2**20)}


def multi30k_lengths(data_dir: Path, work: Path) -> tuple[Path, np.ndarray]:
    """Multi30k de-en train prepared with the preset (once): its directory and (pairs, 2) lengths."""
    prepared = work / "multi30k"
    if not (prepared / "manifest.json").is_file():
        preset = REPO / "configs" / "multi30k_de_en.yaml"
        subprocess.run([sys.executable, "-m", "attnmt", "-q", "prepare", str(preset), "--output", str(prepared),
                        "--data-dir", str(data_dir)], check=True, cwd=REPO)
    manifest = json.loads((prepared / "manifest.json").read_text())
    lengths = np.concatenate([np.load(prepared / f"{s['name']}.len.npy") for s in manifest["train"]["shards"]])
    return prepared, lengths


def write_simulated(out: Path, pairs: int, lengths: np.ndarray, source: Path) -> dict:
    """A prepared directory of ``pairs`` pairs with lengths drawn from ``lengths`` and sparse
    token files; ``source``'s tokenizer and manifest fields. Returns its manifest."""
    from attnmt.data import prepare, shards

    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((source / "manifest.json").read_text())
    for name in manifest["tokenizers"]:
        (out / name).write_bytes((source / name).read_bytes())
    rng, entries = np.random.default_rng(pairs), []
    for k, start in enumerate(range(0, pairs, shards.SHARD_PAIRS)):
        drawn = lengths[rng.integers(0, len(lengths), min(shards.SHARD_PAIRS, pairs - start))].astype(np.int32)
        name = shards.shard_name("train", k)
        np.save(out / f"{name}.len.npy", drawn)
        for column, side in enumerate(("src", "tgt")):
            offsets = np.zeros(len(drawn) + 1, np.int64)
            np.cumsum(drawn[:, column], out=offsets[1:])
            np.save(out / f"{name}.{side}.idx.npy", offsets)
            with open(out / f"{name}.{side}.bin", "wb") as f:
                f.truncate(int(offsets[-1]) * 2)  # uint16 ids, a hole on disk
        entries.append({"name": name, "pairs": len(drawn), "src_tokens": int(drawn[:, 0].sum()),
                        "tgt_tokens": int(drawn[:, 1].sum())})
    dropped = dict.fromkeys(manifest["train"]["dropped"], 0)
    record = {"path": "simulated", "bytes": 0, "mtime_ns": 0, "sha256": f"{pairs:064x}"}
    manifest["train"] = {"lines": pairs, "pairs": pairs, "dropped": dropped, "shards": entries,
                         "corpora": [{"name": "simulated", "weight": 1, "start": 0, "lines": pairs, "pairs": pairs,
                                      "dropped": dropped, "src": record, "tgt": record}]}
    manifest["valid"] = None
    manifest["fingerprint"] = prepare.fingerprint(manifest)
    shards.write_manifest(out, manifest)
    return manifest


def _disk_mb(directory: Path) -> tuple[float, float]:
    """(bytes the files hold on disk, their apparent size), MB."""
    files = [f.stat() for f in directory.iterdir()]
    return round(sum(s.st_blocks * 512 for s in files) / 1e6, 1), round(sum(s.st_size for s in files) / 1e6, 1)


def measure_size(args, pairs: int, lengths: np.ndarray, source: Path, env: dict) -> dict:
    work = Path(args.work) / f"n{pairs}"
    prepared = work / "prepared"
    t0 = time.monotonic()
    if not (prepared / "manifest.json").is_file():
        write_simulated(prepared, pairs, lengths, source)
    row: dict = {"pairs": pairs, "write_s": round(time.monotonic() - t0, 1)}
    row["disk_mb"], row["apparent_mb"] = _disk_mb(prepared)
    me = [sys.executable, str(Path(__file__).resolve()), "--plan", str(prepared)]
    if "plan" not in args.skip:
        row["plan"] = [json.loads(subprocess.run(me + ["0", "1"], check=True, capture_output=True, text=True,
                                                 env=env).stdout)]
    if "plan2" not in args.skip:  # two ranks planning at once
        procs = [subprocess.Popen(me + [str(r), "2"], stdout=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
        row["plan2"] = [json.loads(p.communicate()[0]) for p in procs]
    config = corpora.write_config(work / "prepared.yaml", {"prepared": str(prepared)}, None, args.updates)
    runs = {"train": corpora.attnmt("train", str(config), "--output"),
            "torchrun": ["nice", "-n", "5", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                         "-m", "attnmt", "train", str(config), "--output"]}
    for name, cmd in runs.items():
        if name in args.skip:
            continue
        run_dir = work / f"run_{name}"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        run_env = dict(env, OMP_NUM_THREADS="1") if name == "torchrun" else env
        row[name] = dict(corpora.measured(cmd + [str(run_dir)], run_env, work / f"{name}.log"),
                         first_update_s=corpora.first_update_seconds(run_dir))
    return row


def table(rows: list[dict]) -> str:
    lines = ["| pairs | disk MB (apparent) | what | open s | open peak MiB | plan s | plan peak MiB | "
             "first update s | wall s | peak RSS MiB |", "|" + " --- |" * 10]
    for r in rows:
        size = f"{r['pairs']:,} | {r['disk_mb']} ({r['apparent_mb']})"
        for name in ("plan", "plan2"):
            for p in r.get(name, []):
                lines.append(f"| {size} | plan, rank {p['rank']} of {p['world']} | {p['open_s']} | "
                             f"{p['open_peak_mib']} | {p['plan_s']} | {p['plan_peak_mib']} | - | - | - |")
        for name in ("train", "torchrun"):
            if name in r:
                m = r[name]
                lines.append(f"| {size} | {name} | - | - | - | - | {m['first_update_s']} | {m['seconds']} | "
                             f"{' / '.join(map(str, m['rss_mib'][:2 if name == 'torchrun' else 1]))} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plan:
        print(json.dumps(plan_process(args.plan[0], int(args.plan[1]), int(args.plan[2]))))
        return 0
    if not args.data_dir:
        raise SystemExit("set ATTNMT_DATA or --data-dir (a directory holding multi30k/)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source, lengths = multi30k_lengths(Path(args.data_dir), work)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO / "src"))
    rows = []
    for pairs in map(int, args.sizes):
        rows.append(dict(measure_size(args, pairs, lengths, source, env), load=round(os.getloadavg()[0], 2)))
        print(json.dumps(rows[-1]), flush=True)
    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "rows": rows}
    (work / "simulate.json").write_text(json.dumps(result, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
