"""Training runs and their throughput: attnmt, JoeyNMT, OpenNMT-py and eole on the shared setting.

Each toolkit logs its own count of non-padding target tokens per second every ``log_every``
updates; :func:`combine_windows` drops the first window (warm-up) and combines the rest. The
model FLOP utilisation needs the analytic FLOPs per target token
(:func:`model_flops_per_target_token`) and the machine's matmul rate (:func:`matmul_probe`).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from harness import attnmt, run, train_log
from setting import Setting, peer_venv


def combine_windows(windows: list[tuple[int, float]], log_every: int) -> float | None:
    """Harmonic mean of the per-window rates after the first window (total tokens / total time)."""
    rates = [r for step, r in windows if step > log_every and r > 0]
    if not rates:
        rates = [r for _, r in windows if r > 0]
    return len(rates) / sum(1 / r for r in rates) if rates else None


def model_flops_per_target_token(lengths: list[tuple[int, int]], d: int = 256, f: int = 512, layers_enc: int = 3,
                                 layers_dec: int = 3, vocab: int = 8000) -> dict:
    """Training FLOPs per target token of the benchmark model (forward + backward = 3 x forward).

    Forward FLOPs of one sentence pair with S source and T target tokens (EOS included):
        2 * W_src * S + 2 * W_tgt * T + 4 * D * (L_e * S^2 + L_d * (T^2 + T * S))
    where W_src = L_e * (4 D^2 + 2 D F) + L_d * 2 D^2 are the matmul weights each source token
    meets (encoder self-attention Q/K/V/O and feed-forward; the decoder's cross-attention K/V
    projections of the memory), W_tgt = L_d * (4 D^2 + 2 D^2 + 2 D F) + D V those each target
    token meets (self-attention Q/K/V/O, cross-attention Q/O, feed-forward, the output projection
    onto the vocabulary), and the last term is attention scores QK^T and the weighted sum of the
    values (2 D FLOPs each per query-key pair, the full T x T of the decoder's self-attention
    counted, as it is computed). Embedding look-ups, biases, layer norms, softmax and the loss are
    left out (under 1%). Sums run over the training corpus; padding is not counted.
    """
    w_src = layers_enc * (4 * d * d + 2 * d * f) + layers_dec * 2 * d * d
    w_tgt = layers_dec * (6 * d * d + 2 * d * f) + d * vocab
    fwd_dense = fwd_attn = 0
    tgt_tokens = src_tokens = 0
    for s_len, t_len in lengths:
        fwd_dense += 2 * w_src * s_len + 2 * w_tgt * t_len
        fwd_attn += 4 * d * (layers_enc * s_len * s_len + layers_dec * (t_len * t_len + t_len * s_len))
        src_tokens += s_len
        tgt_tokens += t_len
    per_tok = 3 * (fwd_dense + fwd_attn) / tgt_tokens
    return {"flops_per_tgt_token": per_tok, "dense_share": fwd_dense / (fwd_dense + fwd_attn),
            "w_src": w_src, "w_tgt": w_tgt, "src_per_tgt": src_tokens / tgt_tokens,
            "mean_src_len": src_tokens / len(lengths), "mean_tgt_len": tgt_tokens / len(lengths),
            "approx_6N": 6 * (w_tgt + w_src * src_tokens / tgt_tokens)}


def matmul_probe(threads: int, n: int = 2048) -> dict:
    """Best GFLOP/s of three one-second runs of an n x n matmul, float32 and bfloat16, on
    ``threads`` threads (bfloat16 at most 512 x 512 on a CPU without bfloat16 kernels)."""
    import torch

    from attnmt.precision import cpu_bf16_is_fast

    torch.set_num_threads(threads)
    n_bf16 = n if cpu_bf16_is_fast() else min(n, 512)
    out = {"threads": torch.get_num_threads(), "n": n, "n_bf16": n_bf16, "torch": torch.__version__}
    for name, dtype, n in (("fp32", torch.float32, n), ("bf16", torch.bfloat16, n_bf16)):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        c = a @ b
        for _ in range(2):
            torch.mm(a, b, out=c)
        best = 0.0
        for _trial in range(3):
            reps, t0 = 0, time.perf_counter()
            while (el := time.perf_counter() - t0) < 1.0 or reps < 2:
                torch.mm(a, b, out=c)
                reps += 1
            best = max(best, 2 * n ** 3 * reps / el / 1e9)
        out[name] = best
    return out


def train_attnmt(s: Setting, out: Path, precision: str = "fp32", updates: int | None = None) -> dict:
    """``attnmt train`` in the shared setting into ``out``: throughput windows, rate, process
    seconds, peak RSS, validation perplexity."""
    cfg = s.fill("attnmt.yaml", out.parent / f"{out.name}.yaml", updates=updates, precision=precision)
    shutil.rmtree(out, ignore_errors=True)
    p = run(attnmt("train", cfg, "--output", out),  # this interpreter's attnmt, whatever its virtual environment
            env=s.env, log=out.parent / f"{out.name}.log", check="raise")
    records = train_log(out)
    windows = [(r["step"], r["tgt_tokens_per_s"]) for r in records if r["kind"] == "train"]
    done = next(r for r in records if r["kind"] == "done")
    valid = [r for r in records if r["kind"] == "valid"]
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "updates": done["steps"], "model": str(out),
            "own_rate_excl_batching": done["tgt_tokens_per_second"],
            "valid_ppl": valid[-1]["valid_ppl"] if valid else None, "precision": done.get("precision", precision)}


def train_joeynmt(s: Setting, out: Path) -> dict:
    """JoeyNMT training in the shared setting into ``out`` (windows from its train.log)."""
    cfg = s.fill("joeynmt.yaml", out.parent / f"{out.name}.yaml", model_dir=out)
    p = run([str(peer_venv("joeynmt") / "bin/python"), "-m", "joeynmt", "train", str(cfg), "--skip-test"],
            env=s.env, log=out.parent / f"{out.name}.log", check="raise")
    text = (out / "train.log").read_text(encoding="utf-8", errors="replace")
    windows = [(int(m.group(1)), float(m.group(2)))
               for m in re.finditer(r"Step:\s+(\d+),.*?Tokens per Sec:\s+([\d.]+)", text)]
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "updates": max((w[0] for w in windows), default=0),
            "model": str(out), "config": str(cfg)}


def train_onmt(s: Setting, out: Path, updates: int | None = None) -> dict:
    """OpenNMT-py training in the shared setting into ``out`` (windows from its log; the model
    is the last checkpoint)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = s.fill("onmt.yaml", out.parent / f"{out.name}.yaml", updates=updates, model_dir=out)
    bin_dir = peer_venv("onmt") / "bin"
    p = run([str(bin_dir / "onmt_train"), "-config", str(cfg)], env=s.env, log=out.parent / f"{out.name}.log",
            check="raise")
    windows = [(int(m.group(1)), float(m.group(3)))
               for m in re.finditer(r"Step\s+(\d+)/\s*\d+;.*?([\d.]+)/\s*([\d.]+) tok/s", p.output)]
    ckpts = sorted(out.glob("model_step_*.pt"), key=lambda q: int(q.stem.rsplit("_", 1)[1]))
    if not ckpts:
        raise RuntimeError(f"OpenNMT-py wrote no checkpoint in {out}")
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "updates": max((w[0] for w in windows), default=0),
            "model": str(ckpts[-1])}


def train_eole(s: Setting, out: Path, updates: int | None = None) -> dict:
    """eole training in the shared setting into ``out`` (windows from its log, the same "Step N/M; ...
    SRC/TGT tok/s" line as OpenNMT-py's; the model is the folder ``out``, which eole links to its last step)."""
    shutil.rmtree(out, ignore_errors=True)
    cfg = s.fill("eole.yaml", out.parent / f"{out.name}.yaml", updates=updates, model_dir=out)
    p = run([str(peer_venv("eole") / "bin" / "eole"), "train", "-config", str(cfg)], env=s.env,
            log=out.parent / f"{out.name}.log", check="raise")
    windows = [(int(m.group(1)), float(m.group(3)))
               for m in re.finditer(r"Step\s+(\d+)/\s*\d+;.*?([\d.]+)/\s*([\d.]+) tok/s", p.output)]
    if not (out / "config.json").exists():
        raise RuntimeError(f"eole wrote no model in {out}")
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "updates": max((w[0] for w in windows), default=0), "model": str(out)}


def train_one(s: Setting, toolkit: str, rnd: int) -> dict:
    """One timed training run of ``toolkit`` (a key of setting.LABEL) in round ``rnd`` (from 0)."""
    out = s.runs / f"{toolkit}-r{rnd + 1}"
    if toolkit.startswith("attnmt"):
        return train_attnmt(s, out, precision="bf16" if toolkit == "attnmt-bf16" else "fp32")
    return {"joeynmt": train_joeynmt, "onmt": train_onmt, "eole": train_eole}[toolkit](s, out)


def timed_rounds(s: Setting, failures: list[str]) -> dict[str, dict]:
    """``s.rounds`` rounds of training every toolkit, the order alternating (A J O, then O J A,
    ...). Toolkit -> its runs and their summary: the mean of the rounds' rates, the largest peak
    RSS and other CPU load, the last run. A failed run is appended to ``failures``."""
    train: dict[str, dict] = {}
    for rnd in range(s.rounds):
        order = s.toolkits if rnd % 2 == 0 else tuple(reversed(s.toolkits))
        for tk in order:
            print(f"[bench] round {rnd + 1}/{s.rounds}: training {tk} for {s.updates} updates", flush=True)
            try:
                rec = train_one(s, tk, rnd)
            except RuntimeError as e:
                failures.append(f"train {tk} round {rnd + 1}: {e}")
                print(f"[bench] FAILED: {e}", flush=True)
                continue
            print(f"[bench]   {tk}: {rec['rate'] or 0:,.0f} tgt tok/s", flush=True)
            agg = train.setdefault(tk, {"rounds": []})
            agg["rounds"].append(rec)
    for tk, agg in train.items():
        rates = [r["rate"] for r in agg["rounds"] if r["rate"]]
        agg["round_rates"] = [r["rate"] for r in agg["rounds"]] + [None] * (s.rounds - len(agg["rounds"]))
        agg["rate"] = sum(rates) / len(rates) if rates else None
        agg["peak_rss"] = max(r["peak_rss"] for r in agg["rounds"])
        agg["process_s"] = agg["rounds"][-1]["process_s"]
        agg["last"] = agg["rounds"][-1]
    return train


def train_decode_models(s: Setting) -> dict:
    """The models the translation table compares at equal updates: attnmt (bf16 autocast, its fast
    training mode, where the CPU has bf16 kernels; else float32), OpenNMT-py and eole (float32),
    each trained for ``--decode-updates`` updates in the shared setting."""
    out = {}
    print(f"[bench] training the translation models: {s.decode_updates} updates each (not timed)", flush=True)
    out["attnmt"] = train_attnmt(s, s.runs / "attnmt-decode-model", precision="bf16" if s.bf16 else "fp32",
                                 updates=s.decode_updates)
    if "onmt" in s.toolkits:
        out["onmt"] = train_onmt(s, s.runs / "onmt-decode-model", updates=s.decode_updates)
    if "eole" in s.toolkits:
        out["eole"] = train_eole(s, s.runs / "eole-decode-model", updates=s.decode_updates)
    return out
