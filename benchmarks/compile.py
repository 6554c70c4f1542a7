"""Eager against compiled training (``train.compile``), side by side in one run (issue 43's figure).

For each precision asked (``--precisions``), the preset (default the de-en one) is trained twice,
one run after the other, eager then compiled, with the issue's settings: a constant learning
rate after warmup (``train.schedule constant``), no time budget, ``--steps`` updates (the
validation at the end scores the loss only: ``train.valid_bleu false``). From each
run's ``train_log.jsonl``: the last logged target tokens per second (a window of ``log_every``
updates, so the compile time, spent in the first window, is not in it), the validation loss at
the last update, the precision the run used (bf16 falls back to fp32 on a CPU without bfloat16
kernels), and for the compiled run the graphs compiled and the seconds it spent compiling (with
an empty inductor cache, as on a machine's first run). The
model FLOP utilisation is against the machine's 2048 x 2048 matmul rate measured first
(``benchmarks/training.py``: ``matmul_probe``, ``model_flops_per_target_token`` with the
preset's dimensions and the run's own tokenization of the training text).

Prints a Markdown table and one JSON object. Figures go to RESULTS.md only from an otherwise
idle machine, with its CPU named.

Usage (from the repository root):
    .venv/bin/python benchmarks/compile.py --data "$ATTNMT_DATA" [--precisions fp32 bf16] [--steps 300]
A check at tiny size: ``--steps 20``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "src")]
from measure import run  # noqa: E402
from setting import cpu_fields, cpu_name  # noqa: E402
from training import matmul_probe, model_flops_per_target_token  # noqa: E402


def train(config: Path, out: Path, compile: bool, precision: str, steps: int, env: dict) -> dict:
    """One ``attnmt train`` of ``config`` into ``out`` with the issue's settings; its figures."""
    if out.exists():
        shutil.rmtree(out)
    sets = {"train.compile": str(compile).lower(), "train.precision": precision, "train.schedule": "constant",
            "train.budget_decay": "inverse_sqrt", "train.max_minutes": "null", "train.max_steps": str(steps),
            "train.log_every": str(min(100, max(1, steps // 2))), "train.valid_bleu": "false"}
    cmd = [sys.executable, "-m", "attnmt", "train", str(config), "--output", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    cache = out.parent / f"{out.name}-inductor-cache"  # empty: the compile time of a first run on a machine
    shutil.rmtree(cache, ignore_errors=True)
    p = run(cmd, out.parent / f"{out.name}.log", env=dict(env, TORCHINDUCTOR_CACHE_DIR=str(cache)))
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    rates = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    done = next(r for r in records if r["kind"] == "done")
    return {"tgt_tok_s": rates[-1]["tgt_tokens_per_s"], "rate_window_ends_at": rates[-1]["step"],
            "valid_loss": valid[-1]["valid_loss"], "valid_step": valid[-1]["step"], "updates": done["steps"],
            "precision": done["precision"], "process_s": round(p.seconds, 1), "other_cores": round(p.other_cores, 2),
            "compiled_graphs": done.get("compiled_graphs"), "compile_seconds": done.get("compile_seconds")}


def flops_per_token(run_dir: Path, config, data: Path) -> float:
    """Training FLOPs per target token of the preset's model (an ``attnmt.config.Config``) on
    the training text as the run tokenized it."""
    import sentencepiece as spm

    m, pair = config.model, config.data.pair.split("-")
    sides = []
    for lang in pair:
        sp = spm.SentencePieceProcessor(model_file=str(run_dir / "spm.model"))
        with gzip.open(data / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([len(ids) + 1 for ids in sp.encode(f.read().splitlines())])  # + EOS
    lengths = list(zip(*sides))
    return model_flops_per_target_token(lengths, d=m.d_model, f=m.d_ff, layers_enc=m.num_encoder_layers,
                                        layers_dec=m.num_decoder_layers,
                                        vocab=config.tokenizer.vocab_size)["flops_per_tgt_token"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the directory holding multi30k/")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2, help="threads of the matmul probe")
    parser.add_argument("--work", type=Path, default=HERE / "work" / "compile")
    args = parser.parse_args()

    from attnmt.config import load_config

    config = load_config(args.config)
    env = {"ATTNMT_DATA": str(args.data.resolve()), "PYTHONPATH": str(ROOT / "src")}
    env["PYTHONPATH"] += os.pathsep + os.environ.get("PYTHONPATH", "")
    probe = matmul_probe(args.threads)
    rows = {}
    for precision in args.precisions:
        for compile in (False, True):
            name = f"{precision}-{'compiled' if compile else 'eager'}"
            rows[name] = train(args.config, args.work / name, compile, precision, args.steps, env)
            print(json.dumps({name: rows[name]}), flush=True)
    flops = flops_per_token(args.work / name, config, args.data)
    print(f"CPU: {cpu_name(cpu_fields())}; matmul fp32 {probe['fp32']:.1f} GFLOP/s, bf16 {probe['bf16']:.1f} "
          f"({probe['n_bf16']}x{probe['n_bf16']}); {flops / 1e6:.1f} MFLOP per target token\n")
    print("| run | precision used | tgt tok/s (updates to) | MFU | valid loss (update) | compiled graphs, seconds |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name, r in rows.items():
        peak = probe["bf16" if r["precision"] == "bf16" else "fp32"] * 1e9
        r["mfu"] = r["tgt_tok_s"] * flops / peak
        compiled = "-" if r["compiled_graphs"] is None else f"{r['compiled_graphs']}, {r['compile_seconds']} s"
        print(f"| {name} | {r['precision']} | {r['tgt_tok_s']:,.0f} ({r['rate_window_ends_at']}) | {r['mfu']:.1%} | "
              f"{r['valid_loss']:.4f} ({r['valid_step']}) | {compiled} |")
    ratios = {}
    for precision in args.precisions:
        eager, compiled = rows[f"{precision}-eager"], rows[f"{precision}-compiled"]
        ratios[precision] = {"speed": compiled["tgt_tok_s"] / eager["tgt_tok_s"],
                             "valid_loss_change": compiled["valid_loss"] / eager["valid_loss"] - 1}
        print(f"\n{precision}: compiled / eager {ratios[precision]['speed']:.2f}x tokens/s, validation loss "
              f"{ratios[precision]['valid_loss_change']:+.2%}")
    print(json.dumps({"cpu": cpu_name(cpu_fields()), "matmul": probe, "flops_per_target_token": flops,
                      "runs": rows, "ratios": ratios}))


if __name__ == "__main__":
    main()
