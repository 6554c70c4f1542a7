"""A translator as the document layer's backend (``attnmt.documents.Backend``).

``Translator.translate_document`` hands itself to :func:`backend`, which wraps its
``translate`` (asking for word alignments where the engine can give them: its source attention,
``return_attention``, and only for a document with inline markup), its source tokenizer's
length, its model's positions, and the sentence splitter learned with the model where its
directory has one (``Translator.sentence_starts``). An engine without attention (ONNX Runtime)
returns no alignment and the document layer places inline markup by position
(``attnmt.documents.placement``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from attnmt import languages
from attnmt.documents import Backend

if TYPE_CHECKING:
    from attnmt.decode.translator import Translator
    from attnmt.search.options import SearchOptions


def backend(translator: Translator, options: SearchOptions, batch_size: int | None, tgt_lang: str | None) -> Backend:
    """``translator`` as a :class:`Backend` translating into ``tgt_lang`` under ``options``
    (n-best ignored: one translation per sentence), alignments where its engine supports
    ``return_attention``."""
    options = replace(options, nbest=1)
    aligned = "return_attention" in translator.engine.supports

    def translate(sentences: list[str], alignments: bool) -> list[tuple[str, list[tuple[int, int]] | None]]:
        align = aligned and alignments
        done = translator.translate(sentences, options=options, batch_size=batch_size, alignments=align,
                                    tgt_lang=tgt_lang)
        return [(t.text, t.alignment if align else None) for t in done]

    tokenizer = translator.src_tokenizer
    length: Callable[[str], int] = lambda s: len(tokenizer.encode(s))  # noqa: E731
    prefix = languages.source_prefix(translator.config, tokenizer, tgt_lang)
    return Backend(translate, length, translator.config.model.max_positions - 1 - len(prefix),
                   translator.sentence_starts())


def source_language(translator: Translator, src_lang: str | None) -> str | None:
    """``src_lang``, or the model's source language where it has one (None otherwise)."""
    if src_lang:
        return src_lang
    sources = languages.served_languages(translator.config)[0]
    return sources[0] if len(sources) == 1 else None
