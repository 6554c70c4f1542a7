"""Sentence splitters compared: how many Multi30k paragraphs each cuts into exactly their sentences.

    python benchmarks/splitters.py --data-dir DIR     (DIR/multi30k/*.gz; default $ATTNMT_DATA)

For German, English, French and Czech: test_2016_flickr grouped four by four into 250
paragraphs (joined by a space, as ``translate --part documents`` joins them), and paragraphs of
hard sentences written here (abbreviations, ordinals, decimals, quotes, ellipses). A paragraph
counts when it is cut into exactly the sentences it was made of. The splitters: sentencex's
rules, spaCy's rule-based ``sentencizer``, the sentence recognizer attnmt learns in preparation
from the training source lines (``attnmt.data.sentence_model``, trained here on each language's
Multi30k training side as ``attnmt prepare`` trains it), and the two together as documents use
them (``attnmt.documents.sentences.split``). It prints a Markdown table (docs/documents.md).
No model is needed; the figures are counts, not times.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnmt.data import sentence_model  # noqa: E402
from attnmt.documents.sentences import split  # noqa: E402

LANGUAGES = ("de", "en", "fr", "cs")
HARD = {
    "de": [["Wir brauchen z. B. Äpfel.", "Dr. Müller kommt am 3. Mai um ca. 8 Uhr."],
           ["Der Preis stieg um 3.5 Prozent.", "„Kommst du mit?“, fragte sie."],
           ["Das kostet ca. 5 Euro.", "Wir wohnen in der Hauptstr. 5 in Berlin."],
           ["Er kam u. a. mit Anna.", "Sie blieb zu Hause..."],
           ["Am 3. Mai kam sie.", "Am 4. Juni ging er."]],
    "en": [["Dr. Smith arrived at 3.5 p.m. yesterday.", "He said \"Hello!\" and left."],
           ["Wait... what?", "It was fine."],
           ["Mr. Brown lives on Main St. near the park.", "It's e.g. a big house."],
           ["\"Stop!\" she cried.", "The dog ran away."]],
    "fr": [["M. Dupont arrive à 8 h.", "Il part vers 9 h 30, etc. puis rentre."],
           ["Il a dit « Bonjour ! » et il est parti.", "Le 1er mai, c'était férié."]],
    "cs": [["Např. jablka a hrušky.", "Dr. Novák přijde 3. května."],
           ["Přišel v 5 hod. ráno.", "Odešel např. večer."],
           ["Dne 3. května přijel.", "Viděl atd. mnoho věcí."]],
}


def _lines(data: Path, name: str, lang: str) -> list[str]:
    with gzip.open(data / "multi30k" / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _exact(groups: list[list[str]], splitter) -> int:
    return sum([p[a:b] for a, b in splitter(p)] == g for g in groups for p in [" ".join(g)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"), help="the folder holding multi30k/")
    args = parser.parse_args()
    if not args.data_dir:
        parser.error("give --data-dir or set ATTNMT_DATA")
    import spacy

    data = Path(args.data_dir)
    table: dict[str, dict[str, str]] = {}
    hard = {}
    for lang in LANGUAGES:
        test = _lines(data, "test_2016_flickr", lang)
        groups = [test[i:i + 4] for i in range(0, len(test), 4)]
        folder = tempfile.mkdtemp()
        sentence_model.save(sentence_model.train(_lines(data, "train", lang), lang, 1), folder)
        learned = sentence_model.starts_of(folder)
        sentencizer = spacy.blank(lang)
        sentencizer.add_pipe("sentencizer")

        def learned_alone(text, learned=learned):
            cuts = [0] + learned([text])[0] + [len(text)]
            return [(a, len(text[:b].rstrip())) for a, b in zip(cuts, cuts[1:])]

        splitters = {"sentencex (rules)": lambda t, lang=lang: split(t, lang),
                     "spaCy `sentencizer` (rules)": lambda t, s=sentencizer: [(x.start_char, x.end_char)
                                                                               for x in s(t).sents],
                     "learned from the training lines": learned_alone,
                     "sentencex and learned (attnmt)": lambda t, lang=lang, s=learned: split(t, lang, s([t])[0])}
        for name, splitter in splitters.items():
            table.setdefault(name, {})[lang] = f"{_exact(groups, splitter)}/{len(groups)}"
            right, total = hard.get(name, (0, 0))
            hard[name] = (right + _exact(HARD[lang], splitter), total + len(HARD[lang]))
    print("| splitter | " + " | ".join(f"Multi30k {lang}" for lang in LANGUAGES) + " | hard cases |")
    print("| --- |" + " --- |" * (len(LANGUAGES) + 1))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(row[lang] for lang in LANGUAGES) + f" | {hard[name][0]}/{hard[name][1]} |")


if __name__ == "__main__":
    main()
