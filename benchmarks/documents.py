"""translate --part documents: paragraphs split into sentences, HTML with inline tags, and a
document's speed against the same sentences as lines (``attnmt translate --input-format``).

- Paragraphs: test_2016_flickr grouped four by four into 250 paragraphs (one per line, a blank
  line between them) translated with ``--split-sentences``; the same sentences translated one per
  line and joined the same way; and the paragraphs as lines without splitting. BLEU of each
  against the references joined the same way, and whether every blank line came back; how many
  paragraphs the model's splitter (the rules and the model's learned sentence starts,
  ``attnmt.data.sentence_model``) and the rules alone cut into exactly their four sentences.
- HTML: each sentence in a ``<p>``, one word wrapped in ``<b>``, ``<a href>`` or ``<i>`` (the
  longest alphabetic word after the first); text BLEU with the tags removed, and the share of
  tags that end around the word's translation: the wrapped word translated on its own (articles
  dropped) is what the tag should hold, counted where that translation appears in the sentence's.
- Speed: the paragraph document's decode seconds over the lines' (fastest of ``--rounds``).
"""

from __future__ import annotations

import re
from pathlib import Path

import harness as h

from attnmt.data import sentence_model
from attnmt.documents.sentences import split

SECTION = "Documents"
DOCUMENT_SECONDS = re.compile(r"translated \S+ \(\w+\) in ([\d.]+) s")
TAGS = ("<b>{word}</b>", '<a href="#w{k}">{word}</a>', "<i>{word}</i>")
ARTICLES = {"a", "an", "the"}


def _grouped(lines: list[str], n: int = 4) -> list[str]:
    return [" ".join(lines[i:i + n]) for i in range(0, len(lines), n)]


def _tagged(sentence: str, k: int) -> tuple[str, str | None]:
    """The sentence with its longest alphabetic word after the first wrapped in a tag, and that word."""
    words = sentence.split()
    candidates = [i for i, w in enumerate(words) if i > 0 and w.isalpha()]
    if not candidates:
        return sentence, None
    i = max(candidates, key=lambda j: (len(words[j]), -j))
    words[i] = TAGS[k % len(TAGS)].format(word=words[i], k=k)
    return " ".join(words), sentence.split()[i]


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"\w+", text.lower()) if w not in ARTICLES]


def run(args) -> None:
    from bs4 import BeautifulSoup

    out = args.out
    lines = h.read_lines(h.corpus(args, "test_2016_flickr", "de"), args.limit)
    refs = h.read_lines(h.corpus(args, "test_2016_flickr", "en"), args.limit)
    src = h.write_lines(out / "test.de", lines)
    paragraphs = _grouped(lines)
    doc = out / "paragraphs.de"
    doc.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    ref = h.write_lines(out / "paragraphs.ref.en", _grouped(refs))
    opts = dict(beam=args.beam, batch=args.batch_size, threads=args.threads, device="cpu")

    def document(path: Path, target: Path, **extra):
        p = h.run(h.translate_cmd(args.model, path, target, **opts, **extra))
        found = DOCUMENT_SECONDS.search(p.output)
        return {"seconds": p.seconds, "decode_seconds": float(found.group(1)) if found else float("nan")}

    best = h.alternate({"lines": lambda: h.translate(args.model, src, out / "lines.en", **opts),
                        "document": lambda: document(doc, out / "split.en", input_format="lines",
                                                     split_sentences=True)}, args.rounds)
    joined = h.write_lines(out / "lines.joined.en", _grouped(h.read_lines(out / "lines.en")))
    split_text = (out / "split.en").read_text(encoding="utf-8")
    split_paragraphs = split_text.rstrip("\n").split("\n\n")
    split_hyp = h.write_lines(out / "split.paragraphs.en", split_paragraphs)
    unsplit = h.translate(args.model, h.write_lines(out / "paragraphs.lines.de", paragraphs), out / "unsplit.en",
                          **opts)["output"]
    settings = dict(lines=len(lines), beam=args.beam, threads=args.threads)
    for figure, hyp in (("paragraphs, --split-sentences", split_hyp), ("sentences as lines, joined", joined),
                        ("paragraphs as lines, not split", unsplit)):
        h.record(args, SECTION, figure, "BLEU", round(h.bleu(hyp, ref)["bleu"], 2), "BLEU", **settings)
    for figure, starts in (("paragraphs, --split-sentences", sentence_model.starts_of(args.model)),
                           ("paragraphs, split by the rules alone", None)):
        learned = starts(paragraphs) if starts else [None] * len(paragraphs)
        exact = sum([p[a:b] for a, b in split(p, "de", found)] == lines[i:i + 4]
                    for p, found, i in zip(paragraphs, learned, range(0, len(lines), 4)))
        h.record(args, SECTION, figure, "paragraphs split into their sentences", exact, "paragraphs",
                 **settings)
    same_layout = split_text.count("\n") == doc.read_text(encoding="utf-8").count("\n")
    h.record(args, SECTION, "paragraphs, --split-sentences", "line breaks kept", int(same_layout), "bool", **settings)
    ratio = best["document"]["decode_seconds"] / best["lines"]["decode_seconds"]
    for figure, key in (("paragraphs, --split-sentences", "document"), ("sentences as lines, joined", "lines")):
        h.record(args, SECTION, figure, "decode s", round(best[key]["decode_seconds"], 2), "s", **settings)
    h.record(args, SECTION, "paragraphs, --split-sentences", "time / lines' time", round(ratio, 3), "ratio", **settings)

    tagged = [_tagged(s, k) for k, s in enumerate(lines)]
    html = out / "tagged.html"
    html.write_text("<html><body>\n" + "".join(f"<p>{t}</p>\n" for t, _ in tagged) + "</body></html>\n",
                    encoding="utf-8")
    h.translate(args.model, html, out / "tagged.en.html", **opts)
    words = [w for _, w in tagged if w]
    alone = h.read_lines(h.translate(args.model, h.write_lines(out / "words.de", words), out / "words.en",
                                     **opts)["output"])
    soup = BeautifulSoup((out / "tagged.en.html").read_text(encoding="utf-8"), "html.parser")
    ps = soup.find_all("p")
    text_hyp = h.write_lines(out / "tagged.text.en", [" ".join(p.get_text().split()) for p in ps])
    plain_ref = h.write_lines(out / "ref.en", refs)
    landed = eligible = 0
    lone = iter(alone)
    for p, (_, word) in zip(ps, tagged):
        if not word:
            continue
        expected = _words(next(lone))
        inner = p.find(["b", "a", "i"])
        if expected and _contains(_words(p.get_text()), expected):
            eligible += 1
            landed += inner is not None and _contains(_words(inner.get_text()), expected)
    for figure, hyp in (("HTML with inline tags, text", text_hyp), ("plain lines", out / "lines.en")):
        h.record(args, SECTION, figure, "BLEU", round(h.bleu(hyp, plain_ref)["bleu"], 2), "BLEU", **settings)
    h.record(args, SECTION, "HTML with inline tags, text", "tags around the word's translation",
             round(landed / max(eligible, 1), 3), "share", cases=eligible, **settings)
    h.record(args, SECTION, "HTML with inline tags, text", "tags kept",
             int(len(ps) == len(lines) and sum(p.find(["b", "a", "i"]) is not None for p in ps) == len(words)),
             "bool", **settings)


def _contains(words: list[str], part: list[str]) -> bool:
    """Whether ``part`` occurs in ``words`` as a contiguous run."""
    return any(words[i:i + len(part)] == part for i in range(len(words) - len(part) + 1))
