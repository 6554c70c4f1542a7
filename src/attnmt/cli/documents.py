"""``attnmt translate`` on documents: ``--input-format`` (from the extension of ``--input``
where not given) and ``--split-sentences`` (``attnmt.documents``; docs/documents.md).

Input format ``lines`` without ``--split-sentences`` is not a document: ``translate`` reads it
one sentence per line as it always has. Everything else is read whole, translated by
``Translator.translate_document`` and written back whole, atomically: a document that is not
of its format is refused in one line naming the file and the place, and no output is written.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from attnmt.cli.options import write_document
from attnmt.errors import AttnmtError, DataError
from attnmt.names import canonical_name

log = logging.getLogger("attnmt")

# Options of ``translate`` that shape one output line per input sentence: refused with a document.
LINE_ONLY = {"nbest": "--nbest", "scores": "--scores", "constraints": "--constraints", "alignments": "--alignments"}


def input_format(args: argparse.Namespace, source: str | None) -> str:
    """``--input-format``, else the format of ``source``'s extension (``lines`` for stdin)."""
    from attnmt.documents import format_from_filename

    if args.input_format:
        return args.input_format
    return format_from_filename(source) if source and source != "-" else "lines"


def is_document(args: argparse.Namespace, fmt: str) -> bool:
    """Whether ``translate`` reads its input as a document (module docstring)."""
    return fmt != "lines" or args.split_sentences


def check_document_options(args: argparse.Namespace, fmt: str) -> None:
    """Refuse, before any work, the options that only mean something one line per sentence.

    Raises:
        AttnmtError: ``--format jsonl`` or a line-only option (:data:`LINE_ONLY`) with a document.
    """
    what = f"--input-format {fmt}" if fmt != "lines" else "--split-sentences"
    if args.format == "jsonl":
        raise AttnmtError(f"--format jsonl is for one sentence per line; with {what} the translation is a document "
                          "of the same format (leave out --format)")
    for name, option in LINE_ONLY.items():
        value = getattr(args, name, None)
        if value and not (name == "nbest" and value == 1):
            raise AttnmtError(f"{option} is for one sentence per line, not with {what}")


def read_document(source: str | None, fmt: str) -> str | bytes:
    """The document's bytes (docx) or text, from ``source`` or standard input.

    Raises:
        DataError: an unreadable file; AttnmtError: text that is not UTF-8 (file, line and byte).
    """
    from attnmt.documents import BINARY_FORMATS, DocumentError, decode_text

    name = source if source and source != "-" else "<stdin>"
    try:
        data = sys.stdin.buffer.read() if name == "<stdin>" else Path(source).read_bytes()
    except OSError as e:
        raise DataError(f"{name}: cannot read: {e.strerror or e}") from None
    if fmt in BINARY_FORMATS:
        return data
    try:
        return decode_text(data)
    except DocumentError as e:
        raise AttnmtError(f"{name}: {e}") from None


def translate_document(tr, args: argparse.Namespace, source: str | None, fmt: str) -> int:
    """Translate ``source`` as a document of format ``fmt`` and write it to ``--output`` (module docstring)."""
    from attnmt.documents import DocumentError

    name = source if source and source != "-" else "<stdin>"
    document = read_document(source, fmt)
    tr.sentence_starts()  # the learned sentence splitter loaded before the clock starts, as the model was
    t0 = time.perf_counter()
    try:
        out = tr.translate_document(document, fmt, split_sentences=True, src_lang=args.src_lang,
                                    tgt_lang=args.tgt_lang, beam_size=args.beam_size, batch_size=args.batch_size,
                                    length_penalty=args.length_penalty)
    except DocumentError as e:
        raise AttnmtError(f"{name}: {e}") from None
    log.info("translated %s (%s) in %.2f s", name, fmt, time.perf_counter() - t0)
    write_document(args.output, out)
    return 0


def add_document_options(p: argparse.ArgumentParser) -> None:
    """``--input-format`` and ``--split-sentences`` of ``translate``."""
    from attnmt.documents import INPUT_FORMATS

    p.add_argument("--input-format", type=canonical_name, choices=[f for f in INPUT_FORMATS if f != "text"],
                   help="what --input holds: lines (one sentence per line), html, markdown, srt, vtt or docx; "
                        "default from its extension (.html/.htm, .md, .srt, .vtt, .docx), else lines. A document comes back as a document of its format")
    p.add_argument("--split-sentences", action="store_true",
                   help="lines input: split each line into sentences and join their translations back on that line "
                        "(free text: paragraphs, blank lines kept); the document formats always split")
