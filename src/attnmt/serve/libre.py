"""A LibreTranslate-compatible face of ``attnmt serve``, so that existing LibreTranslate
clients work unchanged (``libretranslatepy``, ``deep-translator``'s ``LibreTranslator``).

Routes (the request and error shapes of LibreTranslate's API):
    ``POST /translate``: ``q`` (a string, or with a JSON body a list of strings), ``source``
    (a language code, or ``auto``: the model's source language; a multilingual model reading
    several languages refuses it, detecting none), ``target`` (a multilingual model's
    ``tgt_lang``), ``format`` (``text``; default text), ``api_key`` (ignored). The fields come
    from a JSON body, or from the query string and a form body (urlencoded or multipart).
    Answers ``{"translatedText": str | [str]}`` (with ``"detectedLanguage"`` for ``auto``). Each
    line of a text is translated as a sentence of its own; empty lines stay empty.
    ``GET /languages``: ``[{"code", "name", "targets"}]``: each source language with the
    languages it translates into, then the target languages that are not sources (no
    targets). A bilingual model lists its source with its target; a multilingual model every
    source with every target but itself (``attnmt.languages.served_languages``; directions it
    was not trained on are zero-shot).

Errors are ``{"error": message}``: 400 for a body that is not JSON or not an object, a missing
field, a field that is not a string (a number or boolean in q, source, target or format), text that is not Unicode (a lone surrogate), a language
the model does not serve (``"fr is not supported"``), a pair it does not translate, ``auto``
where the source cannot be told, a format other than text, or a request over the server's
limits; 503 while loading or when the queue is full; 504 on time out.

Library: FastAPI / Starlette (python-multipart reads form bodies), Babel (language names).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from babel import Locale
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from attnmt.config import canonical_language, canonical_name
from attnmt.languages import spelling
from attnmt.serve.batcher import Busy

if TYPE_CHECKING:
    from attnmt.serve.app import AppState


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


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers=headers)


def _refusal(error: HTTPException, message: str | None = None) -> JSONResponse:
    """The server's refusal (``AppState.ready``, ``AppState.busy``) in LibreTranslate's shape:
    its status and headers, its detail or ``message``."""
    return _error(error.status_code, str(error.detail) if message is None else message, error.headers)


async def _fields(request: Request) -> dict | str:
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
            return _refusal(e)
        out = [{"code": code, "name": language_name(code), "targets": service.targets_of(code)}
               for code in dict.fromkeys(service.sources + service.targets)]
        return JSONResponse(out)

    @app.post("/translate", tags=["LibreTranslate"])
    async def translate(request: Request) -> Response:
        """Translate ``q`` from ``source`` to ``target`` (module docstring)."""
        try:
            service = state.ready()
        except HTTPException as e:
            return _refusal(e)
        fields = await _fields(request)
        if isinstance(fields, str):
            return _error(400, fields)
        for name in ("q", "source", "target"):
            if fields.get(name) in (None, "", []):  # a 0 or false is there, but not a string (below)
                return _error(400, f"Invalid request: missing {name} parameter")
        q = fields["q"]
        source = fields["source"]
        target = fields["target"]
        texts = q if isinstance(q, list) else [q]
        strings = (source, target, fields.get("format", "text"))  # a number or boolean is no language or format
        if not all(isinstance(t, str) for t in texts) or not all(isinstance(v, str) for v in strings):
            return _error(400, "Invalid request: q, source, target and format must be strings (q may be a list of "
                          "strings)")
        problem = not_unicode(texts, "q")
        if problem:
            return _error(400, f"Invalid request: {problem}")
        detected = canonical_name(source) == "auto"
        if detected and len(service.sources) == 1:
            source = service.sources[0]
        elif detected and service.multilingual:
            return _error(400, f"auto detection is not supported by a multilingual model; give source (one of "
                               f"{', '.join(service.sources)})")
        source, target = service.spelled(source), service.spelled(target)  # 'EN' is the model's 'en'
        for code in (source, target):
            if spelling(code, service.sources + service.targets) is None:
                return _error(400, f"{code} is not supported")
        if target not in service.targets_of(source):
            return _error(400, f"{language_name(target)} ({target}) is not available as a target language from "
                               f"{language_name(source)} ({source})")
        text_format = fields.get("format") or "text"
        if canonical_name(text_format) != "text":
            return _error(400, f"{text_format} format is not supported")
        lines = [line for text in texts for line in text.splitlines() or [""]]
        s = service.settings
        if len(lines) > s.max_sentences:
            return _error(400, f"Invalid request: request ({len(lines)}) exceeds text limit ({s.max_sentences})")
        longest = max(map(len, lines))
        if longest > s.max_chars:
            return _error(400, f"Invalid request: request ({longest}) exceeds text limit ({s.max_chars})")
        try:
            results = await service.translate(lines, service.translator.config.decode.beam_size, 1, False,
                                              tgt_lang=target if service.multilingual else None)
        except Busy as e:
            return _refusal(state.busy(e), f"Slowdown: {e}")
        except TimeoutError:
            return _error(504, f"not translated within {s.request_timeout_s} s")
        out = []
        at = 0  # the first line of this text in results
        for text in texts:
            n = len(text.splitlines() or [""])
            out.append("\n".join(r.text for r, _ in results[at: at + n]))
            at += n
        body: dict = {"translatedText": out if isinstance(q, list) else out[0]}
        if detected:
            body["detectedLanguage"] = ([{"confidence": 100.0, "language": source}] * len(texts)
                                        if isinstance(q, list) else {"confidence": 100.0, "language": source})
        return JSONResponse(body)
