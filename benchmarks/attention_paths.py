#!/usr/bin/env python3
"""Which attention kernel translates faster on this machine: the explicit formula or the fused one?

``decode.attention`` chooses, for translation, between the explicit formula of equation 1
(``attnmt.model.attention.scaled_dot_product_attention``) and PyTorch's fused
``scaled_dot_product_attention`` kernel. This script translates test_2016_flickr de->en (1000
sentences) with beam 5 and batches of 128 sentences, in one process, with each variant in turn
(the order alternating between rounds), and prints the decode seconds of every round, the
median per variant and whether the outputs are identical. Variants: 'explicit' and 'fused'
everywhere, and 'fused encoder' (fused in the encoder, explicit in the decoder).

    .venv/bin/python benchmarks/attention_paths.py --model RUN_DIR --rounds 3

``--model`` is any model directory of ``attnmt train`` (``benchmarks/ab_train.py`` leaves one
under benchmarks/work/ab/runs/). Not part of the suite; results go to RESULTS.md's record by hand.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

VARIANTS = {"explicit": (False, False), "fused": (True, True), "fused encoder": (True, False)}  # (encoder, decoder)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model directory written by 'attnmt train'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"),
                    help="folder holding multi30k/test_2016_flickr.de.gz (default $ATTNMT_DATA)")
    args = ap.parse_args()

    from attnmt.data.corpus import read_lines
    from attnmt.decode.translator import Translator
    from attnmt.memory import tune_allocator

    tune_allocator()
    import torch

    torch.set_num_threads(args.threads)
    sentences = read_lines(Path(args.data_dir) / "multi30k" / "test_2016_flickr.de.gz")
    tr = Translator.from_dir(args.model)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, beam {args.beam_size}")
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    outputs: dict[str, list[str]] = {}
    names = list(VARIANTS)
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            tr.model.set_fused_attention(*VARIANTS[name])
            t0 = time.perf_counter()
            out = [t.text for t in tr.translate(sentences, beam_size=args.beam_size, batch_size=128)]
            seconds[name].append(time.perf_counter() - t0)
            outputs.setdefault(name, out)
            print(f"round {rnd + 1} {name:<14} {seconds[name][-1]:7.2f} s", flush=True)
    for name in names:
        same = sum(a == b for a, b in zip(outputs[name], outputs["explicit"]))
        print(f"{name:<14} median {statistics.median(seconds[name]):7.2f} s "
              f"({statistics.median(seconds[name]) / statistics.median(seconds['explicit']):.3f}x explicit); "
              f"{same}/{len(sentences)} outputs identical to explicit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
