"""Documents over HTTP: a document's sentences go through the server's dynamic batcher, with
the sentences of every other request, and the document comes back whole.

``attnmt.documents`` cuts a document into sentences and puts it back together around their
translations; it asks a :class:`attnmt.documents.Backend` for the translations, once per
document with all its sentences. Here that backend is the server's: it queues the sentences in
the :class:`TranslationService`'s batcher (with word alignments where the document has inline
markup to place and the engine gives source attention) and waits for them. The document layer runs in a thread pool of its
own (parsing and reassembly never hold up the event loop), whose threads wait on the event loop
for the batcher's answers; the pool is not the event loop's default executor, whose threads the
service needs to tokenise those sentences.

Limits: a request's documents together have at most ``sentences`` sentences, each of at most
``chars`` characters (:class:`DocumentTooLarge`), counted as the model receives them: a sentence
longer than the model's positions is cut into pieces first, each a sentence here
(``attnmt.documents.sentences``). The callers choose which of the server's limits these are
(``attnmt.serve.routes``, ``attnmt.serve.libre``). The body size limit holds as for
every request (``attnmt.serve.middleware``).

Library: the standard library's ``concurrent.futures`` and ``asyncio``.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from attnmt.decode.documents import backend, source_language
from attnmt.documents import Aligned, Backend, translate_document
from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.service import SentenceRequest, TranslationService

# Documents translated at the same time; more wait for a free thread (their sentences still
# share batches with everything else once queued).
DOCUMENT_THREADS = 4


class DocumentTooLarge(Exception):
    """A request's documents are over a limit: ``what`` is 'sentences' (``count`` of them) or
    'characters' (``count`` in one sentence), ``limit`` the most allowed."""

    def __init__(self, what: str, count: int, limit: int):
        self.what = what
        self.count = count
        self.limit = limit
        super().__init__(f"{count} {what}" + (" in one sentence" if what == "characters" else "")
                         + f"; at most {limit}")


class _Budget:
    """The sentences a request's documents may still send (shared by its documents' threads)."""

    def __init__(self, sentences: int, chars: int):
        self.left = sentences
        self.limit = sentences
        self.chars = chars
        self.lock = threading.Lock()

    def take(self, sentences: list[str]) -> None:
        longest = max(map(len, sentences), default=0)
        if longest > self.chars:
            raise DocumentTooLarge("characters", longest, self.chars)
        with self.lock:
            self.left -= len(sentences)
            if self.left < 0:
                raise DocumentTooLarge("sentences", self.limit - self.left, self.limit)


class DocumentTranslator:
    """Translates documents through ``service``'s batcher (module docstring).

    Args:
        service: the loaded translation service.
        metrics: where translated sentences are counted.
    """

    def __init__(self, service: TranslationService, metrics: ServeMetrics):
        self.service = service
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(DOCUMENT_THREADS, thread_name_prefix="attnmt-documents")

    def close(self) -> None:
        """Finish the documents in hand (their sentences need the batcher: close it after)."""
        self.pool.shutdown(wait=True)

    def source_language(self, src_lang: str | None) -> str | None:
        """The language whose sentence rules apply: ``src_lang``, else the model's only source."""
        return source_language(self.service.translator, src_lang)

    def _backend(self, loop: asyncio.AbstractEventLoop, budget: _Budget, beam_size: int,
                 early_stopping: bool | None, patience: float | None, tgt_lang: str | None) -> Backend:
        """The document layer's backend: its sentences queued in the service's batcher from a
        pool thread, waited for on ``loop``; word alignments where the document asks for them
        and the engine has attention."""
        service = self.service
        can_align = "return_attention" in service.translator.engine.supports

        def translate(sentences: list[str], alignments: bool) -> list[Aligned]:
            budget.take(sentences)
            aligned = can_align and alignments
            asks = [SentenceRequest(alignments=aligned) for _ in sentences]
            done = asyncio.run_coroutine_threadsafe(
                service.translate(sentences, beam_size, 1, False, asks, early_stopping, patience, tgt_lang),
                loop).result()
            self.metrics.sentences.inc(len(sentences))
            return [(t.text, t.alignment if aligned else None) for t, _ in done]

        base = backend(service.translator, service.translator.options(beam_size), None, tgt_lang)
        return replace(base, translate=translate)

    async def translate(self, documents: list[str | bytes], input_format: str, split_sentences: bool,
                        src_lang: str | None, beam_size: int, early_stopping: bool | None = None,
                        patience: float | None = None, tgt_lang: str | None = None, *, sentences: int,
                        chars: int) -> list[str | bytes]:
        """Translate ``documents`` of ``input_format`` (``attnmt.documents.translate_document``)
        into ``tgt_lang``, at most ``sentences`` sentences in all, each of at most ``chars``
        characters; the sentence rules of ``src_lang`` (default the model's source language).

        Raises:
            DocumentTooLarge: over ``sentences`` or ``chars`` (before those sentences are queued).
            DocumentError: a document that is not of its format (the message names the place).
            Busy, TimeoutError, LanguageError: as ``TranslationService.translate``.
        """
        loop = asyncio.get_running_loop()
        budget = _Budget(sentences, chars)
        doc_backend = self._backend(loop, budget, beam_size, early_stopping, patience, tgt_lang)
        lang = self.source_language(src_lang)
        return list(await asyncio.gather(*(
            loop.run_in_executor(self.pool, translate_document, d, input_format, doc_backend, lang, split_sentences)
            for d in documents)))
