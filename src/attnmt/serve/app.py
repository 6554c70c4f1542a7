"""The HTTP API of ``attnmt serve``: FastAPI routes over a :class:`DynamicBatcher`.

Routes:
    ``POST /v1/translate``: ``{"text": str | [str], "tgt_lang"?, "beam_size"?, "nbest"?,
    "early_stopping"?, "patience"?, "return_scores"?, "return_attention"?, "constraints"?,
    "alignments"?}`` -> ``{"translations": [...]}`` in input order (:class:`TranslateResponse`);
    each hypothesis carries its confidence (mean token log-probability, its words and their
    probabilities). ``tgt_lang``, the language to translate into, is required by a multilingual
    model (``attnmt.languages``); a bilingual one takes none or its own target.
    ``POST /v1/translate/stream``: the same for one sentence, answered with Server-Sent Events:
    ``word`` events (``{"index", "word"}``) as the translation's words become final (greedy: each
    step; beam search: the prefix all live hypotheses share; ``attnmt.serve.stream``), then one
    ``done`` event whose data is the sentence's element of ``translations`` (or ``error``). A
    client that goes away stops its sentence's search at the next step.
    ``GET /health``: 200 once the model is loaded, 503 before. ``GET /v1/models``: languages
    (``source_languages`` and ``target_languages`` too), engine, model and decoding settings,
    limits. ``GET /metrics``: Prometheus text. ``GET /``: the page.
    ``POST /translate``, ``GET /languages``: LibreTranslate's API (``attnmt.serve.libre``).

The translator may run any engine (``attnmt serve --engine``); an option the engine lacks
(``return_attention`` on CTranslate2 or ONNX Runtime) is a 422 before any work.

Errors are JSON ``{"detail": ...}``: 413 body over ``max_body_bytes``; 422 malformed JSON, wrong
types, unknown fields, a request over the sentence, character or beam limits, or a missing or
unknown ``tgt_lang`` (the message names the model's languages); 503 (with
``Retry-After``) while loading, when the queue is full, or when shutting down; 504 when the
translations take longer than ``request_timeout_s``. An empty string translates to an empty
string without a search.

The model loads in a worker thread when the app starts, so ``/health`` answers at once. On
shutdown (uvicorn on SIGTERM stops accepting connections and lets open requests finish) the
batcher finishes every queued sentence before the process ends.

Library: FastAPI (routes, validation, OpenAPI at ``/docs``), Starlette (ASGI), pydantic,
sse-starlette (Server-Sent Events).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI, HTTPException
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from attnmt import ranges
from attnmt.config import DEFAULT_ALIGNMENT_LAYER, DEFAULT_ATTENTION_LAYER
from attnmt.decode.alignment import format_alignment
from attnmt.decode.engine import UnsupportedOption, check_supported
from attnmt.decode.translator import Translation, Translator
from attnmt.languages import LanguageError, served_languages, spelling, target_language
from attnmt.serve import libre
from attnmt.serve.batcher import Closed, DynamicBatcher, Job, QueueFull
from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.settings import ServeSettings
from attnmt.serve.stream import StreamJob
from attnmt.train.metrics import finite_or_none

if TYPE_CHECKING:  # tensors only where the native engine returns attention: a CTranslate2 server runs without PyTorch
    import torch

log = logging.getLogger(__name__)

TRANSLATE_PATH = "/v1/translate"
STREAM_PATH = "/v1/translate/stream"


class TranslateRequest(BaseModel):
    """The body of ``POST /v1/translate``."""

    # strict: a boolean is no number (and no string); allow_inf_nan: JSON's NaN and Infinity are refused
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    tgt_lang: str | None = Field(None, description="the language to translate into: required by a multilingual model "
                                 "(one of /v1/models' target_languages); a bilingual model's own target or none")
    beam_size: int | None = Field(None, **ranges.BEAM_SIZE.bounds(), description="beam size K (1 = greedy, at most "
                                  "the server's max_beam_size); default from the model")
    nbest: int = Field(1, **ranges.BEAM_SIZE.bounds(), description="hypotheses per sentence, best first (<= beam size)")
    early_stopping: bool | None = Field(
        None, description="beam search's stopping rule: true stops a sentence once beam_size x patience hypotheses "
        "have finished (CTranslate2's rule), false once no open hypothesis can win (exact); default from the server")
    patience: float | None = Field(None, **ranges.PATIENCE.bounds(), description="with early_stopping: wait for "
                                   "round(beam_size x patience) finished hypotheses; default from the server (1 "
                                   "without early stopping)")
    return_scores: bool = Field(False, description="add each hypothesis' subword tokens and their probabilities")
    return_attention: bool = Field(False, description="add the best hypothesis' source attention")
    constraints: list[str] | list[list[str]] | None = Field(
        None, description="terms the translation must contain (lexically constrained beam search): a list of "
        "phrases for a single text, or one list of phrases per text")
    alignments: bool = Field(False, description="add the best hypothesis' word alignment (Moses 'i-j' pairs)")


class TranslateStreamRequest(TranslateRequest):
    """The body of ``POST /v1/translate/stream``: one sentence."""

    text: str = Field(description="one sentence")


class HypothesisOut(BaseModel):
    text: str
    score: float = Field(description="log-probability / GNMT length penalty (beam search), or log-probability")
    log_prob: float = Field(description="natural-log probability of the output, EOS included")
    tokens: list[str] | None = Field(None, description="output subwords, '</s>' last (with return_scores)")
    token_probs: list[float] | None = Field(None, description="probability of each token (with return_scores)")
    mean_log_prob: float = Field(description="confidence: the mean natural-log probability per token, EOS included")
    words: list[str] = Field(description="the words of text (split at whitespace)")
    word_probs: list[float] = Field(description="confidence of each word: the product of its subwords' probabilities")


class AttentionOut(BaseModel):
    layer: int = Field(description="the decoder layer (1-based); weights are the average of its heads")
    src_tokens: list[str] = Field(description="source subwords, '</s>' last (S of them)")
    tgt_tokens: list[str] = Field(description="output subwords of the best hypothesis (T of them)")
    weights: list[list[float]] = Field(description="T rows of S weights; row t sums to 1")


class TranslationOut(BaseModel):
    text: str = Field(description="the best translation")
    hypotheses: list[HypothesisOut] = Field(description="nbest hypotheses, best first")
    attention: AttentionOut | None = None
    alignment: str | None = Field(None, description="with alignments: source-target word pairs of the best "
                                  "hypothesis, 0-based, e.g. '0-0 1-2 2-1'")
    warnings: list[str] | None = Field(None, description="e.g. constraints left out because they cannot fit")


class TranslateResponse(BaseModel):
    translations: list[TranslationOut] = Field(description="one per input sentence, in input order")


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
            self.sources, self.targets = [source] if source else [], [target] if target else []
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

    def _attention(self, result: Translation) -> torch.Tensor:
        """Head average of the attention layer's source attention: float32 (T, S)."""
        return result.attention[self.attention_layer - 1].mean(dim=0)  # (L, H, T, S) -> (T, S)

    def stopping_rule(self, early_stopping: bool | None = None, patience: float | None = None) -> tuple[bool, float]:
        """A request's (early_stopping, patience): the server's default (the model's
        ``decode`` section, or ``attnmt serve --early-stopping / --patience``) where not given;
        without early stopping the patience defaults to 1."""
        decode = self.translator.config.decode
        early = decode.early_stopping if early_stopping is None else early_stopping
        return early, (patience if patience is not None else decode.patience if early else 1.0)

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
              streaming: bool = False, early_stopping: bool | None = None, patience: float | None = None) -> None:
        """Refuse search options the engine lacks, before any work (alignments need attention).

        Raises:
            UnsupportedOption: e.g. attention or constraints with the ctranslate2 engine.
            ValueError: nbest > beam, or a patience without early stopping.
        """
        engine = self.translator.engine
        early, patience = self.stopping_rule(early_stopping, patience)
        check_supported(engine, self.translator.options(beam_size, nbest, return_attention=attention,
                                                        early_stopping=early, patience=patience))
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
        :meth:`stopping_rule`) share a batch; the target language is not among them, since its
        tag is part of the source ids.

        Raises:
            LanguageError: see :meth:`target_language` (before anything is queued).
            QueueFull, Closed: from :meth:`DynamicBatcher.submit`.
        """
        loop = asyncio.get_running_loop()
        tagged = 0 if self.target_language(tgt_lang) is None else 1
        asks = asks or [SentenceRequest(attention=attention) for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        src_ids = await loop.run_in_executor(None, self.translator.encode_sources, [texts[i] for i in todo], tgt_lang)
        needs_attention = attention or any(a.alignments for a in asks)
        for i, ids in zip(todo, src_ids):
            asks[i].src_ids, asks[i].line, asks[i].tagged = ids, i + 1, tagged
        key = (beam_size, nbest, needs_attention, *self.stopping_rule(early_stopping, patience))
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
            QueueFull, Closed: from :meth:`DynamicBatcher.submit`.
            TimeoutError: not done within ``request_timeout_s`` (the jobs are then dropped).
        """
        jobs = await self.submit(texts, beam_size, nbest, attention, asks, early_stopping, patience, tgt_lang)
        return await self.results(texts, jobs, attention)

    def respond(self, results: list[tuple[Translation, torch.Tensor | None]], scores: bool,
                alignments: bool = False) -> TranslateResponse:
        """The JSON body for ``results`` (see :class:`TranslateResponse`)."""
        out = []
        for translation, weights in results:
            hyps = []
            for h in translation.hypotheses:
                words, word_probs = self.translator.confidence(h)
                hyps.append(HypothesisOut(text=h.text, score=h.score, log_prob=h.log_prob,
                                          tokens=h.pieces if scores else None,
                                          token_probs=[math.exp(lp) for lp in h.token_log_probs] if scores else None,
                                          mean_log_prob=h.mean_log_prob, words=words, word_probs=word_probs))
            attention = None
            if weights is not None:
                best = translation.hypotheses[0]
                attention = AttentionOut(layer=self.attention_layer, src_tokens=translation.src_pieces,
                                         tgt_tokens=best.pieces, weights=weights[:len(best.pieces)].tolist())
            alignment = format_alignment(translation.alignment or []) if alignments else None
            out.append(TranslationOut(text=translation.text, hypotheses=hyps, attention=attention,
                                      alignment=alignment, warnings=translation.warnings or None))
        return TranslateResponse(translations=out)

    def describe(self, name: str) -> dict:
        """The ``/v1/models`` entry: languages (a bilingual model's ``source_language`` and
        ``target_language``, None for a multilingual one; every model's ``source_languages`` and
        ``target_languages``; ``multilingual``: requests need a ``tgt_lang``), engine, model size,
        decoding defaults, limits (any model directory: trained, imported or exported)."""
        config, tr, engine = self.translator.config, self.translator, self.translator.engine
        m, dc = config.model, config.decode
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
                "limits": self.settings.model_dump()}


class _AppState:
    """What the routes share: the service once loaded, or why loading failed."""

    def __init__(self, loader: Callable[[], Translator], settings: ServeSettings,
                 languages: tuple[str | None, str | None] | None = None):
        self.loader = loader
        self.settings = settings
        self.languages = languages
        self.metrics = ServeMetrics()
        self.service: TranslationService | None = None
        self.error: str | None = None

    def load(self) -> None:
        try:
            self.service = TranslationService(self.loader(), self.settings, self.metrics, self.languages)
            log.info("model loaded; ready")
        except Exception as e:  # noqa: BLE001  (reported by /health; the server stays up to say so)
            log.exception("loading the model failed")
            self.error = f"{type(e).__name__}: {e}"

    def ready(self) -> TranslationService:
        """The service, or a 503 while loading (500 if loading failed)."""
        if self.service is not None:
            return self.service
        if self.error is not None:
            raise HTTPException(500, f"the model could not be loaded: {self.error}")
        raise HTTPException(503, "the model is loading", headers={"Retry-After": str(self.settings.retry_after_s)})


class RequestGuard:
    """ASGI middleware: refuses bodies over ``max_body_bytes`` (413) and records each
    ``/v1/translate`` request's status and latency in the metrics.

    Checks the Content-Length header first; a body sent without one (chunked) is read up to the
    limit before the app sees it.
    """

    def __init__(self, app, state: _AppState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, limit = time.perf_counter(), self.state.settings.max_body_bytes
        status = {"code": 500}

        async def send_recording(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            body = await _read_body(scope, receive, limit)
            if body is None:
                await _send_json(send_recording, 413, {"detail": f"the request body is over {limit} bytes"})
                return
            await self.app(scope, _replay(body, receive), send_recording)
        finally:
            if scope["path"] in (TRANSLATE_PATH, STREAM_PATH):
                self.state.metrics.observe_request(status["code"], started)


async def _read_body(scope, receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is over ``limit`` bytes."""
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and int(length) > limit:
        return None
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive):
    """An ASGI ``receive`` that gives ``body`` once, then waits on the real one (disconnects)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_json(send, code: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def create_app(loader: Callable[[], Translator], settings: ServeSettings | None = None, name: str = "model",
               languages: tuple[str | None, str | None] | None = None) -> FastAPI:
    """The FastAPI app; ``loader`` runs in a worker thread at startup and returns the translator
    (over any engine).

    Args:
        loader: e.g. ``lambda: Translator.from_dir(path)``.
        settings: limits and batching; defaults when None.
        name: the model's id in ``/v1/models``.
        languages: the model's (source, target) language codes (``attnmt.rundir.model_languages``);
            default the translator's config.
    """
    state = _AppState(loader, settings or ServeSettings(), languages)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        loading = loop.run_in_executor(None, state.load)
        try:
            yield
        finally:
            await loading
            if state.service is not None:  # finish what is queued
                await loop.run_in_executor(None, state.service.close)

    app = FastAPI(title="attnmt", summary="Transformer translation with dynamic batching", lifespan=lifespan)
    app.add_middleware(RequestGuard, state=state)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.state.attnmt = state
    _add_info_routes(app, state, name)
    _add_translate_route(app, state)
    libre.add_routes(app, state.ready)
    return app


async def _invalid_request(request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body its schema refuses, ``{"detail": [errors]}``, in strict JSON: a
    refused ``NaN`` or ``Infinity`` is echoed as null (FastAPI's own handler cannot encode it and
    would answer 500)."""
    return JSONResponse({"detail": finite_or_none(jsonable_encoder(exc.errors()))}, 422)


def _add_info_routes(app: FastAPI, state: _AppState, name: str) -> None:
    page = resources.files("attnmt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    @app.get("/health")
    async def health() -> Response:
        """200 ``{"status": "ready"}`` once the model is loaded; 503 ``loading`` or ``failed`` before."""
        if state.service is not None:
            body, code = {"status": "ready"}, 200
        else:
            body, code = ({"status": "failed", "detail": state.error} if state.error else {"status": "loading"}), 503
        return Response(json.dumps(body), code, media_type="application/json")

    @app.get("/v1/models")
    async def models() -> dict:
        """The served model: languages, size, decoding defaults and the request limits."""
        return {"data": [state.ready().describe(name)]}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics (text format)."""
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_translate_route(app: FastAPI, state: _AppState) -> None:
    @app.post(TRANSLATE_PATH, response_model=TranslateResponse, response_model_exclude_none=True,
              responses={413: {"description": "body too large"}, 422: {"description": "invalid or over a limit"},
                         503: {"description": "loading, queue full or shutting down"},
                         504: {"description": "timed out"}})
    async def translate(request: TranslateRequest) -> TranslateResponse:
        """Translate one sentence or a list of them (each on its own), in input order."""
        service, s = state.ready(), state.settings
        texts, beam_size, asks = _checked(request, service, s)
        retry = {"Retry-After": str(s.retry_after_s)}
        try:
            results = await service.translate(texts, beam_size, request.nbest, request.return_attention, asks,
                                              request.early_stopping, request.patience, request.tgt_lang)
        except QueueFull as e:
            raise HTTPException(503, f"too busy: {e}", headers=retry) from None
        except Closed as e:
            raise HTTPException(503, str(e), headers=retry) from None
        except TimeoutError:
            raise HTTPException(504, f"not translated within {s.request_timeout_s} s") from None
        state.metrics.sentences.inc(len(texts))
        return service.respond(results, request.return_scores, request.alignments)

    @app.post(STREAM_PATH, response_class=EventSourceResponse,
              responses={200: {"content": {"text/event-stream": {}},
                               "description": "word events, then a done event (or an error event)"},
                         413: {"description": "body too large"}, 422: {"description": "invalid or over a limit"},
                         503: {"description": "loading, queue full or shutting down"}})
    async def translate_stream(request: TranslateStreamRequest) -> EventSourceResponse:
        """Translate one sentence, sending its words as they become final (Server-Sent Events)."""
        service, s = state.ready(), state.settings
        texts, beam_size, asks = _checked(request, service, s, streaming=True)
        asks[0].stream = StreamJob(service.translator.tgt_tokenizer.decode, asyncio.get_running_loop())
        try:
            jobs = await service.submit(texts, beam_size, request.nbest, request.return_attention, asks,
                                        request.early_stopping, request.patience, request.tgt_lang)
        except (QueueFull, Closed) as e:
            raise HTTPException(503, f"too busy: {e}" if isinstance(e, QueueFull) else str(e),
                                headers={"Retry-After": str(s.retry_after_s)}) from None
        return EventSourceResponse(_stream_events(state, service, request, texts, jobs, asks[0].stream))


def _checked(request: TranslateRequest, service: TranslationService, s: ServeSettings, streaming: bool = False
             ) -> tuple[list[str], int, list[SentenceRequest]]:
    """The texts, the beam size and each sentence's :class:`SentenceRequest`; a 422 for a request
    over a limit, with text that is not Unicode (a lone surrogate), with constraints that do not
    match its texts or that the target vocabulary cannot spell, asking what the engine lacks, or
    with a ``tgt_lang`` missing (a multilingual model) or unknown."""
    texts = [request.text] if isinstance(request.text, str) else request.text
    beam_size = request.beam_size or service.translator.config.decode.beam_size
    constraints = request.constraints
    if constraints is not None:  # one list of phrases per text
        flat = all(isinstance(c, str) for c in constraints)
        constraints = ([constraints] if flat else None) if isinstance(request.text, str) else \
            (None if flat and constraints else constraints)
    problem = (f"{len(texts)} sentences; at most {s.max_sentences}" if len(texts) > s.max_sentences else
               f"beam_size {beam_size} is over the limit {s.max_beam_size}" if beam_size > s.max_beam_size else
               f"nbest {request.nbest} is larger than beam_size {beam_size}" if request.nbest > beam_size else
               "constraints: a list of phrases for a single text, one list of phrases per text for a list of texts"
               if request.constraints is not None and (constraints is None or len(constraints) != len(texts)) else
               next((f"sentence {i} has {len(t)} characters; at most {s.max_chars}"
                     for i, t in enumerate(texts) if len(t) > s.max_chars), None))
    phrases = [p for c in constraints or [] for p in c]
    problem = problem or libre.not_unicode(texts, "sentence") or libre.not_unicode(phrases, "constraint")
    if problem:
        raise HTTPException(422, problem)
    try:
        service.target_language(request.tgt_lang)
    except LanguageError as e:
        raise HTTPException(422, str(e)) from None
    try:
        service.check(beam_size, request.nbest, request.return_attention or request.alignments,
                      constraints=bool(constraints and any(constraints)), streaming=streaming,
                      early_stopping=request.early_stopping, patience=request.patience)
    except (UnsupportedOption, ValueError) as e:  # ValueError: patience without early stopping
        raise HTTPException(422, str(e)) from None
    if constraints:
        try:
            service.translator.check_constraints(constraints, list(range(len(constraints))))
        except ValueError as e:  # a phrase the target vocabulary cannot spell
            raise HTTPException(422, f"constraints: {e}") from None
    return texts, beam_size, [SentenceRequest(request.return_attention, request.alignments,
                                              list(constraints[i]) if constraints else []) for i in range(len(texts))]


async def _stream_events(state: _AppState, service: TranslationService, request: TranslateStreamRequest,
                         texts: list[str], jobs: list[Job], stream: StreamJob):
    """The events of one streamed sentence (module docstring). When the client goes away the
    generator is cancelled: the job is dropped from the queue, or its search stopped."""
    sent = 0

    def word_events(new: list[str]) -> list[dict]:
        nonlocal sent
        events = [{"event": "word", "data": json.dumps({"index": sent + k, "word": w}, ensure_ascii=False)}
                  for k, w in enumerate(new)]
        sent += len(new)
        return events

    state.metrics.streams_open.inc()
    waiting = asyncio.ensure_future(service.results(texts, jobs, request.return_attention))
    try:
        while True:
            getter = asyncio.ensure_future(stream.queue.get())
            done, _ = await asyncio.wait({getter, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                for event in word_events(getter.result()):
                    yield event
                continue
            getter.cancel()
            while not stream.queue.empty():  # words reported before the search ended
                for event in word_events(stream.queue.get_nowait()):
                    yield event
            try:
                [result] = waiting.result()
            except TimeoutError:
                detail = f"not translated within {state.settings.request_timeout_s} s"
                yield {"event": "error", "data": json.dumps({"detail": detail})}
                return
            except Exception as e:  # noqa: BLE001  (a failed batch: reported to this client)
                yield {"event": "error", "data": json.dumps({"detail": f"{type(e).__name__}: {e}"})}
                return
            for event in word_events(stream.words.update(result[0].hypotheses[0].token_ids, final=True)):
                yield event
            state.metrics.sentences.inc()
            body = service.respond([result], request.return_scores, request.alignments).translations[0]
            yield {"event": "done", "data": body.model_dump_json(exclude_none=True)}
            return
    finally:
        state.metrics.streams_open.dec()
        if not waiting.done():  # the client went away: drop the job, stop its search
            stream.cancelled = True
            for job in jobs:
                job.cancelled = True
            waiting.cancel()
