"""An answer the server writes as it streams. A turn of the page is an OpenAI chat request sent
through the server's own app in-process (ASGI, with the caller's key and address, so keys, limits,
the allowlist, the access log and /metrics count it as any request), its streamed chunks read here
and written into the conversation: text, reasoning, tool calls, and the figures the API reports
(`timings`, `usage`). The page follows a turn over its own event stream and may leave and come
back; the turn goes on without it. Stop cancels the request on the server (its slot is freed).

"compare" runs the same turn a second time with speculation off and keeps that run's figures
beside the first's (`stats.compare`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.ui.store import Store

log = logging.getLogger("specdeck.ui")

SAVE_EVERY = 0.5  # seconds between writes of an answer being streamed
ROUTE = "/v1/chat/completions"


@dataclass
class Run:
    """One streamed request's answer as read so far."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict] = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)
    progress: dict | None = None
    finish: str | None = None
    error: str | None = None
    status: int = 0
    model: str | None = None  # the model that answered, as the route names it

    def read(self, chunk: dict) -> None:
        if "error" in chunk and "choices" not in chunk:
            err = chunk["error"]
            self.error = err.get("message") if isinstance(err, dict) else str(err)
            return
        self.model = chunk.get("model") or self.model
        self.timings = chunk.get("timings") or self.timings
        self.usage = chunk.get("usage") or self.usage
        self.progress = chunk.get("prompt_progress") or self.progress
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self.content += delta.get("content") or ""
            self.reasoning += delta.get("reasoning_content") or ""
            for c in delta.get("tool_calls") or []:
                one = self.calls.setdefault(c.get("index", len(self.calls)), {"id": c.get("id"), "name": "", "arguments": ""})
                fn = c.get("function") or {}
                one["name"] += fn.get("name") or ""
                one["arguments"] += fn.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish

    def stats(self) -> dict:
        return {**self.timings, **({"usage": self.usage} if self.usage else {}), **({"model": self.model} if self.model else {}),
                **({"finish_reason": self.finish} if self.finish else {}),
                **({"prompt_progress": self.progress} if self.progress and not self.timings.get("predicted_n") else {}),
                **({"error": self.error} if self.error else {})}


class Turn:
    """A turn being written: its snapshot for followers, and its stop."""

    def __init__(self, mid: str, owner: str, meta: dict) -> None:
        self.mid, self.owner = mid, owner
        self.meta = meta  # what the figures are of (the model asked for, speculation on or off)
        self.stop = asyncio.Event()
        self.changed = asyncio.Event()
        self.snapshot: dict = {"id": mid, "content": "", "reasoning": "", "tool_calls": [], "stats": {}, "state": "streaming"}
        self.done = False
        self.task: asyncio.Task | None = None

    def publish(self, **fields) -> None:
        self.snapshot = {**self.snapshot, **fields}
        self.changed.set()


class Turns:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.live: dict[str, Turn] = {}

    def start(self, app, scope: dict, owner: str, mid: str, body: dict, compare: bool, meta: dict) -> Turn:
        turn = Turn(mid, owner, meta)
        self.live[mid] = turn
        turn.task = asyncio.get_running_loop().create_task(self._write(app, scope, turn, body, compare))
        return turn

    def stop(self, mid: str) -> bool:
        turn = self.live.get(mid)
        if turn is None:
            return False
        turn.stop.set()
        return True

    async def follow(self, owner: str, mid: str) -> AsyncIterator[dict]:
        """The message as it grows (a snapshot at each change), ending with its last state; a message
        no longer being written: its stored state once."""
        turn = self.live.get(mid)
        if turn is None or turn.owner != owner:
            yield self.store.message(owner, mid)
            return
        while True:
            turn.changed.clear()
            done = turn.done  # read before the snapshot: the last one yielded is then the final one
            yield turn.snapshot
            if done:
                return
            await turn.changed.wait()

    # -- inside ------------------------------------------------------------------------------

    async def _write(self, app, scope: dict, turn: Turn, body: dict, compare: bool) -> None:
        try:
            run = await self._run(app, scope, turn, body, save=True)
            stats = {**turn.meta, **run.stats()}
            if compare and run.error is None and not turn.stop.is_set():
                turn.publish(stats={**stats, "compare": {"running": True}})
                off = await self._run(app, scope, turn, {**body, "speculative": {"enabled": False}}, save=False)
                stats["compare"] = {**off.stats(), "same_text": off.content == run.content}
            # a stop asked for on the page: "stopped"; the server stopping under it (its route's
            # "abort", or no end at all): "interrupted"; both kept as far as they came
            state = ("error" if run.error else "stopped" if turn.stop.is_set() else
                     "interrupted" if run.finish in ("abort", None) else "done")
            self._save(turn, run, state, stats)
        except Exception as e:  # noqa: BLE001 - the turn's failure is written into its message, not lost
            log.exception("specdeck: the page's turn %s failed", turn.mid)
            self._save(turn, Run(error=str(e)), "error", {**turn.meta, "error": f"the server could not answer: {e}"})
        finally:
            turn.done = True
            turn.changed.set()
            self.live.pop(turn.mid, None)

    def _save(self, turn: Turn, run: Run, state: str, stats: dict) -> None:
        calls = [run.calls[i] for i in sorted(run.calls)]
        fields = {"content": run.content, "reasoning": run.reasoning, "tool_calls": calls, "stats": stats, "state": state}
        self.store.write(turn.mid, **fields)
        turn.publish(**fields)

    async def _run(self, app, scope: dict, turn: Turn, body: dict, save: bool) -> Run:
        run, buf = Run(), b""
        last = [time.monotonic()]
        data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}, "return_progress": True,
                           "timings_per_token": True}).encode()
        sent = [False]

        async def receive() -> dict:
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": data, "more_body": False}
            await turn.stop.wait()  # the route reads a disconnect as the client gone: it cancels the request
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal buf
            if message["type"] == "http.response.start":
                run.status = message["status"]
                return
            if message["type"] != "http.response.body":
                return
            buf += message.get("body", b"")
            if run.status != 200:
                return
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                    try:
                        run.read(json.loads(line[6:]))
                    except ValueError:
                        continue
            if save:
                stats = {**turn.meta, **run.stats()}
                turn.publish(content=run.content, reasoning=run.reasoning, tool_calls=[run.calls[i] for i in sorted(run.calls)],
                             stats=stats)
                if time.monotonic() - last[0] >= SAVE_EVERY:
                    last[0] = time.monotonic()
                    self.store.write(turn.mid, content=run.content, reasoning=run.reasoning, stats=stats)

        await app(inner_scope(scope, data), receive, send)
        if run.status != 200 and run.error is None:
            run.error = error_text(buf, run.status)
        return run


def inner_scope(scope: dict, data: bytes) -> dict:
    """The page's request as a chat request of its own: the caller's address and key, a JSON body."""
    keep = {b"authorization", b"x-api-key", b"x-forwarded-for", b"x-real-ip", b"user-agent"}
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() in keep]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    return {"type": "http", "asgi": scope.get("asgi", {"version": "3.0"}), "http_version": "1.1", "method": "POST",
            "scheme": scope.get("scheme", "http"), "path": ROUTE, "raw_path": ROUTE.encode(), "root_path": "",
            "query_string": b"", "headers": headers, "client": scope.get("client"), "server": scope.get("server"),
            "state": {}}


def error_text(body: bytes, status: int) -> str:
    """The message of an error answer (OpenAI's envelope), else its status."""
    try:
        err = json.loads(body).get("error")
        return err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return f"the server answered {status}"
