"""Control over the output on Multi30k de->en: constraints, alignments (docs/control.md).

Three measurements with a trained de->en model directory (``--model``), in one process:

1. Terminology constraints on the first ``--sentences`` test_2016_flickr sentences, 1 or 2 seeded
   phrases each from its reference (:func:`draw_constraints`): the share of phrases present in the
   constrained output (as token ids, as text), BLEU and decode seconds with and without them.
2. The alignment layer: each decoder layer's word alignments (``attnmt.decode.alignment``) of
   reference translations (forced decoding) against hand-made links (:data:`GOLD`): the share of
   annotated target words aligned to a gold source word.
3. Streaming: seconds until the first word of the longest test_2016 sentence is final (as the
   server streams, ``attnmt.serve.stream.WordStream``) against the whole translation's.

Records each figure: ``python -m benchmarks quality --part control --model DIR``.
"""

from __future__ import annotations

import random
import re
import time

from attnmt.data.tokenizers import EOS_ID
from attnmt.decode.alignment import align_words, word_ids
from attnmt.decode.translator import Translator
from attnmt.evaluate import corpus_scores
from attnmt.serve.stream import WordStream
from harness import corpus, model_dir, read_lines, record

README_SENTENCE = "Ein Mann fährt mit dem Fahrrad die Straße entlang."

# Hand-checked links (source word - target word, 0-based whitespace words) of content words in
# test_2016_flickr pairs (line number: links), and of the README sentence with a reference.
GOLD = {
    1: "0-0 1-1 4-4 5-5 8-6 7-8",
    2: "0-0 1-1 2-2 3-4 5-6 5-7 6-8 9-13 10-14",
    3: "0-0 1-1 2-2 4-3 4-4 5-5 7-7 8-8 10-11",
    5: "0-0 1-2 2-3 3-4 5-7",
    7: "0-0 1-1 2-2 3-3 4-4 7-9",
    9: "0-0 1-1 2-2 3-3 4-4 5-5",
    10: "0-0 1-1 2-2 3-3 4-4 5-6 8-9 9-10 10-11 11-12",
    11: "0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8 9-9 11-10",
}
README_REFERENCE = ("A man rides a bike down the street.", "0-0 1-1 2-2 5-4 6-6 7-7")


def _word(w: str) -> str:
    return re.sub(r"^\W+|\W+$", "", w)


def draw_constraints(reference: str, output: str, rng: random.Random) -> list[str]:
    """1 or 2 phrases from ``reference``: a word (punctuation stripped, 3 letters or more) that ``output``
    lacks (where it has them all, any word), alone or at random with the next one as a bigram."""
    ref = [_word(w) for w in reference.split()]
    have = {_word(w) for w in output.split()}
    pool = [k for k, w in enumerate(ref) if len(w) >= 3 and w.isalpha() and w not in have] or \
        [k for k, w in enumerate(ref) if w]
    phrases: list[str] = []
    for k in rng.sample(pool, min(len(pool), rng.choice([1, 2]))):
        bigram = k + 1 < len(ref) and ref[k + 1] and rng.random() < 0.5
        phrase = f"{ref[k]} {ref[k + 1]}" if bigram else ref[k]
        if phrase not in phrases:
            phrases.append(phrase)
    return phrases


def _contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[k:k + len(phrase)] == phrase for k in range(len(tokens) - len(phrase) + 1))


def constraints_figure(tr: Translator, src: list[str], ref: list[str], beam_size: int, seed: int) -> dict:
    t0 = time.perf_counter()
    plain = [t.text for t in tr.translate(src, beam_size=beam_size)]
    plain_s = time.perf_counter() - t0
    rng = random.Random(seed)
    constraints = [draw_constraints(r, o, rng) for r, o in zip(ref, plain)]
    t0 = time.perf_counter()
    constrained = tr.translate(src, beam_size=beam_size, constraints=constraints)
    constrained_s = time.perf_counter() - t0
    phrases = sum(len(c) for c in constraints)
    as_tokens = sum(_contains(t.hypotheses[0].token_ids, tr.tgt_tokenizer.encode(p))
                    for t, c in zip(constrained, constraints) for p in c)
    as_text = sum(p in t.text for t, c in zip(constrained, constraints) for p in c)
    return {"sentences": len(src), "phrases": phrases, "present_tokens": as_tokens / phrases, "present_text": as_text / phrases,
            "bleu_plain": corpus_scores(plain, ref)["bleu"],
            "bleu_constrained": corpus_scores([t.text for t in constrained], ref)["bleu"],
            "seconds_plain": round(plain_s, 2), "seconds_constrained": round(constrained_s, 2)}


def layer_figure(tr: Translator, pairs: list[tuple[str, str, str]]) -> dict:
    """Per decoder layer: the share of gold-annotated target words aligned to a gold source word."""
    layers = tr.config.model.num_decoder_layers
    hits, total = [0] * layers, 0
    for src, tgt, gold in pairs:
        links: dict[int, set[int]] = {}
        for link in gold.split():
            i, j = map(int, link.split("-"))
            links.setdefault(j, set()).add(i)
        src_ids = tr.encode_sources([src])[0]
        tgt_ids = tr.tgt_tokenizer.encode(tgt) + [EOS_ID]
        att = tr.source_attention(src_ids, tgt_ids)  # (L, H, T, S)
        src_words = word_ids(src_ids[:-1], tr.src_tokenizer.decode)
        tgt_words = word_ids(tgt_ids[:-1], tr.tgt_tokenizer.decode)
        total += len(links)
        for layer in range(layers):
            aligned = dict((j, i) for i, j in align_words(att[layer].mean(dim=0), src_words, tgt_words))
            hits[layer] += sum(aligned.get(j) in gold_i for j, gold_i in links.items())
    return {"links": total, "accuracy_by_layer": {layer + 1: round(h / total, 3) for layer, h in enumerate(hits)}}


def streaming_figure(tr: Translator, sentence: str, beam_size: int) -> dict:
    """Seconds to the first final word and to the whole translation of ``sentence``."""
    words = WordStream(tr.tgt_tokenizer.decode)
    first: list[float] = []

    def on_step(i: int, tokens: list[int]) -> bool:
        if not first and words.update(tokens):
            first.append(time.perf_counter())
        return False

    t0 = time.perf_counter()
    out = tr.translate([sentence], beam_size=beam_size, on_step=on_step)[0]
    total = time.perf_counter() - t0
    return {"beam_size": beam_size, "words": len(out.text.split()), "first_word_s": round(first[0] - t0, 3)
            if first else None, "total_s": round(total, 3)}


def add_arguments(p) -> None:
    p.add_argument("--sentences", type=int, default=200, help="control: test sentences given constraints")
    p.add_argument("--beam-size", type=int, default=5, help="control")
    p.add_argument("--threads", type=int, default=2, help="control")


def run(args) -> None:
    """Constraints, the alignment layer and streaming, each figure recorded."""
    import torch

    if args.smoke:
        args.sentences = 5
    torch.set_num_threads(args.threads)
    tr = Translator.from_dir(model_dir(args.model))
    test = {lang: read_lines(corpus(args, "test_2016_flickr", lang)) for lang in ("de", "en")}
    src, ref = test["de"][:args.sentences], test["en"][:args.sentences]
    cons = constraints_figure(tr, src, ref, args.beam_size, args.seed)
    pairs = [(test["de"][n - 1], test["en"][n - 1], g) for n, g in GOLD.items()] + [(README_SENTENCE, *README_REFERENCE)]
    layers = layer_figure(tr, pairs)
    stream = [streaming_figure(tr, max(test["de"], key=len), k) for k in (1, args.beam_size)]
    section = "Terminology constraints"
    for column, key in (("as tokens", "present_tokens"), ("as text", "present_text")):
        record(args, section, "phrases present in the output", column, round(cons[key], 3), "share",
               phrases=cons["phrases"], sentences=cons["sentences"])
    for column, kind in (("without constraints", "plain"), ("with constraints", "constrained")):
        record(args, section, "sacreBLEU", column, round(cons[f"bleu_{kind}"], 2), "BLEU", sentences=cons["sentences"])
        record(args, section, "decode s", column, cons[f"seconds_{kind}"], "s", sentences=cons["sentences"],
               threads=args.threads)
    for layer, share in layers["accuracy_by_layer"].items():
        record(args, "Word alignment layer", "gold links hit", f"layer {layer}", share, "share", links=layers["links"])
    for r in stream:
        column = "greedy" if r["beam_size"] == 1 else f"beam {r['beam_size']}"
        if r["first_word_s"] is not None:
            record(args, "Streaming: first word", "first word s", column, r["first_word_s"], "s", words=r["words"])
        record(args, "Streaming: first word", "whole translation s", column, r["total_s"], "s", words=r["words"])
