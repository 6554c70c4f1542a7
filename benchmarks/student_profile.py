"""Where a distilled student's CTranslate2 time goes: the encoder's share, and what a target
vocabulary shortlist saves (issue 42: which lever makes a student faster).

On test_2016_flickr de->en repeated ``--repeat`` times (3,000 lines by default), greedy, batches
of 128, ``ctranslate2.Translator.translate_batch`` called directly on a CTranslate2 export of the
student (``attnmt export ctranslate2 --quantization int8``), 2 intra-op threads, every row timed
in each of ``--rounds`` alternating rounds (fastest kept):

- ``full``: the whole greedy search;
- ``encoder + first step``: ``max_decoding_length=1``, the encoder and one decoder step;
- ``shortlist N + M``: CTranslate2's vocabulary map (``use_vmap``, the ``vmap.txt`` of a copy of
  the export): the output layer restricted, per batch, to the union of the ``M`` most frequent
  target pieces and, for each source piece of the batch, the ``N`` target pieces that co-occur
  with it most in the training pairs (Dice's coefficient over sentence pairs). Built here from
  ``--corpus-src`` / ``--corpus-tgt`` (e.g. the distilled corpus the student learnt from):
  CTranslate2 reads such maps but ships no tool to build them, and a word aligner would only
  rank the same candidates differently.

BLEU (sacreBLEU) on the first pass over test2016 shows what a shortlist costs. Prints a Markdown
table and one JSON object; figures go to RESULTS.md only from an otherwise idle machine.

Usage (from the repository root):
    .venv/bin/python benchmarks/student_profile.py --export STUDENT_CT2_INT8 --data "$ATTNMT_DATA" \\
        --corpus-src $ATTNMT_DATA/multi30k/train.de.gz --corpus-tgt STUDENT/distill/train.tgt
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
import time
from pathlib import Path

import ctranslate2
import sacrebleu
import sentencepiece as spm

HERE = Path(__file__).resolve().parent


def _read(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def write_shortlist(sp: spm.SentencePieceProcessor, src: list[str], tgt: list[str], per_source: int,
                    common: int, out: Path) -> None:
    """A CTranslate2 vocabulary map: an empty key with the ``common`` most frequent target pieces
    (always candidates), then each source piece with its ``per_source`` best target pieces by
    Dice's coefficient 2 c(s, t) / (c(s) + c(t)), counted over sentence pairs."""
    src_count, tgt_count = collections.Counter(), collections.Counter()
    pair_count: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for s_pieces, t_pieces in zip(sp.encode(src, out_type=str), sp.encode(tgt, out_type=str)):
        s_set, t_set = set(s_pieces), set(t_pieces)
        src_count.update(s_set)
        tgt_count.update(t_set)
        for piece in s_set:
            pair_count[piece].update(t_set)
    lines = ["\t" + " ".join(piece for piece, _ in tgt_count.most_common(common))]
    for piece, counts in pair_count.items():
        best = sorted(counts, key=lambda t: -2 * counts[t] / (src_count[piece] + tgt_count[t]))[:per_source]
        lines.append(piece + "\t" + " ".join(best))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, required=True, help="the student's CTranslate2 export (with spm.model)")
    ap.add_argument("--data", type=Path, required=True, help="directory holding multi30k/")
    ap.add_argument("--corpus-src", type=Path, required=True, help="training sources for the shortlist (.gz or text)")
    ap.add_argument("--corpus-tgt", type=Path, required=True, help="their targets, line-aligned")
    ap.add_argument("--shortlists", default="20:200,3:20", help="PER_SOURCE:COMMON pairs, comma-separated")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "student_profile")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    sp = spm.SentencePieceProcessor(model_file=str(args.export / "spm.model"))
    test = _read(args.data / "multi30k" / "test_2016_flickr.de.gz")
    refs = _read(args.data / "multi30k" / "test_2016_flickr.en.gz")
    pieces = [p + ["</s>"] for p in sp.encode(test * args.repeat, out_type=str)]
    rows: dict[str, tuple[Path, dict]] = {"full": (args.export, {}),
                                          "encoder + first step": (args.export, {"max_decoding_length": 1})}
    corpus_src, corpus_tgt = _read(args.corpus_src), _read(args.corpus_tgt)
    for spec in args.shortlists.split(","):
        per_source, common = (int(x) for x in spec.split(":"))
        model = args.work / f"shortlist-{per_source}-{common}"
        shutil.copytree(args.export, model)
        write_shortlist(sp, corpus_src, corpus_tgt, per_source, common, model / "vmap.txt")
        rows[f"shortlist {per_source} + {common}"] = (model, {"use_vmap": True})
    times: dict[str, list[float]] = {name: [] for name in rows}
    bleu: dict[str, float] = {}
    for r in range(args.rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            model, options = rows[name]
            translator = ctranslate2.Translator(str(model), device="cpu", inter_threads=1, intra_threads=args.threads)
            start = time.perf_counter()
            out = translator.translate_batch(pieces, max_batch_size=128, beam_size=1, **options)
            times[name].append(time.perf_counter() - start)
            if name != "encoder + first step":
                hyps = [sp.decode(o.hypotheses[0]) for o in out[:len(refs)]]
                bleu[name] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
            print(json.dumps({name: round(times[name][-1], 2)}), flush=True)
    full = min(times["full"])
    print(f"\n{len(pieces)} lines, greedy, batches of 128, {args.threads} threads\n")
    print("| row | seconds (fastest) | of full | BLEU |\n| --- | ---: | ---: | ---: |")
    for name in rows:
        print(f"| {name} | {min(times[name]):.2f} | {min(times[name]) / full:.0%} | {bleu.get(name, '-')} |")
    print(json.dumps({"seconds": {k: [round(t, 2) for t in v] for k, v in times.items()}, "bleu": bleu}))


if __name__ == "__main__":
    main()
