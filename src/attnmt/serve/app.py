"""The HTTP API of ``attnmt serve``: the FastAPI app assembled from its parts, the model loading
in the background, and every 503.

Routes:
    ``POST /v1/translate``: ``{"text": str | [str], "tgt_lang"?, "beam_size"?, "nbest"?,
    "early_stopping"?, "patience"?, "return_scores"?, "return_attention"?, "constraints"?,
    "alignments"?}`` -> ``{"translations": [...]}`` in input order (:class:`TranslateResponse`);
    each hypothesis carries its confidence (mean token log-probability, its words and their
    probabilities). ``tgt_lang``, the language to translate into, is required by a multilingual
    model (``attnmt.languages``); a bilingual one takes none or its own target.
    With ``"input_format"`` (``attnmt.documents.INPUT_FORMATS``) or ``"split_sentences"`` each
    text is a document, answered whole (``attnmt.serve.documents``; docx as base64).
    ``POST /v1/translate/stream``: the same for one sentence, answered with Server-Sent Events:
    ``word`` events (``{"index", "word"}``) as the translation's words become final (greedy: each
    step; beam search: the prefix all live hypotheses share; ``attnmt.serve.stream``), then one
    ``done`` event whose data is the sentence's element of ``translations`` (or ``error``). A
    client that goes away stops its sentence's search at the next step.
    ``GET /health``: 200 once the model is loaded, 503 before. ``GET /v1/models``: languages
    (``source_languages`` and ``target_languages`` too), engine, model and decoding settings,
    limits. ``GET /metrics``: Prometheus text. ``GET /``: the page.
    ``POST /translate``, ``GET /languages``, ``POST /translate_file``, ``GET /download_file/{name}``:
    LibreTranslate's API (``attnmt.serve.libre``, ``attnmt.serve.libre_files``).

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

The parts: request and response bodies in ``attnmt.serve.schemas``, the translation service in
``attnmt.serve.service``, the body limit and request metrics in ``attnmt.serve.middleware``, the
routes and the Server-Sent Events in ``attnmt.serve.routes`` (``attnmt.serve.libre`` for
LibreTranslate's). :class:`AppState` answers every 503 of both APIs.

Library: FastAPI (routes, validation, OpenAPI at ``/docs``), Starlette (ASGI), pydantic,
sse-starlette (Server-Sent Events).
"""


from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from attnmt.decode.translator import Translator
from attnmt.oneline import finite_or_none
from attnmt.serve import libre, libre_files
from attnmt.serve.batcher import Busy, QueueFull
from attnmt.serve.documents import DocumentTranslator
from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.middleware import RequestGuard
from attnmt.serve.routes import STREAM_PATH, TRANSLATE_PATH, add_info_routes, add_translate_routes
from attnmt.serve.service import TranslationService
from attnmt.serve.settings import ServeSettings

log = logging.getLogger(__name__)


class AppState:
    """What the routes share: the service once loaded, or why loading failed; and the server's
    one answer to "not now", a 503 with ``Retry-After`` (:meth:`unavailable`), for both APIs.

    Args:
        loader: returns the translator; :meth:`load` runs it (in a worker thread).
        settings: limits and batching parameters.
        languages: a bilingual model's (source, target) language codes, or None
            (:class:`TranslationService`).
    """

    def __init__(self, loader: Callable[[], Translator], settings: ServeSettings,
                 languages: tuple[str | None, str | None] | None = None):
        self.loader = loader
        self.settings = settings
        self.languages = languages
        self.metrics = ServeMetrics()
        self.service: TranslationService | None = None
        self.documents: DocumentTranslator | None = None
        self.error: str | None = None

    def load(self) -> None:
        """Load the model and start the service; a failure is kept in :attr:`error` (``/health``)."""
        try:
            service = TranslationService(self.loader(), self.settings, self.metrics, self.languages)
            self.documents = DocumentTranslator(service, self.metrics)
            self.service = service
            log.info("model loaded; ready")
        except Exception as e:  # noqa: BLE001  (reported by /health; the server stays up to say so)
            log.exception("loading the model failed")
            self.error = f"{type(e).__name__}: {e}"

    def ready(self) -> TranslationService:
        """The service, or a 503 while loading (500 if loading failed).

        Raises:
            HTTPException: 503 (:meth:`unavailable`) while loading; 500 naming the error
                when loading failed.
        """
        if self.service is not None:
            return self.service
        if self.error is not None:
            raise HTTPException(500, f"the model could not be loaded: {self.error}")
        raise self.unavailable("the model is loading")

    def unavailable(self, detail: str) -> HTTPException:
        """503 Service Unavailable with ``Retry-After: retry_after_s`` (RFC 9110, sections 15.6.4
        and 10.2.3): the model is loading, or the batcher takes no more sentences now."""
        return HTTPException(503, detail, headers=self._retry_after())

    def health(self) -> JSONResponse:
        """``GET /health``: 200 ``{"status": "ready"}`` once the model is loaded; before, 503
        ``{"status": "loading"}`` or ``{"status": "failed", "detail": ...}``, with
        ``Retry-After`` as every 503 (a probe that polls keeps to it)."""
        if self.service is not None:
            return JSONResponse({"status": "ready"}, 200)
        body = {"status": "failed", "detail": self.error} if self.error else {"status": "loading"}
        return JSONResponse(body, 503, headers=self._retry_after())

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    def busy(self, error: Busy) -> HTTPException:
        """The batcher's refusal as HTTP, for ``/v1/translate``, the stream and LibreTranslate's
        ``/translate`` alike: a 503 (:meth:`unavailable`) saying ``too busy: ...`` when the
        queue is full, or that the server is shutting down."""
        if isinstance(error, QueueFull):
            return self.unavailable(f"too busy: {error}")
        return self.unavailable(str(error))


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
    state = AppState(loader, settings or ServeSettings(), languages)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        loading = loop.run_in_executor(None, state.load)
        try:
            yield
        finally:
            await loading
            if state.service is not None:  # finish what is queued: the documents first, whose sentences it holds
                await loop.run_in_executor(None, state.documents.close)
                await loop.run_in_executor(None, state.service.close)

    app = FastAPI(title="attnmt", summary="Transformer translation with dynamic batching", lifespan=lifespan)
    app.add_middleware(RequestGuard, settings=state.settings, metrics=state.metrics,
                       measured=(TRANSLATE_PATH, STREAM_PATH))
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.state.attnmt = state
    add_info_routes(app, state, name)
    add_translate_routes(app, state)
    libre.add_routes(app, state)
    libre_files.add_file_routes(app, state)
    return app


async def _invalid_request(request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body its schema refuses, ``{"detail": [errors]}``, in strict JSON: a
    refused ``NaN`` or ``Infinity`` is echoed as null (FastAPI's own handler cannot encode it and
    would answer 500)."""
    return JSONResponse({"detail": finite_or_none(jsonable_encoder(exc.errors()))}, 422)
