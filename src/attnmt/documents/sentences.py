"""Sentences of a paragraph, with the whitespace between them kept, and sentences cut to fit.

Splitting is by rules, sentencex's, and where a model has one, by what it learned from its
training source lines (``attnmt.data.sentence_model``). The rules decide wherever the text has
punctuation: they know abbreviations and ordinals ("z. B.", "Dr.", "3. Mai"), which a model
learned from captions does not. The learned splitter adds a sentence start only after whitespace
that follows a letter or digit, no punctuation at all: a sentence with no full stop
("Zwei Männer in einer Stadt Der Mann ..."), which no rule can end.

The rules are sentencex's (Wikimedia's rule-based segmenter: per-language abbreviation lists,
no model to download, many languages). It was chosen by measuring it against spaCy's
rule-based ``sentencizer`` and pysbd on the Multi30k test sentences joined four by four into
paragraphs and on hard cases ("z. B.", "Dr.", "ca.", "3.5", "3. Mai", quotes, ellipses), in
German, English, French and Czech; ``benchmarks/splitters.py`` counts the rules, the learned
splitter and both together the same way (docs/documents.md gives the figures). Its pieces cover the
text exactly (the whitespace after a sentence stays with it), so putting translations back
between the original whitespace is a matter of offsets.

A sentence with more subwords than the model has positions is cut, not refused
(:func:`fit`): at the last clause boundary (``, ; :`` and dashes followed by a space) under the
limit, else at the last word boundary under it, else (one huge word) by characters; each piece
is translated on its own and a warning is logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

log = logging.getLogger(__name__)

_CLAUSE = re.compile(r"[,;:\u2013\u2014]\s+|\s[-\u2013\u2014]\s+")
_SPACE = re.compile(r"\s+")


def split(text: str, lang: str | None, learned: list[int] | None = None) -> list[tuple[int, int]]:
    """The sentences of ``text`` as (start, end) character offsets, whitespace excluded, in order.

    Args:
        text: a paragraph (any whitespace, line breaks included, between sentences).
        lang: its language code (e.g. 'de'); None or one sentencex lacks: English rules.
        learned: the sentence starts a learned splitter found in ``text`` (character offsets,
            ``attnmt.data.sentence_model.starts_of``); those after whitespace that follows a
            letter or digit are added to the rules' (module docstring). None: the rules alone.
    Returns:
        Non-overlapping (start, end) pairs, ``text[start:end]`` stripped and non-empty; empty
        for blank text.
    """
    import sentencex

    out, pos = [], 0
    for piece in sentencex.segment(lang or "en", text):
        start = pos + len(piece) - len(piece.lstrip())
        end = pos + len(piece.rstrip())
        pos += len(piece)
        if end > start:
            out.append((start, end))
    if pos != len(text):  # sentencex's pieces cover the text; should a version not, keep it whole
        stripped = text.strip()
        out = [(text.index(stripped), text.index(stripped) + len(stripped))] if stripped else []
    if learned is None or not out:
        return out
    starts = {start for start, _ in out}
    for k in learned:
        before = text[:k].rstrip()
        if out[0][0] < k < out[-1][1] and text[k - 1].isspace() and before[-1].isalnum():
            starts.add(k)
    if len(starts) == len(out):
        return out
    cuts = sorted(starts) + [out[-1][1]]
    return [(a, len(text[:b].rstrip())) for a, b in zip(cuts, cuts[1:])]


def fit(text: str, start: int, end: int, length: Callable[[str], int], limit: int) -> list[tuple[int, int]]:
    """Cut ``text[start:end]`` into pieces of at most ``limit`` subwords (module docstring).

    Args:
        length: a string's number of subwords.
        limit: the most subwords a piece may have (>= 1).
    Returns:
        (start, end) offsets of the pieces, whitespace between them excluded; ``[(start, end)]``
        when the sentence fits.
    """
    if length(text[start:end]) <= limit:
        return [(start, end)]
    pieces = []
    while start < end:
        if length(text[start:end]) <= limit:
            pieces.append((start, end))
            break
        cut = _cut(text, start, end, length, limit)
        pieces.append((start, len(text[:cut].rstrip())))
        start = cut
        while start < end and text[start].isspace():
            start += 1
    log.warning("a sentence of %d characters is longer than the model's %d subwords: translated in %d pieces",
                pieces[-1][1] - pieces[0][0], limit, len(pieces))
    return pieces


def _cut(text: str, start: int, end: int, length: Callable[[str], int], limit: int) -> int:
    """The end of the longest first piece of ``text[start:end]`` that fits: after a clause
    boundary if one fits, else after a word, else the most characters that fit."""
    for pattern in (_CLAUSE, _SPACE):
        ends = [m.end() if pattern is _CLAUSE else m.start() for m in pattern.finditer(text, start, end)]
        ends = [e for e in ends if start < e < end and text[start:e].strip()]
        fitting = [e for e in ends if length(text[start:e]) <= limit]
        if fitting:
            return max(fitting)
    lo, hi = start + 1, end  # one word longer than the limit: the most characters that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if length(text[start:mid]) <= limit else (lo, mid - 1)
    return lo
