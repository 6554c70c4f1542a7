"""DOCX (Word) documents: each paragraph a segment, each run a span, formatting kept.

Read and written by python-docx. Every paragraph of the body, of tables (nested ones
included) and of the sections' headers and footers is one segment; its runs (those inside
hyperlinks included) partition its text and are spans, placed over the translation by the word
alignments (``attnmt.documents.placement``). Each run keeps its formatting (its ``w:rPr``)
and gets the translated words placed in it; a word no run claims goes to the run before it, a space to the run
after it unless the run before ended with one in the source.
Where the translation puts the runs' words in another order and the runs are plain children of
their paragraph, the runs are moved into that order. Paragraph properties, styles, tables,
images, fields and every other part of the package are written back as they were.
"""

from __future__ import annotations

import io

from attnmt.documents.backend import Backend, DocumentError
from attnmt.documents.segments import Segment, Span, Translated, translate_segments


def translate(data: bytes, backend: Backend, lang: str | None) -> bytes:
    """The translation of a DOCX file's bytes (module docstring).

    Raises:
        DocumentError: bytes that are not a DOCX package (not a zip, or no Word document in it).
    """
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises zipfile, KeyError and its own errors alike
        raise DocumentError(f"not a DOCX file (a zip package with word/document.xml): {e}") from None
    paragraphs = _paragraphs(document)
    segments, runs_of = [], []
    for paragraph in paragraphs:
        runs = _runs(paragraph)
        seg = Segment("", [])
        for run in runs:
            start = len(seg.text)
            seg.text += run.text
            seg.spans.append(Span(start, len(seg.text)))
        segments.append(seg)
        runs_of.append(runs)
    done = translate_segments(segments, backend, lang)
    for paragraph, runs, seg, translated in zip(paragraphs, runs_of, segments, done):
        if seg.text.strip():
            _fill(paragraph, runs, translated)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _paragraphs(document) -> list:
    """Every paragraph of the body (tables and text boxes included), headers and footers, once each."""
    from docx.oxml.ns import qn
    from docx.text.paragraph import Paragraph

    roots = [(document.element.body, document)]
    for section in document.sections:
        for part in (section.header, section.footer, section.first_page_header, section.first_page_footer,
                     section.even_page_header, section.even_page_footer):
            if not part.is_linked_to_previous:
                roots.append((part._element, part))
    seen, out = set(), []
    for root, parent in roots:
        for p in root.iter(qn("w:p")):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(Paragraph(p, parent))
    return out


def _runs(paragraph) -> list:
    """The runs of a paragraph in order, those inside hyperlinks included."""
    from docx.text.hyperlink import Hyperlink

    runs = []
    for item in paragraph.iter_inner_content():
        runs += item.runs if isinstance(item, Hyperlink) else [item]
    return runs


def _fill(paragraph, runs: list, translated: Translated) -> None:
    """Put each run's share of the translation in it (module docstring)."""
    text = translated.text
    owner: list[int | None] = []
    for pos in range(len(text)):
        inside = [k for k, (a, b) in enumerate(translated.spans) if a <= pos < b]
        owner.append(inside[-1] if inside else None)
    for pos in range(len(text)):  # a space stays with the run it ended in the source, else goes to the next
        if owner[pos] is None:
            after = next((k for k in owner[pos:] if k is not None), None)
            before = next((k for k in reversed(owner[:pos]) if k is not None), None)
            trailing = before is not None and runs[before].text[-1:].isspace()
            first, second = (after, before) if text[pos].isspace() and not trailing else (before, after)
            owner[pos] = next((k for k in (first, second) if k is not None), 0)
    pieces = {k: "" for k in range(len(runs))}
    order: list[int] = []
    for pos, k in enumerate(owner):
        pieces[k] += text[pos]
        if k not in order:
            order.append(k)
    order += [k for k in range(len(runs)) if k not in order]
    for k, run in enumerate(runs):
        run.text = pieces[k]
    direct = all(run._r.getparent() is paragraph._p for run in runs)
    if direct and order != sorted(order) and runs:
        anchor = runs[0]._r.getprevious()
        elements = [runs[k]._r for k in order]
        for el in elements:
            paragraph._p.remove(el)
        if anchor is None:
            for el in reversed(elements):
                paragraph._p.insert(0 if paragraph._p.pPr is None else 1, el)
        else:
            for el in reversed(elements):
                anchor.addnext(el)
