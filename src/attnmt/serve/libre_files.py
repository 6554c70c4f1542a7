"""LibreTranslate's file translation on ``attnmt serve``: a file in, a link to its translation out,
in LibreTranslate's request, answer and error shapes, so that its clients (its web page among
them) translate files here too.

Routes:
    ``POST /translate_file``: a multipart form with ``file`` (the document), ``source`` (a
    language code or ``auto``, as ``/translate``), ``target``, ``api_key`` (ignored). The file's
    format comes from its extension: ``.txt`` (free text, cut into sentences), ``.html``/``.htm``,
    ``.md``, ``.srt``, ``.vtt``, ``.docx`` (``attnmt.documents.format_from_filename``); text files
    are UTF-8. Answers ``{"translatedFileUrl": URL}``, an absolute URL of the route below.
    ``GET /download_file/{name}``: the translated file, as an attachment named as the file sent
    (``name`` is a random id, a period, and that name, as LibreTranslate writes it).

Errors are ``{"error": message}`` with 400: no file, an extension of no
supported format, a file that is not of its format or not UTF-8 text (naming the file and the
place), a language the model does not serve, a file over the server's limits (``max_queue``
sentences, each of at most ``max_chars`` characters; a body over ``max_body_bytes`` is a 413 as
for every request); 404 for a download that is not (or no longer) here; 503 and 504 as
``/translate``.

The translations are kept in memory, the latest :data:`KEEP_FILES` and none older than
:data:`KEEP_SECONDS`: a link is for fetching the file soon after, as LibreTranslate's clients do
(LibreTranslate keeps its files on disk for a while too).

Library: FastAPI / Starlette (python-multipart reads the form; ``Request.url_for`` writes the link).
"""

from __future__ import annotations

import mimetypes
import re
import threading
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from attnmt.documents import format_from_filename
from attnmt.serve.libre import error, language_pair, refusal, translate_documents

if TYPE_CHECKING:
    from attnmt.serve.app import AppState

# The file extensions translated (LibreTranslate's frontend settings list them the same way).
FILE_FORMATS = (".txt", ".html", ".htm", ".md", ".srt", ".vtt", ".docx")
KEEP_FILES = 64
KEEP_SECONDS = 3600.0
_MEDIA_TYPES = {".md": "text/markdown", ".srt": "application/x-subrip", ".vtt": "text/vtt",
                ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}


def safe_filename(name: str) -> str:
    """``name`` without its folders, its characters other than letters, digits, ``.``, ``-`` and
    ``_`` made ``_``, no leading dots (a name for a download link and a Content-Disposition)."""
    base = re.split(r"[\\/]", name)[-1]
    return re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "file"


class TranslatedFiles:
    """Translated files by download name, the latest ``keep`` of them, none older than
    ``seconds`` (thread-safe)."""

    def __init__(self, keep: int = KEEP_FILES, seconds: float = KEEP_SECONDS):
        self.keep, self.seconds = keep, seconds
        self._files: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._files and (len(self._files) > self.keep or next(iter(self._files.values()))[0] < now - self.seconds):
            self._files.popitem(last=False)

    def add(self, filename: str, data: bytes) -> str:
        """Keep ``data``; its download name: a random id, ``.``, the safe ``filename``."""
        name = f"{uuid.uuid4()}.{safe_filename(filename)}"
        with self._lock:
            self._files[name] = (time.monotonic(), data)
            self._expire(time.monotonic())
        return name

    def get(self, name: str) -> bytes | None:
        """The file kept under ``name``, or None."""
        with self._lock:
            self._expire(time.monotonic())
            kept = self._files.get(name)
        return None if kept is None else kept[1]


def add_file_routes(app: FastAPI, state: AppState) -> None:
    """Add ``POST /translate_file`` and ``GET /download_file/{name}`` (module docstring)."""
    files = TranslatedFiles()

    @app.post("/translate_file", tags=["LibreTranslate"])
    async def translate_file(request: Request) -> Response:
        """Translate the uploaded ``file`` from ``source`` to ``target``; a link to the translation."""
        try:
            service = state.ready()
        except HTTPException as e:
            return refusal(e)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            return error(400, "Invalid request: send the file as multipart/form-data")
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or not upload.filename:
            return error(400, "Invalid request: missing file parameter")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        pair = language_pair(service, fields)
        if isinstance(pair, JSONResponse):
            return pair
        source, target, _ = pair
        extension = "." + upload.filename.rsplit(".", 1)[-1].lower() if "." in upload.filename else ""
        if extension not in FILE_FORMATS:
            return error(400, f"Invalid request: file format not supported ({upload.filename}; supported: "
                              f"{', '.join(FILE_FORMATS)})")
        data = await upload.read()  # an empty text file gives an empty translation
        out = await translate_documents(state, service, [data], format_from_filename(upload.filename), source,
                                        target, service.settings.max_queue, what=upload.filename)
        if isinstance(out, JSONResponse):
            return out
        translated = out[0]
        name = files.add(upload.filename, translated.encode("utf-8") if isinstance(translated, str) else translated)
        return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})

    @app.get("/download_file/{name}", tags=["LibreTranslate"])
    async def download_file(name: str) -> Response:
        """A translated file of ``/translate_file``, as an attachment."""
        data = files.get(name)
        if data is None:
            return error(404, f"Invalid filename: {name} is not here (translated files are kept a while)")
        download = name.split(".", 1)[1]
        extension = "." + download.rsplit(".", 1)[-1].lower()
        media = _MEDIA_TYPES.get(extension) or mimetypes.guess_type(download)[0] or "application/octet-stream"
        if media.startswith("text/"):
            media += "; charset=utf-8"
        return Response(data, media_type=media, headers={"Content-Disposition": f'attachment; filename="{download}"'})
