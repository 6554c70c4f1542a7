#!/usr/bin/env python3
"""Does ``torch.compile`` pay for attnmt's training on this machine? Eager against compiled.

Trains the benchmark model (benchmarks/configs/attnmt.yaml: d_model 256, 3+3 layers, 8 heads,
d_ff 512, joint SentencePiece unigram 8000, 4096-token batches) on Multi30k de->en for
``--warmup`` + ``--steps`` updates, once eager and once with the encoder and decoder stack under
``torch.compile(..., dynamic=True)`` (inductor; the loss with its output projection stays eager),
alternating ``--rounds`` times, each in a fresh process, and prints
the compile (warm-up) seconds, target tokens/s after warm-up and peak RSS of each. Token batches
change shape every step, hence ``dynamic=True``.

    .venv/bin/python benchmarks/compile_check.py --precision fp32

attnmt does not compile its model: the figures are in the record at the end of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setting import fill_template  # noqa: E402  (the suite's config templates)


def one_run(mode: str, precision: str, warmup: int, steps: int, data_dir: Path, threads: int) -> dict:
    import torch
    import yaml

    from attnmt.config import config_from_dict
    from attnmt.data.batching import make_batch, token_batches
    from attnmt.data.corpus import dataset_pair_files, encode_corpus, read_parallel
    from attnmt.data.tokenizers import PAD_ID, Tokenizer
    from attnmt.memory import peak_rss_mib, tune_allocator
    from attnmt.model.transformer import Transformer
    from attnmt.train.losses import chunked_label_smoothed_cross_entropy

    tune_allocator()
    if mode == "compile":  # the int8-mask dropout is a hand-written autograd Function that inductor cannot trace
        import attnmt.model.dropout
        attnmt.model.dropout.INT8_MASK_ON_CPU = False
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    # The suite's template (only the model section is used).
    text = fill_template("attnmt.yaml", data=".", updates=1, warmup=1, precision=precision, threads=threads,
                         log_every=1, decode_batch=1)
    cfg = config_from_dict(yaml.safe_load(text))
    src, tgt = read_parallel(*dataset_pair_files("multi30k", "de-en", "train", str(data_dir)))
    tok = Tokenizer.train(src + tgt, vocab_size=8000, model_type="unigram")
    data = encode_corpus(src, tgt, tok.encode_batch, tok.encode_batch, 100)
    model = Transformer(cfg.model, len(tok), len(tok)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def decoder_states(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, src_mask, _ = model.encode(src)
        return model.decoder.features(tgt_in, memory, src_mask)[0]  # (B, T, D)

    states_of = torch.compile(decoder_states, dynamic=True) if mode == "compile" else decoder_states
    batches = token_batches(data.lengths(), 4096, seed=1, epoch=0)
    t_start = time.monotonic()
    t0, tokens = t_start, 0
    for i, idx in enumerate(batches[: warmup + steps]):
        if i == warmup:
            t0, tokens = time.monotonic(), 0
        b = make_batch([data.src[j] for j in idx], [data.tgt[j] for j in idx])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            states = states_of(b.src, b.tgt_in)  # (B, T, D)
            loss, _ = chunked_label_smoothed_cross_entropy(
                states.flatten(0, 1), model.decoder.output_projection.weight, b.tgt_out.flatten(), 0.1, PAD_ID)
        (loss / b.num_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += b.num_tgt_tokens
    return {"mode": mode, "precision": precision, "warmup_s": round(t0 - t_start, 1),
            "tgt_tokens_per_s": round(tokens / (time.monotonic() - t0)), "peak_rss_mib": round(peak_rss_mib())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--warmup", type=int, default=20, help="updates before timing (compilation happens here)")
    ap.add_argument("--steps", type=int, default=60, help="timed updates")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"),
                    help="folder holding multi30k/train.{de,en}.gz")
    ap.add_argument("--one", choices=["eager", "compile"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.precision, args.warmup, args.steps, Path(args.data_dir),
                                 args.threads)))
        return 0
    for rnd in range(args.rounds):
        for mode in ("eager", "compile") if rnd % 2 == 0 else ("compile", "eager"):
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--precision", args.precision,
                                  "--warmup", str(args.warmup), "--steps", str(args.steps), "--threads",
                                  str(args.threads), "--data-dir", args.data_dir],
                                 capture_output=True, text=True, check=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
