"""Does fine-tuning pay? Multi30k de->en split in two halves, a budget counted in updates.

Three runs of the de->en preset's model, tokenizer and batching on halves A and B of a seeded
shuffle of Multi30k train (written into the work folder), with an update-count budget and an
inverse-square-root schedule, so that other load cannot change what is trained: half-A (half A,
half the budget), A -> B (half-A's model fine-tuned on B for the other half, ``train.init_from``)
and B alone (the whole budget); each scored on test_2016_flickr by ``attnmt evaluate``."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import yaml

from attnmt.config import apply_overrides
import harness as h

PRESET = h.ROOT / "configs" / "multi30k_de_en.yaml"


def split_halves(data: Path, work: Path, seed: int, limit: int | None = None) -> dict[str, tuple[Path, Path]]:
    """Write train halves A and B (a seeded shuffle of Multi30k train, its first ``limit`` pairs) into ``work``."""
    de, en = (h.read_lines(data / "multi30k" / f"train.{x}.gz", limit) for x in ("de", "en"))
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
    for key in ("warmup_fraction", "budget_decay", "schedule"):
        train.pop(key, None)
    train.update(schedule="inverse_sqrt", lr=lr, warmup_steps=warmup, batch_tokens=args.batch_tokens,
                 valid_every=args.valid_every, average_last=0, log_every=50)
    cfg = apply_overrides(cfg, h.capped(updates))
    if init_from is not None:
        cfg["train"]["init_from"] = str(init_from)  # apply_overrides returned a new dict: not `train`
        # the model and tokenizer sections are the starting model's (train.init_from inherits them)
        cfg.pop("model"), cfg.pop("tokenizer")
    return apply_overrides(cfg, [s for s in args.set if init_from is None or s.split(".")[0] not in
                                 ("model", "tokenizer")])


def test_set(data: Path, work: Path, limit: int | None) -> tuple[Path, Path]:
    """test_2016_flickr's source and reference files: the whole set, or its first ``limit`` lines (``--limit``)."""
    files = tuple(data / "multi30k" / f"test_2016_flickr.{lang}.gz" for lang in ("de", "en"))
    if not limit:
        return files
    return tuple(h.write_lines(work / f"test.{lang}", h.read_lines(f, limit)) for f, lang in zip(files, ("de", "en")))


def train_and_score(name: str, cfg: dict, work: Path, test: tuple[Path, Path]) -> dict:
    """Train one run into ``work/NAME`` and score it on the test set: updates, minutes, BLEU, chrF."""
    slug = name.split(" (")[0].replace(" ", "_")
    path, out = work / f"{slug}.yaml", work / slug
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    p = h.run(h.attnmt("train", path, "--output", out), log=work / f"{slug}.log")
    result = json.loads(p.output.strip().splitlines()[-1])
    if cfg["train"].get("init_from") and not (out / "init_from.json").is_file():
        raise h.BenchError(f"{out}: trained from scratch, not from {cfg['train']['init_from']} (no init_from.json)")
    threads = ["--threads", str(cfg["train"]["num_threads"])] if cfg["train"].get("num_threads") else []
    scores = h.evaluate(out, *test, *threads)
    return {"run": name, "updates": result["steps"], "train_minutes": round(p.seconds / 60, 1),
            "test_bleu": round(scores["bleu"], 2), "test_chrf": round(scores["chrf"], 2)}


def add_arguments(p) -> None:
    p.add_argument("--updates", type=int, default=800, help="finetune: the whole budget in updates (half-A and A->B get half)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="finetune")
    p.add_argument("--lr", type=float, default=0.0015, help="finetune: peak rate of the runs from scratch")
    p.add_argument("--warmup", type=int, default=150, help="finetune: warmup updates of the runs from scratch")
    p.add_argument("--finetune-lr", type=float, default=0.0008, help="finetune: peak rate of the fine-tuning run")
    p.add_argument("--finetune-warmup", type=int, default=50)
    p.add_argument("--finetune-schedule", choices=["inverse_sqrt", "constant"], default="inverse_sqrt",
                   help="finetune: the fine-tuning run's schedule after its warmup")
    p.add_argument("--valid-every", type=int, default=200, help="finetune")
    p.add_argument("--seed", type=int, default=1, help="finetune: seed of the A/B split; control: of the phrases")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="finetune: a key of the preset in every run, e.g. model.d_model=128 (the fine-tuning run "
                        "inherits model and tokenizer keys); recipes: the recipe's keys")


def run(args) -> None:
    """The three runs, each recorded: updates, training minutes, test BLEU and chrF."""
    data = Path(args.data)
    work = args.work / ("smoke" if args.smoke else "quality") / "finetune"
    if args.smoke:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    halves = split_halves(data, work, args.seed, 2000 if args.smoke else None)
    half = args.updates // 2
    test = test_set(data, work, args.limit)
    a = train_and_score("half-A", config(halves["A"], data, args, half, args.lr, args.warmup), work, test)
    ft_config = config(halves["B"], data, args, args.updates - half, args.finetune_lr, args.finetune_warmup,
                       init_from=work / "half-A")
    ft_config["train"]["schedule"] = args.finetune_schedule
    ft = train_and_score("A then B (fine-tuned)", ft_config, work, test)
    b = train_and_score("B alone", config(halves["B"], data, args, args.updates, args.lr, args.warmup), work, test)
    for row in (a, ft, b):
        for column, key, unit in (("updates", "updates", "updates"), ("training minutes", "train_minutes", "min"),
                                  ("test BLEU", "test_bleu", "BLEU"), ("test chrF", "test_chrf", "chrF")):
            h.record(args, "Fine-tuning: Multi30k de->en in two halves", row["run"], column, row[key], unit)
