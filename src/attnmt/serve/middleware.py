"""An ASGI middleware in front of every route of ``attnmt serve``: the body size limit and the
request metrics.

A body over ``max_body_bytes`` is a 413 before the app reads it: the Content-Length header is
checked first, and a body sent without one (chunked) is read up to the limit. The status and
latency of each translation request are recorded (``attnmt.serve.metrics``).

Library: Starlette's ASGI interface (the ``scope``, ``receive``, ``send`` of the ASGI spec).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from attnmt.serve.metrics import ServeMetrics
from attnmt.serve.settings import ServeSettings


class RequestGuard:
    """ASGI middleware: refuses bodies over ``max_body_bytes`` (413) and records the status and
    latency of each request to one of the ``measured`` paths in the metrics.

    Checks the Content-Length header first; a body sent without one (chunked) is read up to the
    limit before the app sees it.

    Args:
        app: the ASGI app behind it.
        settings: the server's limits (``max_body_bytes``).
        metrics: where requests are recorded.
        measured: the paths whose requests are recorded (the translation routes).
    """

    def __init__(self, app, settings: ServeSettings, metrics: ServeMetrics, measured: Collection[str]):
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.measured = measured

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        limit = self.settings.max_body_bytes
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
            if scope["path"] in self.measured:
                self.metrics.observe_request(status["code"], started)


async def _read_body(scope, receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is over ``limit`` bytes."""
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and int(length) > limit:
        return None
    chunks = []
    size = 0
    more = True
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
