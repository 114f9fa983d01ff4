"""The access log, for audit: one JSON line per request, written when its response has ended.

    {"time": "2026-12-01T18:40:02.118Z", "key": "alice", "client": "10.0.0.7", "method": "POST",
     "route": "/v1/chat/completions", "status": 200, "prompt_tokens": 812, "cached_tokens": 768,
     "completion_tokens": 96, "ms": 2210.4, "agent": "OpenAI/Python 1.54.0"}

`key` is the key's name from the key file (null when the request had none or a wrong one); the key
itself never appears. Request and answer text appear only with `--log-prompts`. Lines go to the
service log (stderr: the journal under systemd), or with `--access-log FILE` to that file, rotated
by size (`--access-log-max-mb`, keeping `--access-log-files` old files).

The token counts come from the scheduler: each job a request submits carries the request's
`Usage` (a context variable set here, read by `core.submit`), and adds its record when it ends.
The server's own smoke request and watchdog checks are not client requests and are not logged.
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

SERVICE_LOG = "specdeck.server.access"  # under specdeck.server: `up` quiets both on its live screen
current_usage: contextvars.ContextVar[Usage | None] = contextvars.ContextVar("specdeck_usage", default=None)


@dataclass
class Usage:
    """What one HTTP request used, summed over the jobs it submitted."""
    key: str | None = None  # the API key's name (set by the key gate)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    texts: dict = field(default_factory=dict)  # prompt / completion, only with --log-prompts
    # the client went away before its answer was whole: "queue", "prompt 4,096 of 20,480" (while the
    # prompt was being evaluated), or "answer" (while it streamed)
    gone: str | None = None
    locate: Callable[[], str] | None = None  # where the request's job is now (set when it submits one)
    on_generated: Callable[[int], None] | None = None  # the key's token window
    arrived: float = field(default_factory=time.monotonic)  # its time limit counts from here (a model's load included)

    def add(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, texts: dict | None = None) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.completion_tokens += completion_tokens
        for name, text in (texts or {}).items():
            self.texts[name] = self.texts.get(name, "") + text
        if self.on_generated is not None:
            self.on_generated(completion_tokens)


def open_sink(path, max_mb: float, files: int) -> logging.Logger:
    """The logger access lines go to: the service log, or a size-rotated file of its own."""
    if path is None:
        return logging.getLogger(SERVICE_LOG)
    sink = logging.Logger(f"{SERVICE_LOG}.file", logging.INFO)  # not registered: each app owns its file handler
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=int(max_mb * 2**20), backupCount=files,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    sink.addHandler(handler)
    return sink


def close_sink(sink: logging.Logger) -> None:
    if sink.name != SERVICE_LOG:
        for handler in list(sink.handlers):
            handler.close()
            sink.removeHandler(handler)


def access_line(scope: dict, status: int, usage: Usage, seconds: float) -> dict:
    state = scope.get("state") or {}
    headers = dict(scope.get("headers") or [])
    line = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "key": state.get("key_name"), "client": state.get("client_address"), "method": scope.get("method"),
            "route": scope.get("path"), "status": status, "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens, "completion_tokens": usage.completion_tokens,
            "ms": round(seconds * 1e3, 1)}
    if usage.gone:
        line["client_gone"] = usage.gone
    agent = headers.get(b"user-agent")
    if agent:
        line["agent"] = agent.decode("latin-1")[:200]
    return {**line, **usage.texts}


class AccessLog:
    """Pure ASGI middleware, outermost: times each request, lends it a `Usage`, and writes its
    line (and counts it in `on_request(state, route, status, usage)`) once the response has ended."""

    def __init__(self, app, sink: logging.Logger, on_request: Callable[[dict, str, int, Usage], None] | None = None) -> None:
        self.app, self.sink, self.on_request = app, sink, on_request

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        usage, status, t = Usage(), [500], time.perf_counter()
        token = current_usage.set(usage)
        whole = [False]  # the response's body was sent to its end

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                whole[0] = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            current_usage.reset(token)
            if not whole[0] and status[0] < 400 and usage.locate is not None and not usage.gone:
                usage.gone = usage.locate()  # a stream its client closed: the server cancels the rest
            state = scope.get("state") or {}
            if not state.get("self"):
                self.sink.info(json.dumps(access_line(scope, status[0], usage, time.perf_counter() - t)))
            if self.on_request is not None:
                self.on_request(state, scope.get("path", ""), status[0], usage)
