"""Plain text: ``lines`` (one sentence per line, as ``attnmt translate`` reads by default) and
``text`` (free text: each line a paragraph of any number of sentences).

Each line is a segment; line breaks (``\\n``, ``\\r\\n``), blank lines and the whitespace
around and between sentences come back exactly as they were. ``lines`` with
``split_sentences`` is ``text``; ``text`` without it is ``lines``.
"""

from __future__ import annotations

from attnmt.documents.backend import Backend, DocumentError
from attnmt.documents.segments import Segment, translate_segments


def translate(text: str, backend: Backend, lang: str | None, split_sentences: bool) -> str:
    """The translation of ``text``, line by line (module docstring).

    Raises:
        DocumentError: a NUL character (binary data given as text), naming its line.
    """
    if "\x00" in text:
        raise DocumentError(f"line {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte; "
                            "this is binary data, not text")
    lines = text.splitlines(keepends=True)
    bodies = [line.rstrip("\r\n") for line in lines]
    done = translate_segments([Segment(b) for b in bodies], backend, lang, split_sentences)
    return "".join(t.text + line[len(b):] for t, line, b in zip(done, lines, bodies))
