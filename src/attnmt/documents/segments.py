"""A document as segments: text with inline markup spans, translated sentence by sentence in one call.

Every format (``attnmt.documents.plain``, ``html``, ``markdown``, ``subtitles``, ``office``)
turns its document into :class:`Segment` objects, a block's text with the :class:`Span` of
each inline element over it, and puts the :class:`Translated` segments back. In between,
:func:`translate_segments` does the same for every format: it splits each segment into
sentences (``attnmt.documents.sentences``; the learned sentence starts of all the segments
come from one call of the backend's splitter), cuts those longer than the model's positions,
sends the sentences of the *whole document* to the backend in one call (so the translator
batches them by length as it batches lines), and rebuilds each segment's text with the
whitespace between its sentences exactly as it was. Inline spans are then placed over the
translation by the word alignments (``attnmt.documents.placement``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attnmt.documents import placement
from attnmt.documents.backend import Backend
from attnmt.documents.sentences import fit, split

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Span:
    """An inline element over characters ``start:end`` of a segment's text (``start == end``:
    an element with no text, e.g. ``<br>``, placed as a point)."""

    start: int
    end: int


@dataclass
class Segment:
    """A block's text to translate and its inline spans (nested or disjoint, never crossing)."""

    text: str
    spans: list[Span] = field(default_factory=list)


@dataclass
class Translated:
    """A translated segment.

    text: the translation; the whitespace before, between and after its sentences is the source's.
    spans: per source span, in order, the (start, end) characters of ``text`` it now covers;
        nested or disjoint as the source's were (a point where no translated word is its).
    sentences: per translated sentence (or piece of a cut sentence): (source start, source end,
        target start, target end) in characters of the segment's and the translation's text.
    """

    text: str
    spans: list[tuple[int, int]]
    sentences: list[tuple[int, int, int, int]]


def translate_segments(segments: list[Segment], backend: Backend, lang: str | None = None,
                       split_sentences: bool = True) -> list[Translated]:
    """Translate ``segments`` with one call of ``backend.translate`` (module docstring).

    Args:
        lang: the source language, for the sentence splitter (None: English rules).
        split_sentences: False takes each segment's stripped text as one sentence (still cut
            when longer than the model's positions).
    Returns:
        One :class:`Translated` per segment, in order; a blank segment comes back unchanged.
    """
    learned: list[list[int] | None] = [None] * len(segments)
    if split_sentences and backend.sentence_starts is not None:  # the learned starts of every segment at once
        texts = [k for k, seg in enumerate(segments) if seg.text.strip()]
        for k, starts in zip(texts, backend.sentence_starts([segments[k].text for k in texts])):
            learned[k] = starts
    pieces: list[list[tuple[int, int]]] = []
    for seg, starts in zip(segments, learned):
        if split_sentences:
            sentences = split(seg.text, lang, starts)
        else:
            stripped = seg.text.strip()
            start = len(seg.text) - len(seg.text.lstrip())
            sentences = [(start, start + len(stripped))] if stripped else []
        pieces.append([p for s, e in sentences for p in fit(seg.text, s, e, backend.length, backend.max_subwords)])
    flat = [seg.text[s:e] for seg, ps in zip(segments, pieces) for s, e in ps]
    marked = any(seg.spans for seg in segments)  # alignments only where inline markup needs placing
    done = iter(backend.translate(flat, marked) if flat else [])
    return [_rebuild(seg, ps, [next(done) for _ in ps]) for seg, ps in zip(segments, pieces)]


def _rebuild(seg: Segment, pieces: list[tuple[int, int]], out: list) -> Translated:
    """One segment's translation from its pieces' (text, alignment): whitespace kept, spans placed."""
    text = ""
    pos = 0
    sentences = []
    src_words = [(m.start(), m.end()) for m in _WORD.finditer(seg.text)]
    tgt_words: list[tuple[int, int]] = []
    links: list[tuple[int, int]] = []  # (global source word, global target word)
    for (s, e), (target, alignment) in zip(pieces, out):
        target = target.strip()
        text += seg.text[pos:s]
        first_src = sum(1 for w in src_words if w[1] <= s)
        n_src = sum(1 for w in src_words if s <= w[0] < e)
        words = [(len(text) + m.start(), len(text) + m.end()) for m in _WORD.finditer(target)]
        pairs = alignment if alignment is not None else placement.by_position(n_src, len(words))
        links += [(first_src + i, len(tgt_words) + j) for i, j in pairs if i < n_src and j < len(words)]
        sentences.append((s, e, len(text), len(text) + len(target)))
        tgt_words += words
        text += target
        pos = e
    text += seg.text[pos:]
    spans = placement.place([(sp.start, sp.end) for sp in seg.spans], src_words, tgt_words, links,
                            sentences[0][2] if sentences else len(text))
    for k, sp in enumerate(seg.spans):  # a point after a space in the source goes after the space there too
        at = spans[k][0]
        if sp.start == sp.end and sp.start and seg.text[sp.start - 1].isspace() and text[at:at + 1].isspace() \
                and (at == 0 or not text[at - 1].isspace()):
            spans[k] = (at + 1, at + 1)
    return Translated(text, spans, sentences)


def render(translated: Translated, opens: list[str], closes: list[str], escape=lambda s: s) -> str:
    """The translation with ``opens[k]`` / ``closes[k]`` written around span k's characters
    and ``escape`` applied to the text between them (e.g. HTML escaping); tags at one place
    are written closes first (innermost first), then points, then opens (outermost first),
    so nested spans stay nested."""
    events: list[tuple[int, int, int, int, str]] = []  # (position, kind, order key, tie, markup)
    for k, (a, b) in enumerate(translated.spans):
        if a == b:
            events.append((a, 1, k, 0, opens[k] + closes[k]))
        else:
            events.append((a, 2, -b, k, opens[k]))
            events.append((b, 0, -a, -k, closes[k]))
    events.sort()
    out, pos = [], 0
    for at, _, _, _, markup in events:
        out.append(escape(translated.text[pos:at]))
        out.append(markup)
        pos = at
    out.append(escape(translated.text[pos:]))
    return "".join(out)
