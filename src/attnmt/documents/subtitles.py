"""SRT and WebVTT subtitles: cue numbers, timings and settings kept byte for byte, text translated
whole sentence by whole sentence.

The file is read block by block (blocks are separated by blank lines), each cue checked by the
format's library (``srt`` for SRT, ``webvtt-py`` for WebVTT), and only the text lines of the
cues are replaced: everything else (numbers, identifiers, timing lines with their settings,
the WEBVTT header, NOTE, STYLE and REGION blocks, line endings) is written back as it was.

The cues' text is one stream, split into sentences (``attnmt.documents.sentences``), so that
a sentence running over several cues is translated whole; its translated words are then shared
out over those cues in proportion to the source words each held (:func:`share`), and a cue's
words over its lines the same way. WebVTT markup at the start and end of a cue (``<i>``,
``<v Speaker>``, their closing tags) stays there; markup inside a cue's text is translated as text.
"""

from __future__ import annotations

import re

from attnmt.documents.backend import Backend, DocumentError
from attnmt.documents.segments import Segment, translate_segments

_BLOCKS = re.compile(r"(?:\r?\n){2,}")
_EDGE_TAGS = re.compile(r"^((?:<[^>]*>)*)(.*?)((?:<[^>]*>)*)$", re.S)


def share(total: int, weights: list[int]) -> list[int]:
    """Split ``total`` items into ``len(weights)`` consecutive counts in proportion to
    ``weights`` (rounded at cumulative boundaries; every part with weight gets at least one
    item while there are items enough). The counts sum to ``total``."""
    if not weights:
        return []
    whole = sum(weights) or len(weights)
    weights = weights if sum(weights) else [1] * len(weights)
    bounds, cum = [], 0
    for w in weights[:-1]:
        cum += w
        bounds.append(round(total * cum / whole))
    bounds.append(total)
    counts, prev = [], 0
    for k, b in enumerate(bounds):
        left = len(bounds) - k - 1  # parts after this one that may still need an item
        b = min(max(b, prev + (1 if weights[k] and total - prev > left else 0)), total - min(left, total - prev))
        b = max(b, prev)
        counts.append(b - prev)
        prev = b
    counts[-1] += total - prev
    return counts


def translate(text: str, backend: Backend, lang: str | None, kind: str) -> str:
    """The translation of an SRT (``kind`` 'srt') or WebVTT ('vtt') file (module docstring).

    Raises:
        DocumentError: a cue whose timing line the format's reader refuses (names the line),
            or a WebVTT file without its WEBVTT header.
    """
    cues = _srt_cues(text) if kind == "srt" else _vtt_cues(text)
    # cues: per cue, (start, end) character offsets of its text lines in ``text``
    stream = ""  # the cues' text as one stream
    owner: list[int] = []  # per word of the stream, its cue
    lines = []  # per cue: its leading and trailing markup, its lines' word counts, its line ending
    for c, (start, end) in enumerate(cues):
        body = text[start:end]
        lead, inner, trail = _EDGE_TAGS.match(body).groups()
        cue_lines = [ln for ln in inner.splitlines()]
        lines.append((lead, trail, [len(ln.split()) for ln in cue_lines], _line_ending(body)))
        words = " ".join(ln.strip() for ln in cue_lines).split()
        stream += (" " if stream and words else "") + " ".join(words)
        owner += [c] * len(words)
    done = translate_segments([Segment(stream)], backend, lang)[0]
    per_cue: list[list[str]] = [[] for _ in cues]
    src_word = 0
    for s, e, ts, te in done.sentences:
        n = len(stream[s:e].split())
        cue_ids = owner[src_word:src_word + n]
        src_word += n
        order = sorted(set(cue_ids))
        words = done.text[ts:te].split()
        pos = 0
        for c, count in zip(order, share(len(words), [cue_ids.count(c) for c in order])):
            per_cue[c] += words[pos:pos + count]
            pos += count
    out, pos = [], 0
    for (start, end), words, (lead, trail, widths, eol) in zip(cues, per_cue, lines):
        out.append(text[pos:start])
        counts = share(len(words), widths) if widths else [len(words)]
        chunks, k = [], 0
        for count in counts:
            chunks.append(" ".join(words[k:k + count]))
            k += count
        out.append(lead + eol.join(chunks) + trail)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _line_ending(body: str) -> str:
    return "\r\n" if "\r\n" in body else "\n"


def _blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the blank-line separated blocks of ``text``."""
    out, pos = [], 0
    for m in _BLOCKS.finditer(text):
        if text[pos:m.start()].strip():
            out.append((pos, m.start()))
        pos = m.end()
    if text[pos:].strip():
        out.append((pos, len(text.rstrip("\r\n"))))
    return out


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _body(text: str, start: int, end: int, skip: int) -> tuple[int, int]:
    """Offsets of a block's lines after its first ``skip`` lines (an empty range if none)."""
    pos = start
    for _ in range(skip):
        nl = text.find("\n", pos, end)
        if nl < 0:
            return (end, end)
        pos = nl + 1
    return (pos, end)


def _srt_cues(text: str) -> list[tuple[int, int]]:
    """The text range of every SRT cue, each block checked by ``srt.parse``."""
    import srt

    cues = []
    for start, end in _blocks(text):
        block = text[start:end].lstrip("\ufeff")
        try:
            parsed = list(srt.parse(block + "\n\n"))
        except (srt.SRTParseError, ValueError):
            parsed = []
        if len(parsed) != 1:
            timing = block.splitlines()[1] if len(block.splitlines()) > 1 else block.splitlines()[0]
            raise DocumentError(f"line {_line(text, start) + (1 if len(block.splitlines()) > 1 else 0)}: "
                                f"not an SRT cue (number, then a timing line 'HH:MM:SS,mmm --> HH:MM:SS,mmm'): "
                                f"{timing[:60]!r}")
        cues.append(_body(text, start, end, 2))
    return cues


def _vtt_cues(text: str) -> list[tuple[int, int]]:
    """The text range of every WebVTT cue, each cue block checked by ``webvtt-py``."""
    import webvtt

    blocks = _blocks(text)
    if not blocks or not text.lstrip("\ufeff").startswith("WEBVTT"):
        raise DocumentError("line 1: a WebVTT file starts with 'WEBVTT'")
    cues = []
    for start, end in blocks[1:]:
        block = text[start:end]
        head = block.split(None, 1)[0] if block.strip() else ""
        if head in ("NOTE", "STYLE", "REGION"):
            continue
        first = block.splitlines()
        timing = 0 if "-->" in first[0] else 1
        try:
            captions = webvtt.from_string("WEBVTT\n\n" + block + "\n").captions
        except Exception:  # webvtt-py's malformed-file errors: named by the line below
            captions = []
        if len(first) <= timing or "-->" not in first[timing] or len(captions) != 1:
            raise DocumentError(f"line {_line(text, start)}: a WebVTT cue without a valid timing line "
                                f"'HH:MM:SS.mmm --> HH:MM:SS.mmm': {block.splitlines()[0][:60]!r}")
        cues.append(_body(text, start, end, timing + 1))
    return cues
