"""A LibreTranslate-compatible face of ``attnmt serve``, so that existing LibreTranslate
clients work unchanged (``libretranslatepy``, ``deep-translator``'s ``LibreTranslator``).

Routes (the request and error shapes of LibreTranslate's API):
    ``POST /translate``: ``q`` (a string, or with a JSON body a list of strings), ``source``
    (a language code, or ``auto``: the model's source language; a multilingual model reading
    several languages refuses it, detecting none), ``target`` (a multilingual model's
    ``tgt_lang``), ``format`` (``text`` or ``html``; default text), ``api_key`` (ignored). The
    fields come from a JSON body, or from the query string and a form body (urlencoded or
    multipart). Answers ``{"translatedText": str | [str]}`` (with ``"detectedLanguage"`` for
    ``auto``). As LibreTranslate does, each line of a text is cut into sentences (the sentence
    rules of ``source``), each translated on its own, and put back on its line; empty lines stay
    empty. HTML is translated with its markup kept (``attnmt.documents``: block elements are
    segments, inline elements placed around the words they wrapped).
    ``POST /translate_file``, ``GET /download_file/{name}``: files (``attnmt.serve.libre_files``).
    ``GET /languages``: ``[{"code", "name", "targets"}]``: each source language with the
    languages it translates into, then the target languages that are not sources (no
    targets). A bilingual model lists its source with its target; a multilingual model every
    source with every target but itself (``attnmt.languages.served_languages``; directions it
    was not trained on are zero-shot).

Errors are ``{"error": message}``: 400 for a body that is not JSON or not an object, a missing
field, a field that is not a string (a number or boolean in q, source, target or format), text that is not Unicode (a lone surrogate), a language
the model does not serve (``"fr is not supported"``), a pair it does not translate, ``auto``
where the source cannot be told, a format other than text and html, HTML that cannot be read, or
a request over the server's limits (``max_sentences`` sentences in all, each of at most
``max_chars`` characters); 503 while loading or when the queue is full; 504 on time out.

Library: FastAPI / Starlette (python-multipart reads form bodies), Babel (language names).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from babel import Locale
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from attnmt.config import canonical_language, canonical_name
from attnmt.documents import DocumentError
from attnmt.languages import spelling
from attnmt.serve.batcher import Busy
from attnmt.serve.documents import DocumentTooLarge

if TYPE_CHECKING:
    from attnmt.serve.app import AppState
    from attnmt.serve.service import TranslationService

# LibreTranslate's formats of /translate, as attnmt.documents' input formats
FORMATS = {"text": "text", "html": "html"}


def language_name(code: str) -> str:
    """The English name of a language code (CLDR data through Babel), else the code itself."""
    return Locale("en").languages.get(canonical_language(code.replace("-", "_")), code)


def not_unicode(texts: list[str], what: str) -> str | None:
    """A message naming the first of ``texts`` that is not Unicode text, else None: JSON's
    ``\\ud800`` escapes can carry a lone surrogate, which UTF-8 and so no tokenizer encodes (used
    by this module and by ``/v1/translate``)."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"{what} {i}: character {e.start} is a lone surrogate (U+{ord(text[e.start]):04X}), not Unicode "
                    "text")
    return None


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """An answer in LibreTranslate's error shape, ``{"error": message}``."""
    return JSONResponse({"error": message}, status, headers=headers)


def refusal(refused: HTTPException, message: str | None = None) -> JSONResponse:
    """The server's refusal (``AppState.ready``, ``AppState.busy``) in LibreTranslate's shape:
    its status and headers, its detail or ``message``."""
    return error(refused.status_code, str(refused.detail) if message is None else message, refused.headers)


async def fields_of(request: Request) -> dict | str:
    """The request's fields: a JSON object body, else the query string and form fields (a
    string: why a JSON body was refused)."""
    if request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError as e:  # UnicodeDecodeError included
            return f"Invalid request: the body is not JSON ({e})"
        return body if isinstance(body, dict) else "Invalid request: the JSON body must be an object"
    fields = dict(request.query_params)
    if request.headers.get("content-type", "").startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        fields.update({k: v for k, v in form.items() if isinstance(v, str)})
    return fields


def language_pair(service: TranslationService, fields: dict) -> tuple[str, str, bool] | JSONResponse:
    """The request's (source, target, detected) in the model's spelling, ``source`` ``auto``
    resolved (``detected`` true); or the 400 of a missing, unknown or unserved language."""
    for name in ("source", "target"):
        if fields.get(name) in (None, ""):
            return error(400, f"Invalid request: missing {name} parameter")
        if not isinstance(fields[name], str):
            return error(400, "Invalid request: q, source, target and format must be strings (q may be a list of "
                         "strings)")
    source, target = fields["source"], fields["target"]
    detected = canonical_name(source) == "auto"
    if detected and len(service.sources) == 1:
        source = service.sources[0]
    elif detected and service.multilingual:
        return error(400, f"auto detection is not supported by a multilingual model; give source (one of "
                          f"{', '.join(service.sources)})")
    source, target = service.spelled(source), service.spelled(target)  # 'EN' is the model's 'en'
    for code in (source, target):
        if spelling(code, service.sources + service.targets) is None:
            return error(400, f"{code} is not supported")
    if target not in service.targets_of(source):
        return error(400, f"{language_name(target)} ({target}) is not available as a target language from "
                          f"{language_name(source)} ({source})")
    return source, target, detected


async def translate_documents(state: AppState, service: TranslationService, documents: list[str | bytes],
                              input_format: str, source: str, target: str, sentences: int, what: str = "request"
                              ) -> list[str | bytes] | JSONResponse:
    """``documents`` translated from ``source`` into ``target`` (``attnmt.serve.documents``), at
    most ``sentences`` sentences in all; or LibreTranslate's error: 400 over a limit or for a
    document that is not of its format (naming ``what`` and the place), 503 busy, 504 time out."""
    s = service.settings
    try:
        return await state.documents.translate(
            documents, input_format, True, source, service.translator.config.decode.beam_size,
            tgt_lang=target if service.multilingual else None, sentences=sentences, chars=s.max_chars)
    except DocumentTooLarge as e:
        return error(400, f"Invalid request: {what} ({e.count}) exceeds text limit ({e.limit})")
    except DocumentError as e:
        return error(400, f"Invalid request: {what}: {e}")
    except Busy as e:
        return refusal(state.busy(e), f"Slowdown: {e}")
    except TimeoutError:
        return error(504, f"not translated within {s.request_timeout_s} s")


def add_routes(app: FastAPI, state: AppState) -> None:
    """Add ``POST /translate`` and ``GET /languages`` to ``app``; ``state.ready()`` returns the
    ``TranslationService`` or raises the HTTPException of a server still loading, and
    ``state.busy`` is the 503 of a batcher that takes no more sentences."""

    @app.get("/languages", tags=["LibreTranslate"])
    async def languages() -> Response:
        """The model's languages, each with those it translates into, LibreTranslate's shape."""
        try:
            service = state.ready()
        except HTTPException as e:
            return refusal(e)
        out = [{"code": code, "name": language_name(code), "targets": service.targets_of(code)}
               for code in dict.fromkeys(service.sources + service.targets)]
        return JSONResponse(out)

    @app.post("/translate", tags=["LibreTranslate"])
    async def translate(request: Request) -> Response:
        """Translate ``q`` from ``source`` to ``target`` (module docstring)."""
        try:
            service = state.ready()
        except HTTPException as e:
            return refusal(e)
        fields = await fields_of(request)
        if isinstance(fields, str):
            return error(400, fields)
        if fields.get("q") in (None, "", []):  # a 0 or false is there, but not a string (below)
            return error(400, "Invalid request: missing q parameter")
        q = fields["q"]
        texts = q if isinstance(q, list) else [q]
        if not all(isinstance(t, str) for t in texts) or not isinstance(fields.get("format", "text"), str):
            return error(400, "Invalid request: q, source, target and format must be strings (q may be a list of "
                         "strings)")
        pair = language_pair(service, fields)
        if isinstance(pair, JSONResponse):
            return pair
        source, target, detected = pair
        problem = not_unicode(texts, "q")
        if problem:
            return error(400, f"Invalid request: {problem}")
        text_format = fields.get("format") or "text"
        if canonical_name(text_format) not in FORMATS:
            return error(400, f"{text_format} format is not supported")
        out = await translate_documents(state, service, texts, FORMATS[canonical_name(text_format)], source, target,
                                        service.settings.max_sentences)
        if isinstance(out, JSONResponse):
            return out
        body: dict = {"translatedText": out if isinstance(q, list) else out[0]}
        if detected:
            body["detectedLanguage"] = ([{"confidence": 100.0, "language": source}] * len(texts)
                                        if isinstance(q, list) else {"confidence": 100.0, "language": source})
        return JSONResponse(body)
