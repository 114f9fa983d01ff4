"""A cap on request body size, checked before anything parses the body.

Without it a 10 MB prompt is read, parsed and tokenized on the event loop (seconds, during which
no other request is answered) only to be refused for its length. Bodies over the cap get a 413 in
OpenAI's error shape; a body without Content-Length is counted as it arrives.
"""

from __future__ import annotations

import json


def _too_large(limit: int) -> tuple[dict, bytes]:
    body = json.dumps({"error": {"message": f"request body is larger than this server's limit of {limit:,} bytes",
                                 "type": "invalid_request_error", "param": None, "code": "request_too_large"}}).encode()
    start = {"type": "http.response.start", "status": 413,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]}
    return start, body


class BodyLimit:
    """Pure ASGI middleware: refuse bodies over `max_bytes` with 413, buffering at most that much."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = self.max_bytes + 1
            if declared > self.max_bytes:
                return await self._refuse(send)
            return await self.app(scope, receive, send)
        # no Content-Length (chunked): read up to the cap, then replay what was read
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        start, body = _too_large(self.max_bytes)
        await send(start)
        await send({"type": "http.response.body", "body": body})
