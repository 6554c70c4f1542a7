"""data: ``attnmt prepare`` and training at K copies of Multi30k, and a simulated 100M-pair corpus.

``--part corpora``: for each K of ``--ks``, K copies of Multi30k train (each copy shuffled with its
own seed, gzip) written into the work folder, then, each a process whose whole tree is sampled
every 0.1 s: ``attnmt prepare --workers W`` (pairs/s, the tree's peak summed PSS, disk MB per
million pairs, and SentencePiece's own rate on one core beside it); ``attnmt train`` from the
prepared directory for ``--updates`` updates (the de-en preset's model, no validation set) in one
process, in one process making torchrun x2's updates (``train.accum_steps=2``), and under
torchrun x2 (medians of ``--repeats`` runs: wall s, first update s, each process's peak RSS);
``attnmt train`` from the text, with this checkout and with ``--base-src`` another's ``src``.

``--part simulate``: prepared directories of ``--sizes`` pairs with Multi30k's lengths as the
preset's SentencePiece model encodes them and sparse token files; opening and planning epoch 0
as rank 0 of 1 and as ranks 0 and 1 of 2 at once, and ``--updates`` updates of ``attnmt train``
in one process and under torchrun x2.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import harness as h

RUNS = ("prepared", "prepared_same", "torchrun", "text", "base")
PARTS = {"corpora": ["--part", "corpora"], "simulate": ["--part", "simulate"]}
SMOKE = {"ks": [1], "repeats": 1, "sizes": [20000], "skip": ["prepared_same", "torchrun", "text", "base"]}
MODELS = ()


def add_arguments(p) -> None:
    p.add_argument("--part", choices=("corpora", "simulate"), default="corpora")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 10, 100], help="corpora: copies of Multi30k train")
    p.add_argument("--workers", type=int, default=2, help="corpora: attnmt prepare --workers")
    p.add_argument("--max-sentences", type=int, help="corpora: tokenizer.max_sentences")
    p.add_argument("--base-src", help="corpora: src/ of a checkout to measure the text path with")
    p.add_argument("--repeats", type=int, default=3, help="corpora: runs of each training measurement (median kept)")
    p.add_argument("--skip", nargs="*", default=[], choices=["prepare", *RUNS, "plan", "plan2", "train"],
                   help="measurements to leave out")
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8], help="simulate: pairs of each corpus")
    p.add_argument("--updates", type=int, default=2, help="updates of each training run")


def write_corpus(data_dir: Path, k: int, out: Path, limit: int | None = None) -> tuple[Path, Path, int]:
    """K copies of Multi30k train de-en (its first ``limit`` pairs), each shuffled with its own seed, gzip."""
    src, tgt = (h.read_lines(Path(data_dir) / "multi30k" / f"train.{x}.gz", limit) for x in ("de", "en"))
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


def write_config(path: Path, data: dict, max_sentences: int | None, updates: int = 2, smoke: bool = False) -> Path:
    """The de-en preset's model (d_model 256, 3+3 layers, 8k joint vocabulary; harness.TINY with ``smoke``)
    for ``updates`` updates (harness.capped), no validation set."""
    import yaml
    from attnmt.config import apply_overrides

    config = yaml.safe_load((h.ROOT / "configs" / "multi30k_de_en.yaml").read_text())
    config["data"] = dict(data, max_len=100)
    for key in ("budget_decay", "warmup_fraction", "lr"):  # time_budget's settings
        config["train"].pop(key, None)
    config["train"].update(schedule="noam", log_every=1, valid_every=1000, average_last=0, device="cpu")
    config = apply_overrides(config, h.capped(updates) + (h.tiny_sets() if smoke else []))
    if max_sentences:
        config["tokenizer"]["max_sentences"] = max_sentences
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def measured(cmd: list, run_dir: Path | None = None, env: dict | None = None) -> dict:
    """One process tree: wall s, peak summed PSS MiB, each process's peak RSS MiB (largest first), and
    the seconds of the first update from ``run_dir``'s log."""
    p = h.run(["nice", "-n", "5", *cmd], env=dict(env or {}, PYTHONUNBUFFERED="1"), cwd=h.ROOT, pss=True)
    out = {"seconds": round(p.seconds, 1), "tree_pss_mib": round(p.memory.pss / 2**20),
           "rss_mib": sorted((round(v / 2**20) for v in p.memory.each.values()), reverse=True)}
    if run_dir is not None:
        out["first_update_s"] = next((r["seconds"] for r in h.train_log(run_dir) if r["kind"] == "train"), None)
    return out


def median_run(tries: list[dict]) -> dict:
    """The median of each figure over repeated runs (each process's peak RSS by rank of size)."""
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    return {"seconds": median([t["seconds"] for t in tries]), "runs_rss_mib": [t["rss_mib"] for t in tries],
            "first_update_s": median([t.get("first_update_s") or 0 for t in tries]),
            "rss_mib": [median([t["rss_mib"][i] for t in tries]) for i in range(min(len(t["rss_mib"]) for t in tries))]}


def encoding_ceiling(prepared: Path, src: Path, tgt: Path, lines: int = 200_000) -> int:
    """Pairs/s that SentencePiece alone encodes on one core (no ``prepare`` on C cores passes C times it)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(prepared / "spm.model"))
    sides = [h.read_lines(path, lines) for path in (src, tgt)]
    t0 = time.process_time()
    for side in sides:
        sp.encode(side, out_type=int, num_threads=1)
    return round(len(sides[0]) / (time.process_time() - t0))


def corpora(args) -> None:
    """Prepare and train at each K."""
    section = "Large corpora"
    for k in args.ks:
        work = args.work / args.suite / f"k{k}"
        src, tgt, pairs = write_corpus(args.data, k, work / "corpus", 2000 if args.smoke else None)
        text = write_config(work / "text.yaml", {"train_src": str(src), "train_tgt": str(tgt)}, args.max_sentences,
                            args.updates, args.smoke)
        prepared = work / "prepared"
        column = f"K={k} ({pairs:,} pairs)"
        if "prepare" not in args.skip:
            shutil.rmtree(prepared, ignore_errors=True)
            m = measured(h.attnmt("prepare", text, "--output", prepared, "--workers", args.workers))
            size = sum(f.stat().st_size for f in prepared.iterdir())
            for figure, value, unit in (("prepare: pairs/s, whole command", round(pairs / m["seconds"]), "pairs/s"),
                                        ("SentencePiece alone, 1 core", encoding_ceiling(prepared, src, tgt), "pairs/s"),
                                        ("prepare: peak memory, all processes (PSS)", m["tree_pss_mib"], "MiB"),
                                        ("prepare: disk per million pairs", round(size / pairs, 1), "MB")):
                h.record(args, section, figure, column, value, unit, workers=args.workers)
        config = write_config(work / "prepared.yaml", {"prepared": str(prepared)}, args.max_sentences, args.updates,
                              args.smoke)
        runs = {"prepared": (h.attnmt("train", config), {}),
                "prepared_same": (h.attnmt("train", config, "--set", "train.accum_steps=2"), {}),
                "torchrun": (h.torchrun_cmd("train", config), {"OMP_NUM_THREADS": "1"}),
                "text": (h.attnmt("train", text), {})}
        if args.base_src:
            runs["base"] = (h.attnmt("train", text), {"PYTHONPATH": str(Path(args.base_src).resolve())})
        for name, (cmd, env) in runs.items():
            if name in args.skip:
                continue
            run_dir, tries = work / f"run_{name}", []
            for _ in range(args.repeats if name in RUNS[:3] else 1):
                shutil.rmtree(run_dir, ignore_errors=True)
                tries.append(measured(cmd + ["--output", run_dir], run_dir, env))
            m = median_run(tries)
            for figure, value, unit in ((f"train ({name}): wall s", m["seconds"], "s"),
                                        (f"train ({name}): first update s", m["first_update_s"], "s"),
                                        (f"train ({name}): peak RSS of each process",
                                         m["rss_mib"][:2 if name == "torchrun" else 1], "MiB")):
                h.record(args, section, figure, column, value, unit, updates=args.updates, median_of=len(tries),
                         runs_rss_mib=m["runs_rss_mib"])


def plan_process(directory: str, rank: int, world: int) -> dict:
    """Open ``directory`` and plan epoch 0 as ``rank`` of ``world`` (the preset's 4096-token batches),
    as a training process does: seconds and peak RSS (MiB) after each step."""
    import resource

    from attnmt.data import plan, shards
    from attnmt.memory import tune_allocator

    def peak() -> int:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    tune_allocator()
    t0 = time.monotonic()
    corpus = shards.ShardedCorpus(directory)
    opened, opened_mib, t0 = time.monotonic() - t0, peak(), time.monotonic()
    buckets = plan.Buckets.from_chunks(lambda: ((s + 1, t + 1) for s, t in corpus.length_chunks()))
    share = plan.epoch_plan(buckets, corpus.corpora, 4096, None, 1, 0).share(rank, world)
    return {"rank": rank, "open_s": round(opened, 2), "open_peak_mib": opened_mib, "plan_s": round(time.monotonic() - t0, 2),
            "plan_peak_mib": peak(), "share_mib": round(share.indices.nbytes / 2**20)}


def write_simulated(out: Path, pairs: int, lengths, source: Path) -> None:
    """A prepared directory of ``pairs`` pairs, lengths drawn from ``lengths``, sparse token files;
    ``source``'s tokenizer and manifest fields."""
    import numpy as np
    from attnmt.data import shards
    from attnmt.data.manifest import CorpusEntry, FileRecord, Manifest, TrainRecord

    out.mkdir(parents=True, exist_ok=True)
    manifest = Manifest.load(source)
    for name in manifest.tokenizers:
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
    dropped = dict.fromkeys(manifest.train.dropped, 0)
    record = FileRecord("simulated", 0, 0, f"{pairs:064x}")
    corpus = CorpusEntry("simulated", 1, 0, pairs, pairs, dropped, record, record)
    manifest.train = TrainRecord(pairs, pairs, dropped, entries, [corpus])
    manifest.valid = None
    manifest.splits = {}
    manifest.valid_sets = None
    manifest.fingerprint = manifest.compute_fingerprint()
    manifest.save(out)


def simulate(args) -> None:
    """Open, plan and train on simulated corpora of each size."""
    import numpy as np

    section = "Large corpora: 100 million simulated pairs"
    work = args.work / args.suite / "simulate"
    source = work / "multi30k"
    if not (source / "manifest.json").is_file():
        config = write_config(work / "multi30k.yaml", {"train_src": str(h.corpus(args, "train", "de")),
                              "train_tgt": str(h.corpus(args, "train", "en"))}, None, smoke=args.smoke)
        h.run(h.attnmt("-q", "prepare", config, "--output", source))
    manifest = json.loads((source / "manifest.json").read_text())
    lengths = np.concatenate([np.load(source / f"{s['name']}.len.npy") for s in manifest["train"]["shards"]])
    for pairs in map(int, args.sizes):
        prepared, column = work / f"n{pairs}" / "prepared", f"{pairs:,} pairs"
        if not (prepared / "manifest.json").is_file():
            write_simulated(prepared, pairs, lengths, source)
        files = [f.stat() for f in prepared.iterdir()]
        h.record(args, section, "disk, sparse token files", column, round(sum(s.st_blocks * 512 for s in files) / 1e6, 1),
                 "MB")
        h.record(args, section, "disk, apparent size", column, round(sum(s.st_size for s in files) / 1e6, 1), "MB")
        code = f"import sys, json; sys.path.insert(0, {str(h.HERE)!r}); import suite_data as d; " \
               f"print(json.dumps(d.plan_process({str(prepared)!r}, int(sys.argv[1]), int(sys.argv[2]))))"
        for world in (1, 2):
            if ("plan" if world == 1 else "plan2") in args.skip:
                continue
            procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(world)], stdout=subprocess.PIPE, text=True)
                     for r in range(world)]
            plans = [json.loads(p.communicate()[0]) for p in procs]
            for figure, value, unit in (
                    (f"plan an epoch, {world} rank(s) at once: s each", [p["plan_s"] for p in plans], "s"),
                    (f"plan an epoch, {world} rank(s) at once: peak RSS each", [p["plan_peak_mib"] for p in plans], "MiB"),
                    (f"plan an epoch, {world} rank(s) at once: a rank's share", plans[0]["share_mib"], "MiB")):
                h.record(args, section, figure, column, value, unit, plans=plans)
        config = write_config(work / f"n{pairs}" / "prepared.yaml", {"prepared": str(prepared)}, None, args.updates,
                              args.smoke)
        for name, cmd, env in (("train", h.attnmt("train", config), {}),
                               ("torchrun", h.torchrun_cmd("train", config), {"OMP_NUM_THREADS": "1"})):
            if name in args.skip:
                continue
            run_dir = work / f"n{pairs}" / f"run_{name}"
            shutil.rmtree(run_dir, ignore_errors=True)
            m = measured(cmd + ["--output", run_dir], run_dir, env)
            for figure, value, unit in ((f"{name}: first update s", m["first_update_s"], "s"),
                                        (f"{name}: wall s", m["seconds"], "s"),
                                        (f"{name}: peak RSS of each process", m["rss_mib"][:2], "MiB")):
                h.record(args, section, figure, column, value, unit, updates=args.updates)


def run(args) -> None:
    (corpora if args.part == "corpora" else simulate)(args)
