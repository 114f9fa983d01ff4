"""The monitor's routes: `GET /ui/api/series` (the history as JSON columns) and `GET /ui/api/live`
(each new row as a server-sent event, `id` its time). A page that reconnects asks `live` with
`since=` its last time and gets the rows it missed first, each once."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from app.monitor.history import History, unit_of

POLL = 0.25  # seconds between looks at the ring for a new row (a row comes once a second)


def wanted_fields(fields: str | None, known: list[str]) -> list[str] | None:
    """`?fields=a,b` as a list (None: all); an unknown name is a 400 naming the known ones."""
    if fields is None:
        return None
    names = [f.strip() for f in fields.split(",") if f.strip() and f.strip() != "t"]
    unknown = [f for f in names if f not in known]
    if unknown:
        raise HTTPException(400, f"unknown field(s) {', '.join(unknown)}; this model's are: {', '.join(known)}")
    return names


def rows(cols: dict[str, list]) -> list[dict]:
    """Columns as one dict a row."""
    return [{k: v[i] for k, v in cols.items()} for i in range(len(cols["t"]))]


def build_monitor_router(history: History, resolve: Callable[[str | None], str],
                         stopping: Callable[[], bool]) -> APIRouter:
    """`resolve`: a model name as a request gives it (None: the default) to the served model's
    name, or an HTTPException (the server's one name rule). `stopping`: the server is stopping, and
    live streams end (a watcher's stream has no end of its own: a stop would wait out its grace)."""
    r = APIRouter(prefix="/ui/api", include_in_schema=False)

    @r.get("/series")
    async def series(model: str | None = None, since: float | None = Query(None, description="unix seconds: rows after it"),
                     fields: str | None = None):
        name = resolve(model)
        wanted = wanted_fields(fields, history.fields(name))
        cols = history.columns(name, -math.inf if since is None else since, wanted)
        return {"model": name, "period_s": 1.0, "keep_s": history.rows, "gpus": history.gpus,
                "units": {f: unit_of(f) for f in cols if f != "t"}, "columns": cols}

    @r.get("/live")
    async def live(request: Request, model: str | None = None, since: float | None = None):
        name = resolve(model)
        start = history.last_t() if since is None else since

        async def events():
            last = -math.inf if start is None else start
            while not stopping() and not await request.is_disconnected():
                newest = history.last_t()
                if newest is not None and newest > last:
                    for row in rows(history.columns(name, last)):
                        last = row["t"]
                        yield f"id: {last}\ndata: {json.dumps(row)}\n\n".encode()
                await asyncio.sleep(POLL)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return r
