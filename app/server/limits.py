"""A cap on request body size, checked before anything parses the body.

Without it a 10 MB prompt is read, parsed and tokenized on the event loop (seconds, during which
no other request is answered) only to be refused for its length. Bodies over the cap get a 413 in
the envelope of the API the path belongs to; a body without Content-Length is counted as it
arrives. The rest of a refused body is read and thrown away (up to `DRAIN_FACTOR` times the cap)
before the 413 goes out: a client still writing its body would otherwise meet a closed socket (a
broken pipe) and never see the status.
"""

from __future__ import annotations

from app.server.errors import ApiError, send_error

DRAIN_FACTOR = 8  # past this many times the cap, the connection is closed without reading further


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
                return await self._refuse(scope, receive, send, 0)
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
                return await self._refuse(scope, receive, send, total, message.get("more_body", False))
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, read: int, more: bool = True) -> None:
        while more and read <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            read += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send_error(send, scope.get("path", ""), ApiError(
            413, f"request body is larger than this server's limit of {self.max_bytes:,} bytes",
            code="request_too_large", headers={"Connection": "close"}))
