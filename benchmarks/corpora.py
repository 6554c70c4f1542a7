"""Large corpora: ``attnmt prepare`` and ``attnmt train`` on K shuffled copies of Multi30k train.

For each K (default 1, 10, 100; K=100 is 2.9M pairs), the benchmark writes a synthetic corpus
into its work directory (gzip, K copies of Multi30k train, each copy's pairs shuffled; never
committed), then measures, each as a separate process whose whole process tree is sampled
every 0.1 s from /proc:

- ``prepare``: ``attnmt prepare CONFIG --output DIR --workers W``: wall seconds, pairs per
  second (input pairs / wall, start-up and SentencePiece training included), the tree's peak
  memory (summed PSS: forked workers share pages with their parent, which RSS would count
  twice; and the largest single RSS), and disk per million pairs; beside it, what SentencePiece
  alone encodes per second on one core with the same model (:func:`encoding_ceiling`: no
  preparation on W cores passes W times it);
- ``train (prepared)``: ``attnmt train`` with ``data.prepared: DIR`` for 2 updates (d_model 256,
  3+3 layers, the 8k vocabulary of the prepared directory, no validation set): wall seconds
  from start to exit, seconds to the first update (the first train record), peak RSS;
- ``train (prepared, same updates)``: the same with ``train.accum_steps=2``: the updates that
  torchrun x2 makes, from the same batches (the workers share them out), in one process;
- ``train (prepared, torchrun x2)``: the same under ``torchrun --nproc_per_node 2``: each
  worker's peak RSS. These three are run ``--repeats`` times and their medians reported. A
  process's peak depends on the shapes of the batches it has met (by tens of MiB): the single
  process of ``train (prepared)`` meets other batches than each worker, the one of the same
  updates meets all of the workers' batches;
- ``train (text)``: ``attnmt train`` from the text files, with this checkout and, with
  ``--base-src``, with another checkout's ``src`` (the code before prepared corpora: it reads
  and encodes the text in memory at every start).

Usage (from the repository root; ATTNMT_DATA or --data-dir holds multi30k/):
    python benchmarks/corpora.py --ks 1 10 100 --base-src ../base-checkout/src

Prints a markdown table and writes WORK/corpora.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 10, 100], help="copies of Multi30k train")
    p.add_argument("--workers", type=int, default=2, help="attnmt prepare --workers")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="tokenizer.max_sentences (default: the configuration's default)")
    p.add_argument("--base-src", help="src/ of a checkout to measure the text path with, as it was")
    p.add_argument("--updates", type=int, default=2, help="updates of each training run")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of the train-from-prepared and torchrun measurements (their peak RSS depends on "
                        "which batches a process gets and varies by some 30 MiB): the median is reported")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["prepare", "prepared", "prepared_same", "torchrun", "text", "base"],
                   help="measurements to leave out")
    p.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="holds multi30k/ (default $ATTNMT_DATA)")
    p.add_argument("--work", default=str(REPO / "benchmarks" / "work" / "corpora"), help="scratch directory")
    return p.parse_args(argv)


def write_corpus(data_dir: Path, k: int, out: Path) -> tuple[Path, Path, int]:
    """K copies of Multi30k train de-en, each shuffled with its own seed, gzip (level 1)."""
    src = gzip.decompress((data_dir / "multi30k" / "train.de.gz").read_bytes()).decode().splitlines()
    tgt = gzip.decompress((data_dir / "multi30k" / "train.en.gz").read_bytes()).decode().splitlines()
    paths = out / "train.de.gz", out / "train.en.gz"
    if not all(p.is_file() for p in paths):
        out.mkdir(parents=True, exist_ok=True)
        with gzip.open(paths[0], "wt", compresslevel=1) as fs, gzip.open(paths[1], "wt", compresslevel=1) as ft:
            for copy in range(k):
                order = list(range(len(src)))
                random.Random(copy).shuffle(order)
                fs.write("".join(src[i] + "\n" for i in order))
                ft.write("".join(tgt[i] + "\n" for i in order))
    return paths[0], paths[1], k * len(src)


def write_config(path: Path, data: dict, max_sentences: int | None, updates: int = 2) -> Path:
    """The default preset's model (d_model 256, 3+3 layers, 8k joint vocabulary) for ``updates`` updates."""
    config = yaml.safe_load((REPO / "configs" / "multi30k_de_en.yaml").read_text())
    config["data"] = dict(data, max_len=100)
    for key in ("budget_decay", "warmup_fraction", "lr"):  # time_budget's settings
        config["train"].pop(key, None)
    config["train"].update(max_steps=updates, max_minutes=None, schedule="noam", log_every=1, valid_every=1000,
                           average_last=0, device="cpu")
    if max_sentences:
        config["tokenizer"]["max_sentences"] = max_sentences
    path.write_text(yaml.safe_dump(config))
    return path


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return found


def _memory_kib(pid: int) -> tuple[int, int]:
    """(peak RSS so far (VmHWM), PSS) of a process in KiB (0 when it is gone)."""
    try:
        rss = int(next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if x.startswith("VmHWM:")).split()[1])
        pss = int(next(x for x in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                       if x.startswith("Pss:")).split()[1])
        return rss, pss
    except (OSError, StopIteration, ValueError):
        return 0, 0


def measured(cmd: list[str], env: dict, log: Path) -> dict:
    """Run ``cmd``; wall seconds, the peak of the tree's summed PSS (sampled every 0.1 s) and
    each process's peak RSS (MiB; the kernel's VmHWM, read until the process ends)."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        peak_pss, peak_rss = 0, {}
        while proc.poll() is None:
            pids = _tree(proc.pid)
            sizes = {p: _memory_kib(p) for p in pids}
            peak_pss = max(peak_pss, sum(pss for _, pss in sizes.values()))
            for p, (rss, _) in sizes.items():
                peak_rss[p] = max(peak_rss.get(p, 0), rss)
            time.sleep(0.1)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return {"seconds": round(wall, 1), "tree_pss_mib": round(peak_pss / 1024), "rss_mib": sorted(
        (round(v / 1024) for v in peak_rss.values()), reverse=True)}


def first_update_seconds(run_dir: Path) -> float | None:
    for line in (run_dir / "train_log.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            return record["seconds"]
    return None


def attnmt(*args: str) -> list[str]:
    return ["nice", "-n", "5", sys.executable, "-m", "attnmt", *args]


def encoding_ceiling(prepared_dir: Path, src: Path, tgt: Path, lines: int = 200_000) -> int:
    """Pairs per second that SentencePiece alone encodes on one core: the prepared directory's
    model on the first ``lines`` pairs of the corpus, both sides, in this process with one
    thread (the text read and decoded beforehand). ``attnmt prepare`` on C cores cannot pass C
    times this, whatever else it does."""
    import itertools

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(prepared_dir / "spm.model"))
    sides = []
    for path in (src, tgt):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            sides.append([line.strip() for line in itertools.islice(f, lines)])
    t0 = time.process_time()
    for side in sides:
        sp.encode(side, out_type=int, num_threads=1)
    return round(len(sides[0]) / (time.process_time() - t0))


def measure_k(args, k: int, work: Path, env: dict) -> dict:
    src, tgt, pairs = write_corpus(Path(args.data_dir), k, work / "corpus")
    text = write_config(work / "text.yaml", {"train_src": str(src), "train_tgt": str(tgt)}, args.max_sentences,
                        args.updates)
    prepared_dir = work / "prepared"
    row: dict = {"k": k, "pairs": pairs}
    if "prepare" not in args.skip:
        subprocess.run(["rm", "-rf", str(prepared_dir)], check=True)
        m = measured(attnmt("prepare", str(text), "--output", str(prepared_dir), "--workers", str(args.workers)),
                     env, work / "prepare.log")
        size = sum(f.stat().st_size for f in prepared_dir.iterdir())
        row["prepare"] = dict(m, pairs_per_s=round(pairs / m["seconds"]), disk_mb=round(size / 1e6, 1),
                              mb_per_million=round(size / 1e6 / (pairs / 1e6), 1),
                              sentencepiece_pairs_per_s=encoding_ceiling(prepared_dir, src, tgt))
    config = write_config(work / "prepared.yaml", {"prepared": str(prepared_dir)}, args.max_sentences, args.updates)
    runs = {"prepared": (attnmt("train", str(config), "--output"), env),
            # the updates of torchrun x2 in one process: the same batches, by accumulating two a step
            "prepared_same": (attnmt("train", str(config), "--set", "train.accum_steps=2", "--output"), env),
            "torchrun": (["nice", "-n", "5", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "-m", "attnmt", "train", str(config), "--output"], dict(env, OMP_NUM_THREADS="1")),
            "text": (attnmt("train", str(text), "--output"), env)}
    if args.base_src:
        runs["base"] = (attnmt("train", str(text), "--output"), dict(env, PYTHONPATH=str(Path(args.base_src).resolve())))
    for name, (cmd, run_env) in runs.items():
        if name in args.skip:
            continue
        run_dir = work / f"run_{name}"
        tries = []
        for _ in range(args.repeats if name in ("prepared", "prepared_same", "torchrun") else 1):
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            tries.append(dict(measured(cmd + [str(run_dir)], run_env, work / f"{name}.log"),
                              first_update_s=first_update_seconds(run_dir)))
        row[name] = median_run(tries)
    return row


def median_run(tries: list[dict]) -> dict:
    """The median of each figure over repeated runs (each process's peak RSS by rank of size),
    and every run's peak RSS."""
    def median(values):
        return sorted(values)[len(values) // 2]
    out = {key: median([t[key] for t in tries]) for key in ("seconds", "tree_pss_mib")}
    out["first_update_s"] = median([t["first_update_s"] or 0 for t in tries])
    width = min(len(t["rss_mib"]) for t in tries)  # a run may catch a short-lived helper process too
    out["rss_mib"] = [median([t["rss_mib"][i] for t in tries]) for i in range(width)]
    out["runs_rss_mib"] = [t["rss_mib"] for t in tries]
    return out


def table(rows: list[dict]) -> str:
    lines = ["| K | pairs | what | wall s | first update s | peak memory MiB | pairs/s | disk MB per 1M pairs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        for name in ("prepare", "prepared", "prepared_same", "torchrun", "text", "base"):
            m = r.get(name)
            if m is None:
                continue
            memory = (f"{m['tree_pss_mib']} (tree PSS)" if name == "prepare" else
                      " / ".join(map(str, m["rss_mib"][:2])) + " (each worker)" if name == "torchrun" else
                      f"{m['rss_mib'][0]}")
            lines.append(f"| {r['k']} | {r['pairs']:,} | {name} | {m['seconds']} | {m.get('first_update_s') or '-'} | "
                         f"{memory} | {_rate(m)} | {m.get('mb_per_million', '-')} |")
    return "\n".join(lines)


def _rate(m: dict) -> str:
    """Pairs/s of a prepare run, with SentencePiece's own rate on one core beside it."""
    if "pairs_per_s" not in m:
        return "-"
    ceiling = m.get("sentencepiece_pairs_per_s")
    return f"{m['pairs_per_s']}" + (f" (SentencePiece alone, 1 core: {ceiling})" if ceiling else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.data_dir:
        raise SystemExit("set ATTNMT_DATA or --data-dir (a directory holding multi30k/)")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rows = []
    for k in args.ks:
        work = Path(args.work) / f"k{k}"
        work.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()[0]
        rows.append(dict(measure_k(args, k, work, env), load_before=round(load, 2), load_after=round(os.getloadavg()[0], 2)))
        print(json.dumps(rows[-1]), flush=True)
    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "rows": rows}
    (Path(args.work) / "corpora.json").write_text(json.dumps(result, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
