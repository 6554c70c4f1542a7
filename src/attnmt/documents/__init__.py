"""Documents, not only lines: free text, HTML, Markdown, SRT and WebVTT subtitles, and DOCX.

A document is split into segments and sentences, the sentences of the whole document are
translated in one call of a :class:`Backend` (batched by length as lines are), and the
document is put back together with its markup, whitespace and structure
(``attnmt.documents.segments``). ``Translator.translate_document`` is the usual way in;
docs/documents.md says what each format keeps.

Layer: below ``attnmt.decode`` (which passes a translator in as a :class:`Backend`) and above
the configuration and errors; the CLI and the server call it through ``Translator``.
"""

from __future__ import annotations

from pathlib import PurePath

from attnmt.documents.backend import Aligned, Backend, DocumentError
from attnmt.errors import OptionError
from attnmt.names import canonical_name

__all__ = ["INPUT_FORMATS", "Aligned", "Backend", "DocumentError", "format_from_filename", "translate_document"]

# The document formats, by name: what ``--input-format`` and ``input_format`` take.
INPUT_FORMATS = ("lines", "text", "html", "markdown", "srt", "vtt", "docx")

# Formats whose documents are bytes (in and out); the others are str.
BINARY_FORMATS = frozenset({"docx"})

_EXTENSIONS = {".html": "html", ".htm": "html", ".xhtml": "html", ".md": "markdown", ".markdown": "markdown",
               ".srt": "srt", ".vtt": "vtt", ".docx": "docx"}


def format_from_filename(name: str) -> str:
    """The input format of a file by its extension (case-insensitive): ``.html``/``.htm`` html,
    ``.md`` markdown, ``.srt``, ``.vtt``, ``.docx``; ``lines`` for any other (``.txt`` included:
    one sentence per line, as pipelines and the benchmarks give it)."""
    return _EXTENSIONS.get(PurePath(name).suffix.lower(), "lines")


def translate_document(document: str | bytes, input_format: str, backend: Backend, lang: str | None = None,
                       split_sentences: bool = True) -> str | bytes:
    """Translate a document of ``input_format`` with ``backend`` (module docstring).

    Args:
        document: str, or bytes for docx (bytes of a text format are decoded as UTF-8).
        input_format: one of :data:`INPUT_FORMATS`, in any letter case (``HTML``).
        lang: the source language code, for the sentence splitter (None: English rules).
        split_sentences: for ``lines`` only: also split each line into sentences (the other
            formats always split; ``text`` is ``lines`` that split).
    Returns:
        The translated document: bytes for docx, str otherwise.
    Raises:
        DocumentError: a document that is not of its format, or undecodable (names the place).
        OptionError: an unknown format.
    """
    input_format = canonical_name(input_format)
    if input_format not in INPUT_FORMATS:
        raise OptionError(f"unknown input format {input_format!r}; choose one of {', '.join(INPUT_FORMATS)}")
    if input_format in BINARY_FORMATS:
        if isinstance(document, str):
            raise DocumentError(f"a {input_format} document is bytes, not text")
        from attnmt.documents import office

        return office.translate(document, backend, lang)
    text = decode_text(document) if isinstance(document, bytes) else document
    if input_format in ("lines", "text"):
        from attnmt.documents import plain

        return plain.translate(text, backend, lang, split_sentences or input_format == "text")
    if input_format == "html":
        from attnmt.documents import html

        return html.translate(text, backend, lang)
    if input_format == "markdown":
        from attnmt.documents import markdown

        return markdown.translate(text, backend, lang)
    from attnmt.documents import subtitles

    return subtitles.translate(text, backend, lang, input_format)


def decode_text(data: bytes) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped).

    Raises:
        DocumentError: bytes UTF-8 cannot decode, naming the line and byte.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DocumentError(f"line {line}: byte {e.start + 1} (0x{data[e.start]:02x}) is not UTF-8 text") from None
