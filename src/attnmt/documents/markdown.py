"""Markdown: the text of each block translated in place, its inline markup placed by word alignment.

Parsed by markdown-it-py (CommonMark, with tables and strikethrough). Only the characters of
each block's inline content are replaced, found by the parser's line map: headings, list
markers, block quotes' ``>``, table pipes, indentation, fenced and indented code, HTML blocks
and blank lines stay as they were. A block's inline content is one segment: emphasis,
strong emphasis, strikethrough and link text are spans (``attnmt.documents.placement``);
code spans, images, autolinks and inline HTML are points kept as written. A paragraph
wrapped over several lines keeps its number of lines: its translated words are shared out
over them (``attnmt.documents.subtitles.share``). Links are written back inline
(``[text](destination "title")``, the destination as the parser normalised it), and
characters of the translation that Markdown would read as markup are backslash-escaped.
"""

from __future__ import annotations

import re

from attnmt.documents.backend import Backend
from attnmt.documents.segments import Segment, Span, render, translate_segments
from attnmt.documents.subtitles import share

_SPECIAL = re.compile(r"([\\`*_\[\]<])")
_PAIRED = {"em_open": "em_close", "strong_open": "strong_close", "s_open": "s_close", "link_open": "link_close"}


def translate(text: str, backend: Backend, lang: str | None) -> str:
    """The translation of a Markdown document (module docstring)."""
    from markdown_it import MarkdownIt

    lines = text.splitlines(keepends=True)
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(text)
    blocks = []  # (segment, opens, closes, [(line, start col, end col)])
    cursor: dict[int, int] = {}  # per line, where the next cell's search starts (table rows)
    for tok in tokens:
        if tok.type != "inline" or not tok.map or not tok.content.strip():
            continue
        places = []
        for k, part in enumerate(tok.content.split("\n")):
            n = tok.map[0] + k
            if n >= len(lines):
                break
            col = lines[n].find(part, cursor.get(n, 0)) if part else -1
            if col < 0:
                places = []
                break
            places.append((n, col, col + len(part)))
            cursor[n] = col + len(part)
        if places:
            seg, opens, closes = _segment(tok.children or [])
            blocks.append((seg, opens, closes, places))
    done = translate_segments([b[0] for b in blocks], backend, lang)
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for (seg, opens, closes, places), translated in zip(blocks, done):
        words = [m for m in re.finditer(r"\S+", translated.text)]
        counts = share(len(words), [len(lines[n][a:b].split()) for n, a, b in places])
        chars = list(translated.text)
        k = 0
        for count in counts[:-1]:  # a line break after each line's share of words
            k += count
            if 0 < k < len(words):
                chars[words[k - 1].end()] = "\n"
        out = render(type(translated)("".join(chars), translated.spans, translated.sentences), opens, closes,
                     lambda s: _SPECIAL.sub(r"\\\1", s)).split("\n")
        out += [""] * (len(places) - len(out))
        for (n, a, b), piece in zip(places, out):
            edits.setdefault(n, []).append((a, b, piece.strip() if len(places) > 1 else piece))
    for n, changes in edits.items():
        line = lines[n]
        for a, b, piece in sorted(changes, reverse=True):
            line = line[:a] + piece + line[b:]
        lines[n] = line
    return "".join(lines)


def _segment(children) -> tuple[Segment, list[str], list[str]]:
    """An inline token's children as a segment and the markup of each span (module docstring)."""
    seg = Segment("", [])
    opens: list[str] = []
    closes: list[str] = []
    stack: list[int] = []
    skip_until = None
    for child in children:
        if skip_until is not None:  # inside an autolink: kept whole as its point
            if child.type == skip_until:
                skip_until = None
            continue
        kind = child.type
        if kind == "text":
            seg.text += child.content
        elif kind in ("softbreak", "hardbreak"):
            seg.text += " "
        elif kind == "link_open" and child.markup == "autolink":
            _point(seg, opens, closes, f"<{child.attrs.get('href', '')}>")
            skip_until = "link_close"
        elif kind in _PAIRED:
            stack.append(len(seg.spans))
            seg.spans.append(Span(len(seg.text), len(seg.text)))
            if kind == "link_open":
                title = child.attrs.get("title")
                opens.append("[")
                closes.append(f"]({child.attrs.get('href', '')}" + (f' "{title}"' if title else "") + ")")
            else:
                opens.append(child.markup)
                closes.append(child.markup)
        elif kind in _PAIRED.values():
            k = stack.pop()
            seg.spans[k] = Span(seg.spans[k].start, len(seg.text))
        elif kind == "code_inline":
            _point(seg, opens, closes, f"{child.markup}{child.content}{child.markup}")
        elif kind == "image":
            title = child.attrs.get("title")
            _point(seg, opens, closes, f"![{child.content}]({child.attrs.get('src', '')}"
                   + (f' "{title}"' if title else "") + ")")
        else:  # inline HTML and anything else: kept as written
            _point(seg, opens, closes, child.content)
    return seg, opens, closes


def _point(seg: Segment, opens: list[str], closes: list[str], markup: str) -> None:
    seg.spans.append(Span(len(seg.text), len(seg.text)))
    opens.append(markup)
    closes.append("")
