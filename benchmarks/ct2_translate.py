"""Translate raw text with a CTranslate2 model (run in the OpenNMT-py/CTranslate2 environment).

Raw text in, raw text out: SentencePiece pieces are made and undone here, inside the timed part,
as attnmt's, JoeyNMT's and OpenNMT-py's decoders do. Prints one JSON object on stdout:
{"lines": N, "load_seconds": ..., "decode_seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import time

t_start = time.perf_counter()

import ctranslate2  # noqa: E402
import sentencepiece as spm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="converted CTranslate2 model directory")
    ap.add_argument("--spm", required=True, help="SentencePiece model (joint)")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--compute-type", default="float32", help="float32, int8, ...")
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128, help="sentences per batch")
    ap.add_argument("--length-penalty", type=float, default=0.6)
    ap.add_argument("--max-length", type=int, default=250)
    ap.add_argument("--max-input-length", type=int, default=1024, help="source pieces kept (CTranslate2's default)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads per batch")
    ap.add_argument("--inter-threads", type=int, default=1, help="batches translated at once (CTranslate2's "
                    "inter_threads: every batch is submitted asynchronously, then collected)")
    ap.add_argument("--max-len-a", type=float, help="with --max-len-b: each batch of --batch-size sentences (sorted "
                    "by length) gets max_decoding_length = a x its longest source + b, attnmt's limit")
    ap.add_argument("--max-len-b", type=int)
    args = ap.parse_args()

    with open(args.input, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sp = spm.SentencePieceProcessor(model_file=args.spm)
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                        inter_threads=args.inter_threads, intra_threads=args.threads)
    t0 = time.perf_counter()
    pieces = sp.encode(lines, out_type=str)
    options = dict(beam_size=args.beam_size, length_penalty=args.length_penalty, max_input_length=args.max_input_length)
    if args.max_len_a is None:  # one call; CTranslate2 batches (sorted by length) and one limit for all
        results = translator.translate_batch(pieces, max_batch_size=args.batch_size, batch_type="examples",
                                             max_decoding_length=args.max_length, **options)
        hyps = [sp.decode(r.hypotheses[0]) for r in results]
    else:  # batches sorted by length, each with attnmt's length limit from its longest source (+ EOS)
        order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
        hyps = [""] * len(pieces)
        submitted = []
        for start in range(0, len(order), args.batch_size):
            batch = order[start:start + args.batch_size]
            longest = max(len(pieces[i]) + 1 for i in batch)
            limit = min(int(args.max_len_a * longest + args.max_len_b), args.max_length)
            results = translator.translate_batch([pieces[i] for i in batch], max_decoding_length=limit,
                                                 asynchronous=args.inter_threads > 1, **options)
            submitted.append((batch, results))
        for batch, results in submitted:
            for i, r in zip(batch, results):
                hyps[i] = sp.decode((r.result() if args.inter_threads > 1 else r).hypotheses[0])
    decode_seconds = time.perf_counter() - t0
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(h + "\n" for h in hyps))
    print(json.dumps({"lines": len(lines), "load_seconds": round(t0 - t_start, 3),
                      "decode_seconds": round(decode_seconds, 3)}))


if __name__ == "__main__":
    main()
