"""A multilingual model on every direction of Multi30k test_2016_flickr (issue 41's table).

For each pair of the model's languages present in the data (de, en, fr, cs), BLEU and chrF
(sacreBLEU) of:

- the multilingual model directly (``Translator.translate(..., tgt_lang=...)``): a trained
  direction, or zero-shot (de->fr, fr->de, cs->de, ...);
- for a zero-shot direction, the pivot through English with the same model (src->en, then
  en->tgt), the baseline a zero-shot direction is compared with;
- a bilingual model of the same direction where one is given (``--bilingual de-en=runs/de-en``),
  e.g. the de-en, en-de and en-fr presets trained in the same CPU budget.

Beam size, length penalty and stopping rule are each model's own (its config's decode
section). Prints a Markdown table and one JSON object.

Usage (from the repository root, after ``attnmt train configs/multi30k_multilingual.yaml
--output runs/multilingual``):
    .venv/bin/python benchmarks/multilingual.py --model runs/multilingual --data "$ATTNMT_DATA" \\
        --bilingual de-en=runs/de-en
A check at tiny size: ``--limit 20``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from attnmt.decode.translator import Translator
from attnmt.evaluate import corpus_scores
from attnmt.languages import served_languages

PIVOT = "en"


def read(data: Path, lang: str, limit: int | None) -> list[str]:
    lines = gzip.decompress((data / "multi30k" / f"test_2016_flickr.{lang}.gz").read_bytes()).decode().splitlines()
    return lines[:limit]


def trained_directions(tr: Translator) -> set[tuple[str, str]]:
    """The (source, target) pairs the model's training data held."""
    from attnmt.languages import corpus_directions

    return {d for d in corpus_directions(tr.config) if None not in d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the multilingual model directory")
    parser.add_argument("--data", required=True, type=Path, help="the directory holding multi30k/")
    parser.add_argument("--bilingual", action="append", default=[], metavar="SRC-TGT=DIR",
                        help="a bilingual model of one direction, to compare with")
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    args = parser.parse_args()

    tr = Translator.from_dir(args.model)
    sources, targets = served_languages(tr.config)
    available = [lang for lang in ("de", "en", "fr", "cs") if lang in set(sources) | set(targets)]
    text = {lang: read(args.data, lang, args.limit) for lang in available}
    trained = trained_directions(tr)
    bilingual = dict(item.split("=", 1) for item in args.bilingual)
    rows = []
    for src in available:
        for tgt in available:
            if src == tgt or src not in sources or tgt not in targets:
                continue
            hyps = [t.text for t in tr.translate(text[src], tgt_lang=tgt)]
            row = {"direction": f"{src}-{tgt}", "trained": (src, tgt) in trained,
                   **{f"direct_{k}": v for k, v in _scores(hyps, text[tgt]).items()}}
            if (src, tgt) not in trained and PIVOT not in (src, tgt) and PIVOT in targets:
                english = [t.text for t in tr.translate(text[src], tgt_lang=PIVOT)]
                pivot = [t.text for t in tr.translate(english, tgt_lang=tgt)]
                row.update({f"pivot_{k}": v for k, v in _scores(pivot, text[tgt]).items()})
            if f"{src}-{tgt}" in bilingual:
                other = Translator.from_dir(bilingual[f"{src}-{tgt}"])
                hyps = [t.text for t in other.translate(text[src])]
                row.update({f"bilingual_{k}": v for k, v in _scores(hyps, text[tgt]).items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| direction | kind | multilingual BLEU / chrF | pivot via en BLEU / chrF | bilingual BLEU / chrF |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        cells = [_cell(r, "direct"), _cell(r, "pivot"), _cell(r, "bilingual")]
        print(f"| {r['direction']} | {'trained' if r['trained'] else 'zero-shot'} | " + " | ".join(cells) + " |")
    print(json.dumps({"model": args.model, "sentences": len(text[available[0]]), "rows": rows}))


def _scores(hyps: list[str], refs: list[str]) -> dict:
    scores = corpus_scores(hyps, refs)
    return {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2)}


def _cell(row: dict, kind: str) -> str:
    return f"{row[kind + '_bleu']:.2f} / {row[kind + '_chrf']:.2f}" if f"{kind}_bleu" in row else "-"


if __name__ == "__main__":
    main()
