"""HTML: block elements are segments, inline elements spans placed by word alignment.

Parsed by BeautifulSoup with Python's ``html.parser`` (which keeps the document as written:
no ``<html>``/``<body>`` added). Each run of text and inline
elements (:data:`INLINE`) between block boundaries is one segment; an inline element with
text is a span over its words, placed over their translation (``attnmt.documents.placement``);
one without text (``<br>``, ``<img>``) or whose content is kept as it is (``<code>``) is a
point that moves with the word before it. ``script``, ``style``, ``pre``, ``code``,
``textarea`` and ``template`` are left alone, as are comments and attribute values, except
``title`` and ``alt``, which are translated. The output is BeautifulSoup's serialisation:
every element and attribute kept in its order, entities written as characters (``&amp;``, ``&lt;``,
``&gt;`` escaped).
"""

from __future__ import annotations

import copy
import html as html_escape
from collections.abc import Callable

from attnmt.documents.backend import Backend, DocumentError
from attnmt.documents.segments import Segment, Span, Translated, render, translate_segments

# Elements inside a sentence: spans over the words they wrap.
INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "cite", "data", "del", "dfn", "em", "font", "i", "ins", "kbd",
                    "mark", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "time", "u", "var",
                    "br", "img", "wbr", "code", "label"})
# Elements whose content is never translated.
UNTOUCHED = frozenset({"script", "style", "pre", "code", "textarea", "template", "svg", "math"})
# Attributes whose values are translated.
TRANSLATED_ATTRIBUTES = ("title", "alt")


def translate(text: str, backend: Backend, lang: str | None) -> str:
    """The translation of an HTML document or fragment (module docstring).

    Raises:
        DocumentError: text the parser cannot read, or a NUL character (binary data).
    """
    from bs4 import BeautifulSoup

    if "\x00" in text:
        raise DocumentError(f"line {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte; not HTML")
    try:
        soup = BeautifulSoup(text, "html.parser")
    except Exception as e:  # html.parser raises little; name what it says
        raise DocumentError(f"not HTML: {e}") from None
    segments: list[Segment] = []
    apply: list[Callable[[Translated], None]] = []
    _attributes(soup, segments, apply)
    runs: list[tuple[list, list]] = []  # (nodes of the run, the inline elements of its spans)
    _runs(soup, runs)
    for nodes, elements in runs:
        seg = Segment("", [])
        _flatten(nodes, seg, elements)
        if seg.text.strip():
            segments.append(seg)
            apply.append(_replacer(nodes, elements))
    done = translate_segments(segments, backend, lang)
    for fill, translated in zip(apply, done):  # attributes first: the runs' tags are written after
        fill(translated)
    return soup.decode(formatter=_in_order())


def _in_order():
    """BeautifulSoup's 'minimal' formatter (``&amp;``, ``&lt;``, ``&gt;`` escaped) with the
    attributes in the document's order (its default sorts them)."""
    from bs4.formatter import HTMLFormatter

    class InOrder(HTMLFormatter):
        def attributes(self, tag):
            return list(tag.attrs.items())

    return InOrder(entity_substitution=HTMLFormatter.REGISTRY["minimal"].entity_substitution)


def _attributes(soup, segments: list[Segment], apply: list) -> None:
    """A segment for each translated attribute value outside untouched elements."""
    for tag in soup.find_all(True):
        if any(p.name in UNTOUCHED for p in [tag, *tag.parents] if p.name):
            continue
        for name in TRANSLATED_ATTRIBUTES:
            value = tag.attrs.get(name)
            if isinstance(value, str) and value.strip():
                segments.append(Segment(value))
                apply.append(lambda t, tag=tag, name=name: tag.attrs.__setitem__(name, t.text))


def _runs(element, runs: list) -> None:
    """Collect the runs of inline content under ``element`` (module docstring)."""
    from bs4 import NavigableString, Tag

    run: list = []
    for child in list(element.children):
        if isinstance(child, Tag) and child.name not in INLINE:
            if run:
                runs.append((run, []))
                run = []
            if child.name not in UNTOUCHED:
                _runs(child, runs)
        elif isinstance(child, Tag) or type(child) is NavigableString:
            run.append(child)
        elif run:  # a comment, CDATA, doctype: ends the run, stays as it is
            runs.append((run, []))
            run = []
    if run:
        runs.append((run, []))


def _flatten(nodes: list, seg: Segment, elements: list) -> None:
    """Append the text of ``nodes`` to ``seg`` and a span per inline element (pre-order)."""
    from bs4 import NavigableString, Tag

    for node in nodes:
        if isinstance(node, Tag):
            k = len(elements)
            elements.append(node)
            seg.spans.append(Span(len(seg.text), len(seg.text)))
            if node.name not in UNTOUCHED and node.contents:
                _flatten(list(node.children), seg, elements)
                seg.spans[k] = Span(seg.spans[k].start, len(seg.text))
        elif type(node) is NavigableString:
            seg.text += str(node)


def _replacer(nodes: list, elements: list) -> Callable[[Translated], None]:
    """What puts a run's translation in place of its nodes."""

    def fill(translated: Translated) -> None:
        from bs4 import BeautifulSoup

        opens, closes = [], []
        for el in elements:
            if el.name in UNTOUCHED or not el.contents:
                opens.append(el.decode(formatter=_in_order()))
                closes.append("")
            else:
                shell = copy.copy(el)
                shell.clear()
                written = shell.decode(formatter=_in_order())
                cut = written.rindex("</")
                opens.append(written[:cut])
                closes.append(written[cut:])
        fragment = render(translated, opens, closes, lambda s: html_escape.escape(s, quote=False))
        new = list(BeautifulSoup(fragment, "html.parser").contents)
        first = nodes[0]
        for node in new:
            first.insert_before(node.extract())
        for node in nodes:
            node.extract()

    return fill
