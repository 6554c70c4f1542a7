"""Does fine-tuning pay? Multi30k de->en split in two halves, a budget counted in updates.

Multi30k train is split into halves A and B by a seeded shuffle (files in a temporary work
directory, never in the repository). Three runs of the de->en preset (configs/multi30k_de_en.yaml:
its model, tokenizer and batching; an update-count budget with an inverse-square-root schedule
instead of its wall-clock one, so that other load on the machine cannot change what is trained):

  half-A     half A, for half the budget (its own SentencePiece model)
  A -> B     half-A's model fine-tuned on half B for the other half (train.init_from)
  B alone    half B, for the whole budget

Each is scored on test_2016_flickr (sacreBLEU, the preset's beam search) with ``attnmt
evaluate``. Prints one JSON object per run and a markdown table.

    python benchmarks/finetune.py --data-dir $ATTNMT_DATA --updates 600 --batch-tokens 2048 \
        --set model.d_model=128 ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from attnmt.config import apply_overrides

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "configs" / "multi30k_de_en.yaml"


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def split_halves(data: Path, work: Path, seed: int) -> dict[str, tuple[Path, Path]]:
    """Write train halves A and B (a seeded shuffle of Multi30k train) into ``work``."""
    de, en = read_gz(data / "multi30k" / "train.de.gz"), read_gz(data / "multi30k" / "train.en.gz")
    order = list(range(len(de)))
    random.Random(seed).shuffle(order)
    halves = {"A": order[: len(order) // 2], "B": order[len(order) // 2:]}
    files = {}
    for name, idx in halves.items():
        src, tgt = work / f"half{name}.de", work / f"half{name}.en"
        src.write_text("".join(de[i] + "\n" for i in idx), encoding="utf-8")
        tgt.write_text("".join(en[i] + "\n" for i in idx), encoding="utf-8")
        files[name] = (src, tgt)
    return files


def config(half: tuple[Path, Path], data: Path, args, updates: int, lr: float, warmup: int,
           init_from: Path | None = None) -> dict:
    """The preset with half of train, val for validation, an update-count budget and the
    ``--set`` overrides."""
    cfg = yaml.safe_load(PRESET.read_text(encoding="utf-8"))
    cfg["data"] = {"train_src": str(half[0]), "train_tgt": str(half[1]),
                   "valid_src": str(data / "multi30k" / "val.de.gz"), "valid_tgt": str(data / "multi30k" / "val.en.gz"),
                   "max_len": cfg["data"]["max_len"]}
    train = cfg["train"]
    for key in ("max_minutes", "warmup_fraction", "budget_decay", "schedule"):
        train.pop(key, None)
    train.update(schedule="inverse_sqrt", lr=lr, warmup_steps=warmup, max_steps=updates, batch_tokens=args.batch_tokens,
                 valid_every=args.valid_every, average_last=0, log_every=50)
    if init_from is not None:
        train["init_from"] = str(init_from)
        # the model and tokenizer sections are the starting model's (train.init_from inherits them)
        cfg.pop("model"), cfg.pop("tokenizer")
    return apply_overrides(cfg, [s for s in args.set if init_from is None or s.split(".")[0] not in
                                 ("model", "tokenizer")])


def run(cmd: list[str], log) -> str:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=log, text=True).stdout
    log.write(out)
    return out


def train_and_score(name: str, cfg: dict, work: Path, data: Path, log) -> dict:
    """Train one run into ``work/name`` and score it on the test set; a run whose row
    ``work/name.json`` exists (a finished earlier invocation on the same work directory) is
    reused."""
    path, out, saved = work / f"{name}.yaml", work / name, work / f"{name}.json"
    if saved.is_file():
        row = json.loads(saved.read_text(encoding="utf-8"))
        print(json.dumps(row), flush=True)
        return row
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    t0 = time.monotonic()
    result = json.loads(run([sys.executable, "-m", "attnmt", "train", str(path), "--output", str(out)], log)
                        .strip().splitlines()[-1])
    minutes, t0 = (time.monotonic() - t0) / 60, time.monotonic()
    threads = ["--threads", str(cfg["train"]["num_threads"])] if cfg["train"].get("num_threads") else []
    scores = json.loads(run([sys.executable, "-m", "attnmt", "evaluate", *threads, "--model", str(out), "--src",
                             str(data / "multi30k" / "test_2016_flickr.de.gz"), "--ref",
                             str(data / "multi30k" / "test_2016_flickr.en.gz"), "--json"], log).strip().splitlines()[-1])
    test_minutes = (time.monotonic() - t0) / 60
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid"]
    row = {"run": name, "updates": result["steps"], "train_minutes": round(minutes, 1), "test_minutes": round(test_minutes, 1),
           "test_bleu": round(scores["bleu"], 2), "test_chrf": round(scores["chrf"], 2),
           "valid": [(r["step"], round(r["valid_bleu"], 2)) for r in valid if r["valid_bleu"] is not None]}
    saved.write_text(json.dumps(row) + "\n", encoding="utf-8")
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="holds multi30k/ (default $ATTNMT_DATA)")
    p.add_argument("--updates", type=int, default=800, help="the whole budget in updates (half-A and A->B get half)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.0015, help="peak rate of the runs from scratch")
    p.add_argument("--warmup", type=int, default=150, help="warmup updates of the runs from scratch")
    p.add_argument("--finetune-lr", type=float, default=0.0008, help="peak rate of the fine-tuning run")
    p.add_argument("--finetune-warmup", type=int, default=50)
    p.add_argument("--finetune-schedule", choices=["inverse_sqrt", "constant"], default="inverse_sqrt",
                   help="the fine-tuning run's schedule after its warmup (a run named A_then_B_constant for constant)")
    p.add_argument("--valid-every", type=int, default=200)
    p.add_argument("--seed", type=int, default=1, help="seed of the A/B split")
    p.add_argument("--work", help="work directory (default: a new temporary one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the preset in every run, e.g. model.d_model=128 (model and tokenizer keys "
                        "go to the runs from scratch; the fine-tuning run inherits them)")
    args = p.parse_args()
    if not args.data_dir:
        p.error("give --data-dir or set ATTNMT_DATA")
    data = Path(args.data_dir)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="attnmt-finetune-"))
    work.mkdir(parents=True, exist_ok=True)
    halves = split_halves(data, work, args.seed)
    half = args.updates // 2
    with open(work / "commands.log", "a", encoding="utf-8") as log:
        a = train_and_score("halfA", config(halves["A"], data, args, half, args.lr, args.warmup), work, data, log)
        ft_config = config(halves["B"], data, args, args.updates - half, args.finetune_lr, args.finetune_warmup,
                           init_from=work / "halfA")
        ft_config["train"]["schedule"] = args.finetune_schedule
        ft_name = "A_then_B" + ("" if args.finetune_schedule == "inverse_sqrt" else f"_{args.finetune_schedule}")
        ft = train_and_score(ft_name, ft_config, work, data, log)
        b = train_and_score("B_alone", config(halves["B"], data, args, args.updates, args.lr, args.warmup), work,
                            data, log)
    print("| run | updates | training minutes | test BLEU | test chrF |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in (a, ft, b):
        print(f"| {row['run']} | {row['updates']} | {row['train_minutes']} | {row['test_bleu']} | {row['test_chrf']} |")
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()
