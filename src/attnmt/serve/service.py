"""The translation service behind the HTTP routes, over a loaded translator: language policy,
batching, capability checks and the JSON of an answer.

:class:`TranslationService` holds the language policy (which languages a model reads and
translates into; a multilingual model's ``tgt_lang``), the capabilities check (an option the
engine lacks is refused before any work), the batching (sentences tokenised once, queued by
their search options; ``attnmt.serve.batcher``), the stopping rule's defaults
(``attnmt.search.options.stopping_rule``) and the JSON of an answer (each hypothesis an
``attnmt.decode.output.hypothesis_record``) and of ``/v1/models``. It knows no HTTP: the routes
(``attnmt.serve.routes``) turn its errors into status codes.

Shapes: T output subwords, S source subwords, L layers, H heads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from attnmt.config import DEFAULT_ALIGNMENT_LAYER, DEFAULT_ATTENTION_LAYER
from attnmt.decode.alignment import format_alignment
from attnmt.decode.engine import UnsupportedOption, check_supported, require
from attnmt.decode.output import hypothesis_record
from attnmt.decode.translator import Translation, Translator
from attnmt.documents import INPUT_FORMATS
from attnmt.languages import LanguageError, served_languages, spelling, target_language
from attnmt.search.options import stopping_rule
from attnmt.serve.batcher import DynamicBatcher, Job
from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.schemas import AttentionOut, HypothesisOut, TranslateResponse, TranslationOut
from attnmt.serve.settings import ServeSettings
from attnmt.serve.stream import StreamJob

if TYPE_CHECKING:  # tensors only where the native engine returns attention: a CTranslate2 server runs without PyTorch
    import torch


@dataclass
class SentenceRequest:
    """What one sentence of a request asks for besides the search options (a :class:`Job`'s
    payload): its source ids (set when queued; the first ``tagged`` are a language tag), its
    position in the request (from 1), the attention, the word alignment, constraints, and the
    stream it feeds."""

    attention: bool = False
    alignments: bool = False
    constraints: list[str] = field(default_factory=list)
    stream: StreamJob | None = None
    src_ids: list[int] = field(default_factory=list)
    line: int = 1
    tagged: int = 0


class TranslationService:
    """A loaded translator behind a dynamic batcher.

    Requests with ``return_attention`` go to a batcher (and worker thread) of their own: their
    extra forced-decoding pass never holds up the batches of the other requests.

    Args:
        translator: the model over any engine; searched only in the batchers' worker threads.
        settings: limits and batching parameters.
        metrics: where batches are recorded.
        languages: a bilingual model's (source, target) language codes, None where unknown
            (``/v1/models`` and the LibreTranslate routes); default ``translator.config.languages()``.
            A multilingual model's languages come from its config (``attnmt.languages.served_languages``).

    Attributes:
        multilingual: the model needs a ``tgt_lang`` (``tokenizer.target_languages`` is set).
        sources, targets: the language codes it translates from and into (lists of str).
    """

    def __init__(self, translator: Translator, settings: ServeSettings, metrics: ServeMetrics,
                 languages: tuple[str | None, str | None] | None = None):
        self.translator = translator
        self.settings = settings
        self.languages = languages or translator.config.languages()
        self.multilingual = bool(translator.config.tokenizer.target_languages)
        if self.multilingual or None in self.languages:  # the config's: a many-to-one model reads several sources
            self.sources, self.targets = served_languages(translator.config)
        else:
            source, target = self.languages
            self.sources = [source] if source else []
            self.targets = [target] if target else []
        layers = translator.config.model.num_decoder_layers
        self.attention_layer = min(settings.attention_layer or DEFAULT_ATTENTION_LAYER, layers)
        self.alignment_layer = min(DEFAULT_ALIGNMENT_LAYER, layers)
        self.metrics = metrics
        self.batcher = DynamicBatcher(self._run_batch, settings.batch_tokens, settings.max_wait_ms,
                                      settings.max_queue, metrics.observe_batch)
        self.attention_batcher = DynamicBatcher(self._run_batch, settings.batch_tokens, settings.max_wait_ms,
                                                settings.max_queue, metrics.observe_batch)
        metrics.queued.set_function(lambda: self.batcher.queued + self.attention_batcher.queued)

    def close(self) -> None:
        """Finish every queued sentence, then stop the worker threads."""
        self.batcher.close()
        self.attention_batcher.close()

    def _run_batch(self, jobs: list[Job]) -> list[tuple[Translation, torch.Tensor | None]]:
        """Search one batch (jobs of one key: beam size, n-best, attention, stopping rule); each job's
        ``payload`` is its :class:`SentenceRequest` (source ids tokenised once by the request,
        constraints, alignment, stream)."""
        beam_size, nbest, attention, early_stopping, patience = jobs[0].key
        asks: list[SentenceRequest] = [j.payload for j in jobs]
        src_ids = [a.src_ids for a in asks]
        options = self.translator.options(beam_size, nbest, return_attention=attention, early_stopping=early_stopping,
                                          patience=patience)
        warnings: dict[int, list[str]] = {}
        if any(a.constraints for a in asks):
            ids, warnings = self.translator.encode_constraints([a.constraints for a in asks], src_ids, options,
                                                               [a.line for a in asks])
            options = replace(options, constraints=ids)
        streams = [a.stream for a in asks]
        if any(streams):
            options = replace(options, on_step=lambda i, tokens: streams[i].on_step(tokens) if streams[i] else False)
        results = self.translator.translate_ids(src_ids, options, batch_size=len(jobs))
        self.metrics.streams_stopped.inc(sum(s.stopped for s in streams if s is not None))
        for k, (r, a) in enumerate(zip(results, asks)):
            r.warnings = warnings.get(k, [])
            if a.alignments and not (a.stream is not None and a.stream.stopped):
                self.translator.align(a.src_ids, r, self.alignment_layer, a.tagged)
        return [(r, self._attention(r) if a.attention else None) for r, a in zip(results, asks)]

    def attention_layer_of(self, result: Translation) -> int:
        """The decoder layer (1-based) whose attention :meth:`_attention` returns for ``result``:
        the attention layer where the engine returned every layer's attention (native), else
        the one layer it returned, the alignment layer (CTranslate2: its export's)."""
        if result.attention is None or result.attention.size(0) == self.translator.config.model.num_decoder_layers:
            return self.attention_layer
        return self.alignment_layer

    def _attention(self, result: Translation) -> torch.Tensor:
        """Head average of :meth:`attention_layer_of` ``result``'s source attention: float32 (T, S)."""
        one = result.attention.size(0) < self.translator.config.model.num_decoder_layers  # CTranslate2: one layer
        return result.attention[0 if one else self.attention_layer - 1].mean(dim=0)  # (L, H, T, S) -> (T, S)

    def spelled(self, code: str) -> str:
        """``code`` in the model's spelling where it names one of its languages, compared
        ignoring case (``attnmt.languages.spelling``); else ``code`` unchanged."""
        return spelling(code, self.targets) or spelling(code, self.sources) or code

    def targets_of(self, source: str) -> list[str]:
        """The languages ``source`` translates into: a multilingual model's every target but
        ``source`` itself (zero-shot directions included), a bilingual model's target from its
        source; [] for a language it does not read (codes compared ignoring case)."""
        source = spelling(source, self.sources)
        if source is None:
            return []
        if not self.multilingual:
            return list(self.targets)
        return [t for t in self.targets if t.casefold() != source.casefold()]

    def target_language(self, tgt_lang: str | None) -> str | None:
        """A request's ``tgt_lang`` checked against the model (``attnmt.languages.target_language``):
        the tag's language, or None for a bilingual model.

        Raises:
            LanguageError: missing for a multilingual model, or a language the model does not
                translate into (the message names those it does).
        """
        if not self.multilingual and tgt_lang is not None and self.targets and spelling(tgt_lang, self.targets) is None:
            raise LanguageError(f"this model translates into {self.targets[0]} only, not {tgt_lang!r}")
        return target_language(self.translator.config, tgt_lang)

    def check(self, beam_size: int, nbest: int, attention: bool, constraints: bool = False,
              streaming: bool = False, early_stopping: bool | None = None, patience: float | None = None,
              alignments: bool = False) -> None:
        """Refuse search options the engine lacks, before any work: alignments need the source
        attention of the search (``return_attention``), and of forced decoding for an n-best list
        (the ``attention`` capability).

        Raises:
            UnsupportedOption: e.g. attention or constraints with the ctranslate2 engine.
            ValueError: nbest > beam, or a patience without early stopping.
        """
        engine = self.translator.engine
        early, patience = stopping_rule(self.translator.config.decode, early_stopping, patience)
        check_supported(engine, self.translator.options(beam_size, nbest, return_attention=attention or alignments,
                                                        early_stopping=early, patience=patience))
        if alignments and nbest > 1:
            require(engine, "attention", "alignments of n-best lists")
        for name, wanted in (("constraints", constraints), ("streaming", streaming)):
            if wanted and name not in engine.supports:
                raise UnsupportedOption(f"the {engine.name} engine does not support {name}")

    async def submit(self, texts: list[str], beam_size: int, nbest: int, attention: bool,
                     asks: list[SentenceRequest] | None = None, early_stopping: bool | None = None,
                     patience: float | None = None, tgt_lang: str | None = None) -> list[Job]:
        """Queue the non-empty ``texts`` in a batcher, tokenised once in a worker thread (not on
        the event loop), a multilingual model's with the tag of ``tgt_lang`` in front (checked
        first: :meth:`target_language`); ``asks`` are their requests (default: attention as
        given). Requests that need attention (``attention``, alignments) go to the attention
        batcher. Only sentences with the same search options (beam size, n-best, attention,
        the stopping rule) share a batch; the target language is not among them, since its
        tag is part of the source ids.

        Raises:
            LanguageError: see :meth:`target_language` (before anything is queued).
            Busy: the batcher's refusal, :class:`QueueFull` or :class:`Closed`
                (:meth:`DynamicBatcher.submit`).
        """
        loop = asyncio.get_running_loop()
        tagged = 0 if self.target_language(tgt_lang) is None else 1
        asks = asks or [SentenceRequest(attention=attention) for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        src_ids = await loop.run_in_executor(None, self.translator.encode_sources, [texts[i] for i in todo], tgt_lang)
        needs_attention = attention or any(a.alignments for a in asks)
        for i, ids in zip(todo, src_ids):
            asks[i].src_ids = ids
            asks[i].line = i + 1
            asks[i].tagged = tagged
        early_stopping, patience = stopping_rule(self.translator.config.decode, early_stopping, patience)
        key = (beam_size, nbest, needs_attention, early_stopping, patience)
        jobs = [Job(texts[i], len(ids), key, beam_size, asks[i], loop.create_future(), loop)
                for i, ids in zip(todo, src_ids)]
        (self.attention_batcher if needs_attention else self.batcher).submit(jobs)
        return jobs

    async def results(self, texts: list[str], jobs: list[Job], attention: bool
                      ) -> list[tuple[Translation, torch.Tensor | None]]:
        """Wait for the jobs of :meth:`submit`; empty (or blank) strings give empty translations.

        Raises:
            TimeoutError: not done within ``request_timeout_s`` (the jobs are then dropped, as
            when the waiting request is cancelled).
        """
        try:
            done = await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), self.settings.request_timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            for job in jobs:
                job.cancelled = True
            raise
        empty = Translator.empty()
        if attention:  # asked of the native engine only (the others refuse it)
            import torch
        results: list[tuple[Translation, torch.Tensor | None]] = [
            (empty, torch.zeros(0, 0) if attention else None)] * len(texts)
        for i, result in zip([i for i, t in enumerate(texts) if t.strip()], done):
            results[i] = result
        return results

    async def translate(self, texts: list[str], beam_size: int, nbest: int, attention: bool,
                        asks: list[SentenceRequest] | None = None, early_stopping: bool | None = None,
                        patience: float | None = None, tgt_lang: str | None = None
                        ) -> list[tuple[Translation, torch.Tensor | None]]:
        """Translate through a batcher (:meth:`submit`, then :meth:`results`) into ``tgt_lang``;
        empty (or blank) strings at once.

        Raises:
            LanguageError: see :meth:`target_language` (before anything is queued).
            Busy: the batcher's refusal, :class:`QueueFull` or :class:`Closed`
                (:meth:`DynamicBatcher.submit`).
            TimeoutError: not done within ``request_timeout_s`` (the jobs are then dropped).
        """
        jobs = await self.submit(texts, beam_size, nbest, attention, asks, early_stopping, patience, tgt_lang)
        return await self.results(texts, jobs, attention)

    def respond(self, results: list[tuple[Translation, torch.Tensor | None]], scores: bool,
                alignments: bool = False) -> TranslateResponse:
        """The JSON body for ``results`` (see :class:`TranslateResponse`)."""
        out = []
        for translation, weights in results:
            hyps = [HypothesisOut(**hypothesis_record(h, self.translator.confidence, tokens=scores, alignment=False))
                    for h in translation.hypotheses]
            attention = None
            if weights is not None:
                best = translation.hypotheses[0]
                attention = AttentionOut(layer=self.attention_layer_of(translation),
                                         src_tokens=translation.src_pieces, tgt_tokens=best.pieces,
                                         weights=weights[:len(best.pieces)].tolist())
            alignment = format_alignment(translation.alignment or []) if alignments else None
            out.append(TranslationOut(text=translation.text, hypotheses=hyps, attention=attention,
                                      alignment=alignment, warnings=translation.warnings or None))
        return TranslateResponse(translations=out)

    def describe(self, name: str) -> dict:
        """The ``/v1/models`` entry: languages (a bilingual model's ``source_language`` and
        ``target_language``, None for a multilingual one; every model's ``source_languages`` and
        ``target_languages``; ``multilingual``: requests need a ``tgt_lang``), engine, model size,
        decoding defaults, limits, the document formats ``input_format`` takes (any model
        directory: trained, imported or exported)."""
        tr = self.translator
        engine = tr.engine
        m = tr.config.model
        dc = tr.config.decode
        pair = (None, None) if self.multilingual else self.languages
        return {"id": name, "source_language": pair[0], "target_language": pair[1],
                "multilingual": self.multilingual, "source_languages": self.sources, "target_languages": self.targets,
                "engine": {"name": engine.name, "device": engine.device, "precision": tr.precision,
                           "supports": sorted(engine.supports)},
                "model": {"d_model": m.d_model, "num_heads": m.num_heads, "d_ff": m.d_ff,
                          "num_encoder_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
                          "src_vocab_size": tr.src_tokenizer.vocab_size, "tgt_vocab_size": tr.tgt_tokenizer.vocab_size},
                "decode": {"beam_size": dc.beam_size, "early_stopping": dc.early_stopping, "patience": dc.patience,
                           "length_penalty": dc.length_penalty,
                           "length_penalty_type": dc.length_penalty_type, "length_penalty_k": dc.length_penalty_k,
                           "precision": tr.precision, "attention": tr.attention_kind},
                "attention_layer": self.attention_layer, "alignment_layer": self.alignment_layer,
                "limits": self.settings.model_dump(), "input_formats": list(INPUT_FORMATS)}
