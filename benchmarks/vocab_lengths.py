"""What a vocabulary costs a decoder: pieces per test sentence under joint and separate SentencePiece models.

Every decoder step pays for the output projection, its log-softmax and its top-k over the target
vocabulary, and a translation takes one step per target piece. This script trains unigram
SentencePiece models on Multi30k train (``attnmt.data.tokenizers.Tokenizer.train``, the settings
``attnmt prepare`` uses): one joint model of each size in ``--joint`` on both sides, and one model
per language of each size in ``--separate``; for each it prints the pieces of test_2016_flickr
per language (the decoder's steps when that language is the target, EOS aside) and how many
distinct pieces each language's train side uses. The fast de-en preset's separate 4,000-piece
vocabularies were chosen with it (benchmarks/RESULTS.md).

Usage (from the repository root):
    .venv/bin/python benchmarks/vocab_lengths.py --data "$ATTNMT_DATA" --pair de-en --joint 8000 4000 --separate 4000
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from attnmt.data.tokenizers import Tokenizer


def _lines(data: Path, split: str, lang: str) -> list[str]:
    return gzip.decompress((data / "multi30k" / f"{split}.{lang}.gz").read_bytes()).decode().splitlines()


def _measure(tok: Tokenizer, train: list[str], test: list[str]) -> dict:
    return {"test_pieces": sum(map(len, tok.encode_batch(test))),
            "train_pieces_used": len({i for ids in tok.encode_batch(train) for i in ids})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="the directory holding multi30k/")
    parser.add_argument("--pair", default="de-en")
    parser.add_argument("--joint", type=int, nargs="*", default=[8000, 4000], help="joint vocabulary sizes")
    parser.add_argument("--separate", type=int, nargs="*", default=[4000], help="per-language vocabulary sizes")
    args = parser.parse_args()
    langs = args.pair.split("-")
    train = {lang: _lines(args.data, "train", lang) for lang in langs}
    test = {lang: _lines(args.data, "test_2016_flickr", lang) for lang in langs}
    for size in args.joint:
        tok = Tokenizer.train([line for lang in langs for line in train[lang]], size)
        print(json.dumps({"vocabulary": f"joint {size}",
                          **{lang: _measure(tok, train[lang], test[lang]) for lang in langs}}), flush=True)
    for size in args.separate:
        print(json.dumps({"vocabulary": f"separate {size}",
                          **{lang: _measure(Tokenizer.train(train[lang], size), train[lang], test[lang])
                             for lang in langs}}), flush=True)


if __name__ == "__main__":
    main()
