"""The page's routes: the page itself (GET / for a browser, /ui), its files (/ui/static/), and its
JSON API under /ui/api/ (conversations, export, import, turns and their live events). Errors are
FastAPI's HTTPException and validation errors, which the server answers in OpenAI's envelope."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from app.monitor.history import History
from app.settings import Paths
from app.ui.monitor import build_monitor_router
from app.ui.store import Invalid, Message, NotFound, Store, conversation_of, message_of
from app.ui.turns import Turns

STATIC = Path(__file__).parent / "static"
PAGE = STATIC / "index.html"
KEEP_ALIVE = 10.0  # seconds between comments on a quiet event stream
ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "repeat_penalty", "presence_penalty",
            "frequency_penalty"}
# no inline script or style, nothing from elsewhere: the model's text and imported conversations are untrusted
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache"}


def wants_page(request: Request) -> bool:
    """A browser's GET (it asks for HTML); programs (curl, probes, Claude Code's HEAD) do not."""
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def page() -> Response:
    return FileResponse(PAGE, media_type="text/html", headers=PAGE_HEADERS)


def owner_of(request: Request) -> str:
    """Whose conversations: the API key's name (set by the key gate), "" without keys."""
    return (request.scope.get("state") or {}).get("key_name") or ""


class ConversationBody(BaseModel):
    title: str | None = Field(None, min_length=1, max_length=500)
    model: str | None = Field(None, max_length=200)
    system: str | None = None
    settings: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None


class TurnBody(BaseModel):
    """One turn: a new user message (`content`, `images`), or a regeneration (`content` None). `at`:
    keep the messages before this index first (edit and resend, regenerate)."""

    content: str | None = None
    images: list[str] = Field(default_factory=list, max_length=16)
    at: int | None = Field(None, ge=0)
    model: str | None = Field(None, max_length=200)
    system: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    speculative: bool = True
    compare: bool = False


def chat_messages(conv: dict) -> list[dict]:
    """The conversation as an OpenAI chat request's messages (images as image_url parts)."""
    out = [{"role": "system", "content": conv["system"]}] if conv["system"].strip() else []
    for m in conv["messages"]:
        if m["role"] == "assistant" and m["state"] == "error":
            continue
        if m["role"] == "user" and m["images"]:
            parts = [{"type": "image_url", "image_url": {"url": u}} for u in m["images"]]
            out.append({"role": "user", "content": [*parts, {"type": "text", "text": m["content"]}]})
        elif m["role"] in ("user", "assistant", "system"):
            out.append({"role": m["role"], "content": m["content"]})
    return out


def request_body(conv: dict, model: str, settings: dict, speculative: bool) -> dict:
    sampling = {k: v for k, v in settings.items() if k in SAMPLING and v is not None and v != ""}
    return {"model": model, "messages": chat_messages(conv), **sampling, "speculative": {"enabled": speculative}}


def found(call, *args):
    """The store's answer; a conversation or message the caller does not own is 404 (not 403: it
    does not say that it exists)."""
    try:
        return call(*args)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


def build_router(store: Store, turns: Turns) -> APIRouter:
    r = APIRouter(prefix="/ui/api", include_in_schema=False)

    @r.get("/conversations")
    async def conversations(request: Request, q: str | None = None):
        return {"conversations": store.list(owner_of(request), q)}

    @r.post("/conversations")
    async def create(request: Request, body: ConversationBody):
        owner = owner_of(request)
        cid = store.create(owner, body.title or "New chat", body.model or "", body.system or "", body.settings or {},
                           messages_of(body.messages))
        return store.get(owner, cid)

    @r.get("/conversations/{cid}")
    async def one(request: Request, cid: str):
        return found(store.get, owner_of(request), cid)

    @r.put("/conversations/{cid}")
    async def put(request: Request, cid: str, body: ConversationBody):
        owner = owner_of(request)
        if not ID.match(cid):
            raise HTTPException(400, "a conversation id is 1-64 letters, digits, - or _")
        msgs = messages_of(body.messages) if body.messages is not None else None
        try:
            store.update(owner, cid, body.title, body.model, body.system, body.settings, msgs)
        except NotFound:
            try:
                store.create(owner, body.title or "New chat", body.model or "", body.system or "", body.settings or {},
                             msgs or [], cid=cid)
            except Invalid:  # another owner's id
                raise HTTPException(404, f"no conversation {cid}") from None
        return store.get(owner, cid)

    @r.delete("/conversations/{cid}")
    async def delete(request: Request, cid: str):
        found(store.delete, owner_of(request), cid)
        return {"deleted": cid}

    @r.get("/export")
    async def export(request: Request):
        lines = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in store.export(owner_of(request)))
        return Response(lines, media_type="application/x-ndjson",
                        headers={"Content-Disposition": 'attachment; filename="specdeck-conversations.jsonl"'})

    @r.post("/import")
    async def import_(request: Request):
        raw = await request.body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HTTPException(400, "the import is not UTF-8 text (JSON Lines: one conversation a line)") from None
        found = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(conversation_of(json.loads(line), f"line {n}"))
            except ValueError as e:
                if isinstance(e, json.JSONDecodeError):
                    raise HTTPException(400, f"line {n}: not JSON ({e.msg} at column {e.colno})") from None
                raise
            except Invalid as e:
                raise HTTPException(400, str(e)) from None
        if not found:
            raise HTTPException(400, "nothing to import: send JSON Lines, one conversation a line "
                                     '({"title": ..., "messages": [{"role": ..., "content": ...}]})')
        ids = store.import_many(owner_of(request), found)
        return {"imported": len(ids), "ids": ids}

    @r.post("/conversations/{cid}/turns")
    async def turn(request: Request, cid: str, body: TurnBody):
        owner = owner_of(request)
        conv = found(store.get, owner, cid)
        if any(m["state"] == "streaming" for m in conv["messages"]):
            raise HTTPException(409, "an answer is still being written in this conversation: stop it first")
        if body.at is not None:
            if body.at > len(conv["messages"]):
                raise HTTPException(400, f"at: the conversation has {len(conv['messages'])} messages")
            store.truncate(owner, cid, body.at)
        if body.content is not None:
            try:
                store.append(owner, cid, message_of({"role": "user", "content": body.content, "images": body.images}, "message"))
            except Invalid as e:
                raise HTTPException(400, str(e)) from None
        model = body.model if body.model is not None else conv["model"]
        settings = {**conv["settings"], **body.settings}
        title = conv["title"]
        if title == "New chat" and body.content:
            title = " ".join(body.content.split())[:60] or title
        store.update(owner, cid, title=title, model=model, settings=settings,
                     system=body.system if body.system is not None else None)
        conv = store.get(owner, cid)
        if not conv["messages"] or conv["messages"][-1]["role"] != "user":
            raise HTTPException(400, "nothing to answer: the conversation does not end with a user message")
        meta = {"speculative": body.speculative, "model": model}
        mid = store.append(owner, cid, Message("assistant", state="streaming", stats=meta))
        turns.start(request.app, request.scope, owner, mid, request_body(conv, model or "", settings, body.speculative),
                    body.compare, meta)
        return {"conversation": cid, "message": mid}

    @r.get("/messages/{mid}/events")
    async def events(request: Request, mid: str):
        owner = owner_of(request)
        found(store.message, owner, mid)
        return StreamingResponse(sse(turns.follow(owner, mid)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @r.post("/messages/{mid}/stop")
    async def stop(request: Request, mid: str):
        found(store.message, owner_of(request), mid)
        return {"stopped": turns.stop(mid)}

    return r


def messages_of(raw: list[dict] | None) -> list[Message]:
    try:
        return [message_of(m, f"messages[{i}]") for i, m in enumerate(raw or [])]
    except Invalid as e:
        raise HTTPException(400, str(e)) from None


async def sse(snapshots) -> Any:
    """Each snapshot as a server-sent event; a comment after KEEP_ALIVE quiet seconds."""
    it = snapshots.__aiter__()
    nxt = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=KEEP_ALIVE)
            if not done:
                yield b": keep-alive\n\n"
                continue
            try:
                snap = nxt.result()
            except StopAsyncIteration:
                return
            yield f"data: {json.dumps(snap, ensure_ascii=False)}\n\n".encode()
            nxt = asyncio.ensure_future(it.__anext__())
    finally:
        nxt.cancel()


def mount(app: FastAPI, history: History, resolve, stopping: Callable[[], bool], db: Path | None = None) -> None:
    """The page (chat and monitor), its files and its API on the server's app; the conversations in
    `db` (default: specdeck's state folder), the monitor's figures in `history` (`resolve`: a
    model name to the served model's, `stopping`: the server is stopping; see build_monitor_router)."""
    store = Store(db or Paths().state / "conversations.sqlite3")
    app.state.ui = Ui(store, Turns(store))
    app.include_router(build_router(store, app.state.ui.turns))
    app.include_router(build_monitor_router(history, resolve, stopping))
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/monitor", include_in_schema=False)
    async def ui_page():
        return page()


@dataclass(frozen=True)
class Ui:
    """The page's state on the server's app: its conversations and the turns being written."""

    store: Store
    turns: Turns
