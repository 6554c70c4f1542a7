"""The document layer (attnmt.documents) over a fake translator: sentences and whitespace, cut
sentences, one call per document, each format's structure, inline markup placement, bad input."""

from __future__ import annotations

import io
import logging

import pytest

from attnmt.documents import INPUT_FORMATS, Backend, DocumentError, format_from_filename, translate_document
from attnmt.documents.placement import by_position, place
from attnmt.documents.sentences import fit, split
from attnmt.documents.subtitles import share
from attnmt.errors import AttnmtError, OptionError


class Fake:
    """Translates each word to upper case, in order (or reversed), word-aligned one to one;
    records every call."""

    def __init__(self, reverse: bool = False, max_subwords: int = 100):
        self.calls: list[list[str]] = []
        self.reverse = reverse
        self.max_subwords = max_subwords

    def __call__(self, sentences: list[str], alignments: bool):
        self.calls.append(list(sentences))
        out = []
        for s in sentences:
            words = s.split()
            n = len(words)
            order = list(reversed(range(n))) if self.reverse else list(range(n))
            out.append((" ".join(words[i].upper() for i in order), [(i, j) for j, i in enumerate(order)]))
        return out

    @property
    def backend(self) -> Backend:
        return Backend(self, lambda s: len(s.split()), self.max_subwords)


def test_names_and_error_kind():
    assert INPUT_FORMATS == ("lines", "text", "html", "markdown", "srt", "vtt", "docx")
    assert [format_from_filename(n) for n in ("a.HTML", "b.htm", "c.md", "d.srt", "e.vtt", "f.docx", "g.txt", "h.de",
                                               "noext")] == ["html", "html", "markdown", "srt", "vtt", "docx", "lines",
                                                             "lines", "lines"]
    assert issubclass(DocumentError, AttnmtError)


@pytest.mark.parametrize("lang, text, sentences", [
    ("de", "Wir brauchen z. B. Äpfel. Dr. Müller kommt am 3. Mai um ca. 8 Uhr.",
     ["Wir brauchen z. B. Äpfel.", "Dr. Müller kommt am 3. Mai um ca. 8 Uhr."]),
    ("de", "Der Preis stieg um 3.5 Prozent. „Kommst du mit?“, fragte sie.",
     ["Der Preis stieg um 3.5 Prozent.", "„Kommst du mit?“, fragte sie."]),
    ("en", "Dr. Smith arrived at 3.5 p.m. yesterday. He said \"Hello!\" and left.",
     ["Dr. Smith arrived at 3.5 p.m. yesterday.", "He said \"Hello!\" and left."]),
    ("en", "Wait... what?  It was fine.", ["Wait... what?", "It was fine."]),
    ("cs", "Např. jablka a hrušky. Dr. Novák přijde 3. května.", ["Např. jablka a hrušky.", "Dr. Novák přijde 3. května."]),
])
def test_sentences_of_hard_cases(lang, text, sentences):
    assert [text[a:b] for a, b in split(text, lang)] == sentences


def test_text_keeps_every_line_break_blank_line_and_space_in_one_call():
    fake = Fake()
    text = "Ein Hund. Eine Katze?\n\n  Zwei  Leute.\tDrei.  \r\nletzte Zeile ohne Punkt\n\n"
    out = translate_document(text, "text", fake.backend, "de")
    assert out == "EIN HUND. EINE KATZE?\n\n  ZWEI LEUTE.\tDREI.  \r\nLETZTE ZEILE OHNE PUNKT\n\n"
    assert fake.calls == [["Ein Hund.", "Eine Katze?", "Zwei  Leute.", "Drei.", "letzte Zeile ohne Punkt"]]


def test_lines_are_sentences_unless_split():
    fake = Fake()
    assert translate_document("Ein Hund. Eine Katze.\n\nzwei\n", "lines", fake.backend, "de", False) == \
        "EIN HUND. EINE KATZE.\n\nZWEI\n"
    assert fake.calls == [["Ein Hund. Eine Katze.", "zwei"]]
    assert translate_document("", "lines", fake.backend) == "" and len(fake.calls) == 1  # empty: no call


def test_a_sentence_longer_than_the_model_is_cut_at_a_clause_then_at_words(caplog):
    fake = Fake(max_subwords=6)
    text = "eins zwei drei, vier fünf sechs sieben acht neun zehn elf zwölf dreizehn."
    with caplog.at_level(logging.WARNING):
        out = translate_document(text, "text", fake.backend, "de")
    assert fake.calls == [["eins zwei drei,", "vier fünf sechs sieben acht neun", "zehn elf zwölf dreizehn."]]
    assert out == text.upper() and "longer than the model's 6 subwords: translated in 3 pieces" in caplog.text
    assert fit("abcdefghij", 0, 10, len, 4) == [(0, 4), (4, 8), (8, 10)]  # one word longer than the limit


def test_share_gives_every_part_its_proportion():
    assert share(10, [1, 1]) == [5, 5]
    assert share(3, [5, 1, 1]) == [1, 1, 1]  # each part with weight gets a word while there are enough
    assert sum(share(7, [3, 0, 4])) == 7 and share(0, [2, 3]) == [0, 0]


def test_by_position_and_placement_stay_well_formed():
    assert by_position(2, 4) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    src = [(0, 1), (2, 3), (4, 5), (6, 7)]  # four one-letter words
    tgt = [(0, 1), (2, 3), (4, 5), (6, 7)]
    crossed = [(0, 0), (1, 3), (2, 1), (3, 2)]  # word 1 went to the end
    spans = place([(0, 5), (2, 5), (6, 7)], src, tgt, crossed, 0)  # outer, inner over words 1-2, a sibling
    (oa, ob), (ia, ib), (sa, sb) = spans
    assert oa <= ia <= ib <= ob and (sb <= oa or sa >= ob)


def _tags(markup: str) -> list[tuple]:
    """Every element's name and attributes (in their order), as a sorted list."""
    from bs4 import BeautifulSoup

    return sorted(((t.name, list(t.attrs.items())) for t in BeautifulSoup(markup, "html.parser").find_all(True)),
                  key=repr)


def test_html_places_inline_tags_by_alignment_and_leaves_code_alone():
    fake = Fake(reverse=True)
    doc = ("<!DOCTYPE html><html><head><title>Mein Titel</title><style>p { x: 1 }</style></head>\n<body>"
           "<p>Ein <b>roter</b> Hund &amp; <a href=\"x.html\" class=\"k\">eine Katze</a>. Zweiter <i>Satz</i>.</p>\n"
           "<pre>nicht  hier</pre><p><img src=\"a.png\" alt=\"Ein Bild\"> mit <code>x &lt; 1</code> Code</p>"
           "<script>var s = '<b>';</script></body></html>")
    out = translate_document(doc, "html", fake.backend, "de")
    assert "<b>ROTER</b>" in out and "<a href=\"x.html\" class=\"k\">KATZE. EINE</a>" in out and "<i>SATZ.</i>" in out
    assert "<title>TITEL MEIN</title>" in out and 'alt="BILD EIN"' in out
    for kept in ("<pre>nicht  hier</pre>", "<code>x &lt; 1</code>", "<style>p { x: 1 }</style>",
                 "<script>var s = '<b>';</script>"):
        assert kept in out
    assert translate_document(doc, "HTML", fake.backend, "de") == out  # a format's name in any case
    with pytest.raises(OptionError, match="unknown input format 'pdf'"):
        translate_document(doc, "PDF", fake.backend, "de")
    assert "&amp;" in out and _tags(out.replace('alt="BILD EIN"', 'alt="Ein Bild"')) == _tags(doc)
    assert well_formed(out)


VOID = {"br", "img", "wbr", "hr", "meta", "link", "input"}


def well_formed(markup: str) -> bool:
    """Every element closed, in order (void elements aside), as Python's HTML tokenizer reads it."""
    from html.parser import HTMLParser

    stack, ok = [], [True]

    class Check(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag not in VOID:
                stack.append(tag)

        def handle_endtag(self, tag):
            if tag not in VOID and (not stack or stack.pop() != tag):
                ok[0] = False

    Check().feed(markup)
    return ok[0] and not stack


def test_markdown_keeps_structure_and_code():
    fake = Fake()
    doc = ("# Ein *Titel*\n\nEin **roter** Hund und [eine Katze](http://x.de \"T\") mit `co de`.\nZweite Zeile hier.\n\n"
           "- Punkt eins\n- Punkt zwei\n\n> Zitat hier\n> weiter\n\n| Kopf | Spalte |\n|---|---|\n| Zelle eins | zwei |\n\n"
           "```\ncode block\n```\n\n    eingerückt\n")
    out = translate_document(doc, "markdown", fake.backend, "de")
    assert out == ("# EIN *TITEL*\n\nEIN **ROTER** HUND UND [EINE KATZE](http://x.de \"T\") MIT `co de`.\nZWEITE ZEILE "
                   "HIER.\n\n- PUNKT EINS\n- PUNKT ZWEI\n\n> ZITAT HIER\n> WEITER\n\n| KOPF | SPALTE |\n|---|---|\n"
                   "| ZELLE EINS | ZWEI |\n\n```\ncode block\n```\n\n    eingerückt\n")
    assert len(fake.calls) == 1


SRT = ("1\n00:00:01,000 --> 00:00:02,500\nIch gehe heute\nnach\n\n2\n00:00:02,600 --> 00:00:04,000\nHause. Und du?\n\n"
       "3\n00:00:05,000 --> 00:00:06,000\nIch auch.\n")


def test_srt_timings_byte_equal_and_a_sentence_over_cues_translated_whole():
    fake = Fake()
    out = translate_document(SRT, "srt", fake.backend, "de")
    assert fake.calls == [["Ich gehe heute nach Hause.", "Und du?", "Ich auch."]]
    assert out == SRT.replace("Ich gehe heute\nnach", "ICH GEHE HEUTE\nNACH").replace("Hause. Und du?", "HAUSE. UND DU?") \
        .replace("Ich auch.", "ICH AUCH.")
    reversed_out = translate_document(SRT, "srt", Fake(reverse=True).backend, "de")
    blocks = reversed_out.split("\n\n")
    assert [b.splitlines()[:2] for b in blocks] == [b.splitlines()[:2] for b in SRT.split("\n\n")]
    assert blocks[0].splitlines()[2:] == ["HAUSE. NACH HEUTE", "GEHE"]  # 4 of the 5 words: cue 1 held 4
    assert blocks[1].splitlines()[2:] == ["ICH DU? UND"]


def test_vtt_keeps_header_notes_identifiers_settings_and_edge_tags():
    doc = ("WEBVTT - Titel\n\nNOTE nicht übersetzen\n\nc1\n00:01.000 --> 00:02.000 align:start line:0\n"
           "<v Bob>Ein Hund.</v>\n\n00:02.500 --> 00:03.000\nEine Katze.\n")
    out = translate_document(doc, "vtt", Fake().backend, "de")
    assert out == doc.replace("Ein Hund.", "EIN HUND.").replace("Eine Katze.", "EINE KATZE.")


def _docx(paragraphs: list[list[tuple[str, bool]]]) -> bytes:
    import docx

    d = docx.Document()
    for runs in paragraphs:
        p = d.add_paragraph()
        for text, bold in runs:
            p.add_run(text).bold = bold
    d.add_table(rows=1, cols=1).cell(0, 0).text = "Zelle eins"
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def test_docx_keeps_runs_and_their_formatting():
    import docx

    data = _docx([[("Ein ", False), ("roter", True), (" Hund.", False)], [("Zweiter Absatz.", False)], []])
    out = translate_document(data, "docx", Fake().backend, "de")
    d = docx.Document(io.BytesIO(out))
    assert [[(r.text, r.bold) for r in p.runs] for p in d.paragraphs] == \
        [[("EIN ", False), ("ROTER", True), (" HUND.", False)], [("ZWEITER ABSATZ.", False)], []]
    assert d.tables[0].cell(0, 0).text == "ZELLE EINS"


@pytest.mark.parametrize("fmt, document, place", [
    ("srt", "1\n00:00:01,000 -> 00:00:02,000\nHallo\n", "line 2"),
    ("srt", SRT.replace("00:00:02,600 -->", "00:00:02;600 -->"), "line 7"),
    ("vtt", "00:01.000 --> 00:02.000\nHallo\n", "line 1"),
    ("vtt", "WEBVTT\n\n00:01.000 -> 00:02.000\nHallo\n", "line 3"),
    ("docx", b"PK not really a zip", "not a DOCX file"),
    ("html", "<p>a</p>\n<p>\x00</p>", "line 2"),
    ("lines", "ok\n\x00\x01", "line 2"),
    ("text", "Gut.\n".encode() + b"\xff\xfe", "line 2"),
])
def test_bad_documents_name_the_place(fmt, document, place):
    fake = Fake()
    with pytest.raises(DocumentError, match=place):
        translate_document(document, fmt, fake.backend, "de")
    assert fake.calls == []


def test_empty_documents_give_empty_documents():
    for fmt in ("lines", "text", "html", "markdown", "srt"):
        assert translate_document("", fmt, Fake().backend) == ""
    assert translate_document("WEBVTT\n", "vtt", Fake().backend) == "WEBVTT\n"
