"""The HTTP API of ``attnmt serve``: FastAPI routes over a :class:`DynamicBatcher`.

Routes:
    ``POST /v1/translate``: ``{"text": str | [str], "beam_size"?, "nbest"?, "return_scores"?,
    "return_attention"?}`` -> ``{"translations": [...]}`` in input order (:class:`TranslateResponse`).
    ``GET /health``: 200 once the model is loaded, 503 before. ``GET /v1/models``: languages,
    model and decoding settings, limits. ``GET /metrics``: Prometheus text. ``GET /``: the page.

Errors are JSON ``{"detail": ...}``: 413 body over ``max_body_bytes``; 422 malformed JSON, wrong
types, unknown fields, or a request over the sentence, character or beam limits; 503 (with
``Retry-After``) while loading, when the queue is full, or when shutting down; 504 when the
translations take longer than ``request_timeout_s``. An empty string translates to an empty
string without a search.

The model loads in a worker thread when the app starts, so ``/health`` answers at once. On
shutdown (uvicorn on SIGTERM stops accepting connections and lets open requests finish) the
batcher finishes every queued sentence before the process ends.

Library: FastAPI (routes, validation, OpenAPI at ``/docs``), Starlette (ASGI), pydantic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources

import torch
from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from attnmt.config import DEFAULT_ATTENTION_LAYER
from attnmt.decode.translator import ScoredHypothesis, Translation, Translator
from attnmt.serve.batcher import Closed, DynamicBatcher, Job, QueueFull
from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.settings import ServeSettings

log = logging.getLogger(__name__)

TRANSLATE_PATH = "/v1/translate"


class TranslateRequest(BaseModel):
    """The body of ``POST /v1/translate``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    beam_size: int | None = Field(None, gt=0, description="beam size K (1 = greedy); default from the model")
    nbest: int = Field(1, gt=0, description="hypotheses per sentence, best first (<= beam size)")
    return_scores: bool = Field(False, description="add each hypothesis' subword tokens and their probabilities")
    return_attention: bool = Field(False, description="add the best hypothesis' source attention")


class HypothesisOut(BaseModel):
    text: str
    score: float = Field(description="log-probability / GNMT length penalty (beam search), or log-probability")
    log_prob: float = Field(description="natural-log probability of the output, EOS included")
    tokens: list[str] | None = Field(None, description="output subwords, '</s>' last (with return_scores)")
    token_probs: list[float] | None = Field(None, description="probability of each token (with return_scores)")


class AttentionOut(BaseModel):
    layer: int = Field(description="the decoder layer (1-based); weights are the average of its heads")
    src_tokens: list[str] = Field(description="source subwords, '</s>' last (S of them)")
    tgt_tokens: list[str] = Field(description="output subwords of the best hypothesis (T of them)")
    weights: list[list[float]] = Field(description="T rows of S weights; row t sums to 1")


class TranslationOut(BaseModel):
    text: str = Field(description="the best translation")
    hypotheses: list[HypothesisOut] = Field(description="nbest hypotheses, best first")
    attention: AttentionOut | None = None


class TranslateResponse(BaseModel):
    translations: list[TranslationOut] = Field(description="one per input sentence, in input order")


class TranslationService:
    """A loaded translator behind a dynamic batcher.

    Args:
        translator: the model; searched only in the batcher's worker thread.
        settings: limits and batching parameters.
        metrics: where batches are recorded.
    """

    def __init__(self, translator: Translator, settings: ServeSettings, metrics: ServeMetrics):
        self.translator = translator
        self.settings = settings
        layers = translator.config.model.num_decoder_layers
        self.attention_layer = min(settings.attention_layer or DEFAULT_ATTENTION_LAYER, layers)
        self.batcher = DynamicBatcher(self._run_batch, settings.batch_tokens, settings.max_wait_ms,
                                      settings.max_queue, metrics.observe_batch)
        metrics.queued.set_function(lambda: self.batcher.queued)

    def _run_batch(self, jobs: list[Job]) -> list[tuple[Translation, torch.Tensor | None]]:
        beam_size, nbest = jobs[0].key
        results = self.translator.translate([j.text for j in jobs], beam_size=beam_size, nbest=nbest,
                                            batch_size=len(jobs))
        return [(r, self._attention(j.text, r) if j.payload else None) for j, r in zip(jobs, results)]

    def _attention(self, text: str, result: Translation) -> torch.Tensor:
        """Head average of the attention layer's source attention: float32 (T, S)."""
        src_ids = self.translator.encode_sources([text])[0]
        weights = self.translator.source_attention(src_ids, result.hypotheses[0].token_ids)  # (L, H, T, S)
        return weights[self.attention_layer - 1].mean(dim=0)

    async def translate(self, texts: list[str], beam_size: int, nbest: int, attention: bool
                        ) -> list[tuple[Translation, torch.Tensor | None]]:
        """Translate through the batcher; empty (or blank) strings at once.

        Raises:
            QueueFull, Closed: from :meth:`DynamicBatcher.submit`.
            TimeoutError: not done within ``request_timeout_s`` (the jobs are then dropped).
        """
        loop = asyncio.get_running_loop()
        todo = [i for i, t in enumerate(texts) if t.strip()]
        lengths = [len(ids) for ids in self.translator.encode_sources([texts[i] for i in todo])]
        jobs = [Job(texts[i], n, (beam_size, nbest), beam_size, attention, loop.create_future(), loop)
                for i, n in zip(todo, lengths)]
        self.batcher.submit(jobs)
        try:
            done = await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), self.settings.request_timeout_s)
        except TimeoutError:
            for job in jobs:
                job.cancelled = True
            raise
        empty = Translation([ScoredHypothesis("", [], [], [], 0.0, 0.0)])
        results: list[tuple[Translation, torch.Tensor | None]] = [
            (empty, torch.zeros(0, 0) if attention else None)] * len(texts)
        for i, result in zip(todo, done):
            results[i] = result
        return results

    def respond(self, results: list[tuple[Translation, torch.Tensor | None]], scores: bool) -> TranslateResponse:
        """The JSON body for ``results`` (see :class:`TranslateResponse`)."""
        out = []
        for translation, weights in results:
            hyps = [HypothesisOut(text=h.text, score=h.score, log_prob=h.log_prob,
                                  tokens=h.pieces if scores else None,
                                  token_probs=[math.exp(lp) for lp in h.token_log_probs] if scores else None)
                    for h in translation.hypotheses]
            attention = None
            if weights is not None:
                best = translation.hypotheses[0]
                attention = AttentionOut(layer=self.attention_layer, src_tokens=translation.src_pieces,
                                         tgt_tokens=best.pieces, weights=weights[:len(best.pieces)].tolist())
            out.append(TranslationOut(text=translation.text, hypotheses=hyps, attention=attention))
        return TranslateResponse(translations=out)

    def describe(self, name: str) -> dict:
        """The ``/v1/models`` entry: languages, model size, decoding defaults, limits."""
        config, tr = self.translator.config, self.translator
        pair = config.data.pair.split("-") if config.data.pair else [None, None]
        m = config.model
        return {"id": name, "source_language": pair[0], "target_language": pair[-1],
                "model": {"d_model": m.d_model, "num_heads": m.num_heads, "d_ff": m.d_ff,
                          "num_encoder_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
                          "src_vocab_size": tr.src_tokenizer.vocab_size, "tgt_vocab_size": tr.tgt_tokenizer.vocab_size},
                "decode": {"beam_size": config.decode.beam_size, "length_penalty": config.decode.length_penalty,
                           "precision": tr.precision, "attention": tr.attention_kind},
                "attention_layer": self.attention_layer, "limits": self.settings.model_dump()}


class _AppState:
    """What the routes share: the service once loaded, or why loading failed."""

    def __init__(self, loader: Callable[[], Translator], settings: ServeSettings):
        self.loader = loader
        self.settings = settings
        self.metrics = ServeMetrics()
        self.service: TranslationService | None = None
        self.error: str | None = None

    def load(self) -> None:
        try:
            self.service = TranslationService(self.loader(), self.settings, self.metrics)
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
            if scope["path"] == TRANSLATE_PATH:
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


def create_app(loader: Callable[[], Translator], settings: ServeSettings | None = None, name: str = "model") -> FastAPI:
    """The FastAPI app; ``loader`` runs in a worker thread at startup and returns the translator.

    Args:
        loader: e.g. ``lambda: Translator.from_dir(path)``.
        settings: limits and batching; defaults when None.
        name: the model's id in ``/v1/models``.
    """
    state = _AppState(loader, settings or ServeSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        loading = loop.run_in_executor(None, state.load)
        try:
            yield
        finally:
            await loading
            if state.service is not None:  # finish what is queued
                await loop.run_in_executor(None, state.service.batcher.close)

    app = FastAPI(title="attnmt", summary="Transformer translation with dynamic batching", lifespan=lifespan)
    app.add_middleware(RequestGuard, state=state)
    app.state.attnmt = state
    _add_info_routes(app, state, name)
    _add_translate_route(app, state)
    return app


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
        texts = [request.text] if isinstance(request.text, str) else request.text
        beam_size = request.beam_size or service.translator.config.decode.beam_size
        problem = (f"{len(texts)} sentences; at most {s.max_sentences}" if len(texts) > s.max_sentences else
                   f"beam_size {beam_size} is over the limit {s.max_beam_size}" if beam_size > s.max_beam_size else
                   f"nbest {request.nbest} is larger than beam_size {beam_size}" if request.nbest > beam_size else
                   next((f"sentence {i} has {len(t)} characters; at most {s.max_chars}"
                         for i, t in enumerate(texts) if len(t) > s.max_chars), None))
        if problem:
            raise HTTPException(422, problem)
        retry = {"Retry-After": str(s.retry_after_s)}
        try:
            results = await service.translate(texts, beam_size, request.nbest, request.return_attention)
        except QueueFull as e:
            raise HTTPException(503, f"too busy: {e}", headers=retry) from None
        except Closed as e:
            raise HTTPException(503, str(e), headers=retry) from None
        except TimeoutError:
            raise HTTPException(504, f"not translated within {s.request_timeout_s} s") from None
        state.metrics.sentences.inc(len(texts))
        return service.respond(results, request.return_scores)
