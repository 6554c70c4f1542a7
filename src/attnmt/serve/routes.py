"""The routes of ``attnmt serve``'s own API (the module docstring of ``attnmt.serve.app`` lists
them), and the Server-Sent Events of a streamed translation.

A route checks its request against the server's limits and the engine (a 422 names what is
wrong), hands the sentences to the service (``attnmt.serve.service``) and turns what the service
raises into a status: 503 while loading or busy (``AppState.ready``, ``AppState.busy``), 504
on time out.

Documents (``/v1/translate`` with ``input_format`` or ``split_sentences``) go through
``attnmt.serve.documents``: a request holds at most ``max_sentences`` documents, together of at
most ``max_queue`` sentences of at most ``max_chars`` characters each, else 413 (as a body over
``max_body_bytes``); a document that is not of its format is a 422 naming the place. Options that
belong to one sentence (``nbest`` over 1, ``return_scores``, ``return_attention``, ``alignments``,
``constraints``) are a 422 with a document.

Library: FastAPI (routes, validation), sse-starlette (Server-Sent Events).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response
from sse_starlette.sse import EventSourceResponse

from attnmt.decode.engine import UnsupportedOption
from attnmt.documents import BINARY_FORMATS, DocumentError
from attnmt.languages import LanguageError
from attnmt.serve import libre
from attnmt.serve.batcher import Busy, Job
from attnmt.serve.documents import DocumentTooLarge
from attnmt.serve.schemas import TranslateRequest, TranslateResponse, TranslateStreamRequest, TranslationOut
from attnmt.serve.service import SentenceRequest, TranslationService
from attnmt.serve.settings import ServeSettings
from attnmt.serve.stream import StreamJob

if TYPE_CHECKING:
    from attnmt.serve.app import AppState

TRANSLATE_PATH = "/v1/translate"
STREAM_PATH = "/v1/translate/stream"


def add_info_routes(app: FastAPI, state: AppState, name: str) -> None:
    """``GET /``, ``/health``, ``/v1/models`` (the model ``name``) and ``/metrics``."""
    page = resources.files("attnmt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    @app.get("/health")
    async def health() -> Response:
        """200 ``{"status": "ready"}`` once the model is loaded; 503 ``loading`` or ``failed`` before."""
        return state.health()

    @app.get("/v1/models")
    async def models() -> dict:
        """The served model: languages, size, decoding defaults and the request limits."""
        return {"data": [state.ready().describe(name)]}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics (text format)."""
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def add_translate_routes(app: FastAPI, state: AppState) -> None:
    """``POST /v1/translate`` and ``POST /v1/translate/stream``."""

    @app.post(TRANSLATE_PATH, response_model=TranslateResponse, response_model_exclude_none=True,
              responses={413: {"description": "body too large"}, 422: {"description": "invalid or over a limit"},
                         503: {"description": "loading, queue full or shutting down"},
                         504: {"description": "timed out"}})
    async def translate(request: TranslateRequest) -> TranslateResponse:
        """Translate one sentence or a list of them (each on its own), in input order; or with
        ``input_format`` (or ``split_sentences``) documents, each answered whole."""
        service = state.ready()
        if request.input_format is not None or request.split_sentences is not None:
            return await _translate_documents(request, state, service)
        texts, beam_size, asks = _checked(request, service, state.settings)
        try:
            results = await service.translate(texts, beam_size, request.nbest, request.return_attention, asks,
                                              request.early_stopping, request.patience, request.tgt_lang)
        except Busy as e:
            raise state.busy(e) from None
        except TimeoutError:
            raise HTTPException(504, f"not translated within {state.settings.request_timeout_s} s") from None
        state.metrics.sentences.inc(len(texts))
        return service.respond(results, request.return_scores, request.alignments)

    @app.post(STREAM_PATH, response_class=EventSourceResponse,
              responses={200: {"content": {"text/event-stream": {}},
                               "description": "word events, then a done event (or an error event)"},
                         413: {"description": "body too large"}, 422: {"description": "invalid or over a limit"},
                         503: {"description": "loading, queue full or shutting down"}})
    async def translate_stream(request: TranslateStreamRequest) -> EventSourceResponse:
        """Translate one sentence, sending its words as they become final (Server-Sent Events)."""
        service = state.ready()
        if request.input_format is not None or request.split_sentences is not None:
            raise HTTPException(422, "the stream translates one sentence; send documents (input_format, "
                                     "split_sentences) to /v1/translate")
        texts, beam_size, asks = _checked(request, service, state.settings, streaming=True)
        asks[0].stream = StreamJob(service.translator.tgt_tokenizer.decode, asyncio.get_running_loop())
        try:
            jobs = await service.submit(texts, beam_size, request.nbest, request.return_attention, asks,
                                        request.early_stopping, request.patience, request.tgt_lang)
        except Busy as e:
            raise state.busy(e) from None
        return EventSourceResponse(_stream_events(state, service, request, texts, jobs, asks[0].stream))


SENTENCE_OPTIONS = ("return_scores", "return_attention", "alignments", "constraints")


async def _translate_documents(request: TranslateRequest, state: AppState, service: TranslationService
                               ) -> TranslateResponse:
    """``request``'s texts as documents of its ``input_format`` (default 'lines'), each answered
    whole (module docstring: the limits and the errors)."""
    s = state.settings
    texts = [request.text] if isinstance(request.text, str) else request.text
    input_format = request.input_format or "lines"
    beam_size = request.beam_size or service.translator.config.decode.beam_size
    asked = [name for name in SENTENCE_OPTIONS if getattr(request, name) not in (False, None)]
    problem = ((f"input_format: {', '.join(asked)} and nbest apply to sentences; a document is answered whole"
                if asked or request.nbest != 1 else None)
               or (f"{len(texts)} documents; at most {s.max_sentences}" if len(texts) > s.max_sentences else None)
               or (f"beam_size {beam_size} is over the limit {s.max_beam_size}" if beam_size > s.max_beam_size
                   else None)
               or libre.not_unicode(texts, "document"))
    if problem:
        raise HTTPException(422, problem)
    documents: list[str | bytes] = list(texts)
    if input_format in BINARY_FORMATS:
        try:
            documents = [base64.b64decode(t, validate=True) for t in texts]
        except (binascii.Error, ValueError) as e:
            raise HTTPException(422, f"input_format {input_format}: the text is not base64 ({e})") from None
    try:
        service.target_language(request.tgt_lang)
        service.check(beam_size, 1, False, early_stopping=request.early_stopping, patience=request.patience)
    except (LanguageError, UnsupportedOption, ValueError) as e:
        raise HTTPException(422, str(e)) from None
    split = input_format != "lines" or bool(request.split_sentences)
    try:
        translated = await state.documents.translate(
            documents, input_format, split, None, beam_size, request.early_stopping, request.patience,
            request.tgt_lang, sentences=s.max_queue, chars=s.max_chars)
    except DocumentTooLarge as e:
        raise HTTPException(413, f"the documents are over the server's limits: {e}") from None
    except DocumentError as e:
        raise HTTPException(422, str(e)) from None
    except Busy as e:
        raise state.busy(e) from None
    except TimeoutError:
        raise HTTPException(504, f"not translated within {s.request_timeout_s} s") from None
    out = [base64.b64encode(t).decode("ascii") if isinstance(t, bytes) else t for t in translated]
    return TranslateResponse(translations=[TranslationOut(text=t) for t in out])


def _checked(request: TranslateRequest, service: TranslationService, s: ServeSettings, streaming: bool = False
             ) -> tuple[list[str], int, list[SentenceRequest]]:
    """The texts, the beam size and each sentence's :class:`SentenceRequest`; a 422 for a request
    over a limit, with text that is not Unicode (a lone surrogate), with constraints that do not
    match its texts or that the target vocabulary cannot spell, asking what the engine lacks, or
    with a ``tgt_lang`` missing (a multilingual model) or unknown."""
    texts = [request.text] if isinstance(request.text, str) else request.text
    beam_size = request.beam_size or service.translator.config.decode.beam_size
    constraints = _constraints_per_text(request)
    phrases = [p for c in constraints or [] for p in c]
    problem = (_over_a_limit(request, texts, beam_size, constraints, s) or libre.not_unicode(texts, "sentence")
               or libre.not_unicode(phrases, "constraint"))
    if problem:
        raise HTTPException(422, problem)
    try:
        service.target_language(request.tgt_lang)
    except LanguageError as e:
        raise HTTPException(422, str(e)) from None
    try:
        service.check(beam_size, request.nbest, request.return_attention, alignments=request.alignments,
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


def _constraints_per_text(request: TranslateRequest) -> list[list[str]] | None:
    """The request's constraints as one list of phrases per text: a single text's list of
    phrases wrapped in a list, a list of texts' lists as they are; None where the request has
    none, or where their shape does not fit its text (a list of lists for a single text, a
    non-empty flat list for a list of texts)."""
    constraints = request.constraints
    if constraints is None:
        return None
    flat = all(isinstance(c, str) for c in constraints)
    if isinstance(request.text, str):
        return [constraints] if flat else None
    if flat and constraints:
        return None
    return constraints


def _over_a_limit(request: TranslateRequest, texts: list[str], beam_size: int, constraints: list[list[str]] | None,
                  s: ServeSettings) -> str | None:
    """What is wrong with the request's sizes (the first of: sentences, beam size, n-best, the
    constraints' shape, characters of a sentence), or None."""
    if len(texts) > s.max_sentences:
        return f"{len(texts)} sentences; at most {s.max_sentences}"
    if beam_size > s.max_beam_size:
        return f"beam_size {beam_size} is over the limit {s.max_beam_size}"
    if request.nbest > beam_size:
        return f"nbest {request.nbest} is larger than beam_size {beam_size}"
    if request.constraints is not None and (constraints is None or len(constraints) != len(texts)):
        return "constraints: a list of phrases for a single text, one list of phrases per text for a list of texts"
    return next((f"sentence {i} has {len(t)} characters; at most {s.max_chars}"
                 for i, t in enumerate(texts) if len(t) > s.max_chars), None)


async def _stream_events(state: AppState, service: TranslationService, request: TranslateStreamRequest,
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
