"""The suite's Markdown report from its results (the dict that ``work/suite/results.json`` holds).

The report has the run's date, machine and command, the machine limit, the training and
translation tables and the notes on method; its figures are copied into the sections of
``benchmarks/RESULTS.md`` (the record of current figures).
"""

from __future__ import annotations


from setting import LABEL, MAX_OUTPUT, Setting

def gib(x: int) -> str:
    """Bytes as GiB with two decimals."""
    return f"{x / 2**30:.2f}"


def fmt(x: float | None, nd: int = 0) -> str:
    """``x`` with thousands separators and ``nd`` decimals; '–' for None."""
    return "–" if x is None else f"{x:,.{nd}f}"


def _header(s: Setting, res: dict) -> list[str]:
    """Title, date, machine, command, a warning if the machine was shared, versions, the
    machine limit and the FLOPs per target token."""
    m, probe, fl = res["machine"], res["matmul"], res["flops"]
    lines = [
        "# Benchmarks: attnmt and its peers",
        "",
        "Rewritten by the benchmark suite; do not edit by hand. Method and caveats: the docstring of",
        "`benchmarks/bench.py` and the notes at the end.",
        "",
        f"- **Date:** {res['date']}",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores ({m['isa'] or 'no AVX2 flag'}), {m['mem_gib']} GiB RAM, "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m['torch']} (CPU), no GPU; {s.threads} threads for every run",
        f"- **Command:** `{res['command']}`",
        f"- **Suite wall time:** {res['suite_minutes']:.1f} min",
    ]
    loads = [probe.get("other_cores", 0.0)] + [t.get("other_cores", 0.0) for t in res.get("train", {}).values()] \
        + [d.get("other_cores", 0.0) for d in res.get("decode", [])]
    if max(loads) > 0.05:
        lines += [
            "",
            f"> **Warning: this run shared the machine.** Other processes kept up to {max(loads):.2f} of the "
            f"{m['cores']} cores busy during it (column 'other CPU load'), so its absolute figures are low and "
            "its ratios are uncertain. Rerun the command on an idle machine.",
        ]
    lines += [
        "- **Versions:** " + "; ".join(f"{k}: " + ", ".join(f"{p} {v}" for p, v in d.items())
                                      for k, d in res["versions"].items()),
        "",
        "## Machine limit",
        "",
        f"2048x2048 matmul on {probe['threads']} threads (best of 3 one-second runs): "
        f"**{probe['fp32']:.1f} GFLOP/s float32**, **{probe['bf16']:.1f} GFLOP/s bfloat16**"
        + (f" ({probe['n_bf16']}x{probe['n_bf16']})" if probe.get("n_bf16", probe["n"]) != probe["n"] else "") + " "
        f"(other processes meanwhile: {probe.get('other_cores', 0):.2f} cores).",
        "",
    ]
    if res.get("bf16_fast") is False:
        lines += ["This CPU has no oneDNN bfloat16 kernels, so attnmt runs bf16 requests in float32 here "
                  "(`attnmt.precision.effective_precision`) and the tables have no bf16 rows.", ""]
    lines += [
        f"Model FLOPs per target token (training, analytic, formula below): **{fl['flops_per_tgt_token'] / 1e6:.1f} "
        f"MFLOP** ({100 * fl['dense_share']:.1f}% weight matmuls, the rest attention scores and values; "
        f"mean lengths {fl['mean_src_len']:.1f} source / {fl['mean_tgt_len']:.1f} target tokens with EOS).",
        "",
    ]
    return lines


def _training(s: Setting, res: dict) -> list[str]:
    """The training table (one row per toolkit) and the bf16/fp32 perplexity comparison."""
    probe, fl = res["matmul"], res["flops"]
    att = res["train"].get("attnmt", {}).get("rate")
    att16 = res["train"].get("attnmt-bf16", {}).get("rate")
    rounds_hdr = " | ".join(f"round {i + 1}" for i in range(s.rounds))
    lines = [
        f"## Training: {s.updates} updates per round, {s.rounds} rounds (order alternates), "
        "target tokens per second",
        "",
        f"| toolkit | {rounds_hdr} | tgt tok/s | attnmt fp32 / this | attnmt bf16 / this | MFU | valid ppl | "
        "peak RSS GiB | process s (last round) | other CPU load |",
        "| --- | " + " | ".join("---:" for _ in range(s.rounds)) + " | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for tk, t in res["train"].items():
        peak = probe["bf16"] if tk == "attnmt-bf16" else probe["fp32"]
        mfu = t["rate"] * fl["flops_per_tgt_token"] / (peak * 1e9) if t["rate"] else None
        ratios = " | ".join(f"{a / t['rate']:.2f}" if a and t["rate"] else "–" for a in (att, att16))
        ppl = t["last"].get("valid_ppl")
        per_round = " | ".join(fmt(r) for r in t["round_rates"])
        lines.append(f"| {LABEL.get(tk, tk)} | {per_round} | **{fmt(t['rate'])}** | {ratios} | "
                     f"{fmt(100 * mfu, 1) + '%' if mfu else '–'} | {fmt(ppl, 2) if ppl else '–'} | "
                     f"{gib(t['peak_rss'])} | {t['process_s']:.0f} | {t.get('other_cores', 0.0):.2f} |")
    p32 = res["train"].get("attnmt", {}).get("last", {}).get("valid_ppl")
    p16 = res["train"].get("attnmt-bf16", {}).get("last", {}).get("valid_ppl")
    lines += [""]
    if p32 and p16:
        lines += [f"Validation perplexity (val split, 1014 sentences) after the last round's {s.updates} updates: "
                  f"bf16 autocast {p16:.2f}, float32 {p32:.2f}, a difference of {100 * (p16 / p32 - 1):+.1f}%.",
                  ""]
    return lines


def _translation(s: Setting, res: dict) -> list[str]:
    """The translation table (one row per system and model), the translation models, BLEU's
    signature."""
    lines = [
        f"## Translation: test_2016_flickr de->en ({res['test_lines']} sentences), beam 5, raw text to raw text, "
        f"batches of {s.decode_batch} sentences; decode s: the fastest of {s.decode_rounds} rounds "
        "(order alternating; every round in brackets)",
        "",
        "| system | model | decode s | / CTranslate2 float32 | process s | BLEU | peak RSS GiB | other CPU load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ct2 = next((d["decode_s"] for d in res["decode"] if d["system"] == "CTranslate2 float32"), None)
    for d in res["decode"]:
        rel = f"{d['decode_s'] / ct2:.2f}" if ct2 else "–"
        each = d.get("decode_rounds", [d["decode_s"]])
        each_s = f" ({', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else ""
        lines.append(f"| {d['system']} | {d['model']} | {d['decode_s']:.2f}{each_s} | {rel} | {d['process_s']:.1f} | "
                     f"{d['bleu']:.2f} | {gib(d['peak_rss'])} | {d.get('other_cores', 0.0):.2f} |")
    for tk, r in res.get("decode_models", {}).items():
        lines += ["",
                  f"Translation model of {LABEL.get(tk, tk)}: {r['updates']} updates"
                  + (" in bf16 autocast" if r.get("precision") == "bf16" else " in float32")
                  + f", trained by the suite in {r['process_s'] / 60:.1f} min (peak RSS {gib(r['peak_rss'])} GiB)"
                  + (f", validation perplexity {r['valid_ppl']:.2f}" if r.get("valid_ppl") else "") + "."]
    if res.get("ct2_convert_s") is not None:
        lines += ["", f"OpenNMT-py -> CTranslate2 conversion: {res['ct2_convert_s']:.1f} s (not in the table)."]
    sig = res["decode"][0]["bleu_signature"]
    lines += ["", f"BLEU: sacreBLEU `{sig}` on the detokenized output against the raw references.", ""]
    return lines


def _notes(s: Setting, res: dict) -> list[str]:
    """The notes on method: the shared setting, throughput, MFU, decode seconds, memory, load."""
    m, fl = res["machine"], res["flops"]
    return [
        "## Notes",
        "",
        "- **Same setting for every toolkit** (`benchmarks/configs/`): Multi30k de->en train split, one joint "
        "SentencePiece unigram model of 8000 pieces (trained once with attnmt's settings and given to JoeyNMT and "
        "OpenNMT-py; attnmt trains the same one itself), d_model 256, 3+3 layers, 8 heads, d_ff 512, pre-norm, "
        "dropout 0.1 (attention 0.1), sinusoidal positions, source/target embeddings and output projection tied, "
        "batches of 4096 tokens (sentences x longest side), Adam (0.9, 0.98) with the noam schedule "
        f"(factor 1, {s.warmup} warm-up updates), label smoothing 0.1, gradient norm clipped at 1, float32, "
        f"sequences up to 100 subwords, OMP/MKL threads {s.threads}; no validation during the timed updates.",
        "- **Throughput** is each toolkit's own windowed count of non-padding target tokens (EOS included) per "
        f"wall-clock second, logged every {s.log_every} updates; the first window of every run is dropped "
        "(warm-up), the others are combined as total tokens / total time, then averaged over rounds. "
        "JoeyNMT's batches are not length-bucketed (its token sampler draws random sentences), so more of its "
        "4096-token budget is padding: that is part of what is measured. 'process s' includes start-up "
        "(attnmt trains its SentencePiece model in-process; the peers load the prepared one).",
        "- **MFU** = tgt tok/s x model FLOPs per target token / measured float32 matmul GFLOP/s (bfloat16 for a "
        "bf16 row). Model FLOPs per target token = 3 x forward (backward = 2 x forward), summed over the "
        "training corpus and divided by its target tokens: forward of a pair with S source and T target tokens "
        "= 2 W_src S + 2 W_tgt T + 4 D (L_e S^2 + L_d (T^2 + T S)), with "
        f"W_src = L_e (4D^2 + 2DF) + L_d 2D^2 = {fl['w_src']:,} and W_tgt = L_d (6D^2 + 2DF) + DV = {fl['w_tgt']:,} "
        "(D 256, F 512, L_e = L_d = 3, V 8000); the full T x T decoder self-attention is counted; embeddings, "
        f"biases, norms, softmax and loss are not. For comparison, the '6N' rule gives {fl['approx_6N'] / 1e6:.1f} "
        "MFLOP per target token.",
        "- **Decode seconds** are as each toolkit times its own translation loop (tokenization and "
        "detokenization included; model loading excluded): attnmt's 'translated N lines in X s', JoeyNMT's "
        "'Generation took', OpenNMT-py's average translation time x sentences (-report_time), and for "
        "CTranslate2 the time around `translate_batch` plus SentencePiece in `benchmarks/ct2_translate.py`. "
        "Process seconds are the whole command, Python start-up and model loading included. Length penalty "
        "alpha 0.6 (GNMT form for attnmt, JoeyNMT and OpenNMT-py; CTranslate2's own length normalisation with "
        "exponent 0.6). Output caps: attnmt 1.5 S + 10 subwords, JoeyNMT 1.5 x the batch's longest source, "
        f"OpenNMT-py and CTranslate2 {MAX_OUTPUT}. attnmt and OpenNMT-py translate with models trained for the "
        "same number of updates in the shared setting (`--decode-updates`, so CTranslate2 runs a model of the "
        "same size and quality as attnmt's); JoeyNMT translates with its last timed-round model (training it "
        "further would take the suite ~40 min more), and a model of a few hundred updates emits long outputs "
        "up to the caps, so that row decodes more tokens.",
        "- **Peak RSS** is the summed VmRSS of the process tree, polled every 0.1 s.",
        "- **Other CPU load** is the mean number of cores that processes outside the benchmark kept busy during "
        "that run (machine busy time from /proc/stat minus the benchmark's own CPU time): anything above ~0.05 "
        f"means the run shared the {m['cores']} cores and its figures are low.",
        "",
    ]


def render(s: Setting, res: dict) -> str:
    """The suite's report (Markdown, ending in a newline)."""
    lines = _header(s, res)
    if res.get("train"):
        lines += _training(s, res)
    if res.get("decode"):
        lines += _translation(s, res)
    if res.get("failures"):
        lines += ["## Failures", ""] + [f"- {f.splitlines()[0]}" for f in res["failures"]] + [""]
    lines += _notes(s, res)
    return "\n".join(lines)


def write_results(s: Setting, res: dict) -> None:
    """Write the report of ``res`` to ``s.results``."""
    s.results.parent.mkdir(parents=True, exist_ok=True)
    s.results.write_text(render(s, res), encoding="utf-8")
    print(f"[bench] wrote {s.results}", flush=True)
