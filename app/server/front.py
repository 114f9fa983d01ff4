"""The server's front: the one app uvicorn runs. It holds what is the server's, not a model's (the
access log, allowlist, CORS, API keys and body cap; health, the model listings, /metrics), and hands
every other request to the app of the model it names (`model` in the body, or `?model=`), loading
that model first where it is not (see app/server/fleet.py).

A request for a model being loaded waits, within its time limit; a stream that waits longer than
--keep-alive gets its headers and keep-alives meanwhile (an error then comes in the stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app import __version__
from app.chat.fallback import FALLBACK
from app.chat.fallback import NOTE as FALLBACK_NOTE
from app.plan.hardware import read_gpus
from app.server.access import SELF_HEADER, SourceAllowlist
from app.server.answer import SSE_KEEP_ALIVE
from app.server.app import add_error_handlers
from app.server.audit import AccessLog, Usage, current_usage, open_sink
from app.server.core import capacity, refresh_gauges, status_json
from app.server.errors import ApiError, api_of, shaped
from app.server.fleet import Fleet, Load, Member, NeverFits
from app.server.keys import KeyGate, KeyStore, Windows
from app.server.limits import BodyLimit
from app.server.monitor import Sampler, open_history
from app.server.ollama import API_VERSION, model_entry
from app.server.settings import ServeSettings
from app.ui.routes import mount as mount_ui
from app.ui.routes import page, wants_page

log = logging.getLogger("specdeck.server")

LOCAL_ORIGINS = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
POLL = 0.05  # seconds between looks at a model being loaded
ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
STREAMED_BY_DEFAULT = ("/api/chat", "/api/generate")  # Ollama's answers stream unless told not to


def cors_options(origins: list[str]) -> dict:
    """CORS for the origins given; the keyword `localhost` allows any local origin (any port)."""
    exact = [o for o in origins if o != "localhost"]
    return {"allow_origins": exact, "allow_origin_regex": LOCAL_ORIGINS if "localhost" in origins else None,
            "allow_methods": ["GET", "POST", "OPTIONS"],
            "allow_headers": ["*"],  # a preflight gets back the headers it asked for (SDKs send many)
            "max_age": 600}


def metrics_of(fleet: Fleet, state: dict):
    """The metrics a request is counted in: its model's (one that reached none: the default model's)."""
    m = fleet.members.get(state.get("model") or "") or fleet.first
    return m.app.state.metrics


def count_request(fleet: Fleet, state: dict, route: str, status: int, usage: Usage) -> None:
    metrics = metrics_of(fleet, state)
    if state.get("limited"):
        metrics.key_limited.labels(state.get("key_name") or "").inc()
        return
    metrics.requests.labels(route, str(status)).inc()
    if usage.gone and status < 400:  # a stream its client dropped (a 499 is counted where it is raised)
        metrics.client_gone.inc()


class FleetMetrics:
    """A Prometheus collector: every model's own metrics, each sample labelled with its model."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self):
        families: dict[str, Metric] = {}
        for m in self.fleet.members.values():
            for fam in m.app.state.metrics.registry.collect():
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    out.add_sample(s.name, {"model": m.name, **s.labels}, s.value, s.timestamp, s.exemplar)
        yield from families.values()


def create_front(settings: ServeSettings, fleet: Fleet) -> FastAPI:
    history = open_history(fleet, len(read_gpus()))
    sampler = Sampler(fleet, history)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        """The monitor's sampler runs while the server serves (never for an app that is only built,
        nor with the page off: nothing reads its history then)."""
        if settings.ui:
            sampler.start()
        yield
        if settings.ui:
            sampler.stop()

    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over speculative llama.cpp engines",
                  lifespan=lifespan)
    app.state.fleet, app.state.settings, app.state.history = fleet, settings, history
    registry = CollectorRegistry()
    registry.register(FleetMetrics(fleet))
    # pure ASGI middlewares, the last added outermost: access log, allowlist, CORS, key gate, body cap
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.state.keys, app.state.windows = KeyStore(settings.api_key_file, settings.api_key), Windows()
    app.add_middleware(KeyGate, store=app.state.keys, windows=app.state.windows)
    if settings.cors_origins:  # so refusals (401, 413) carry the CORS headers too
        app.add_middleware(CORSMiddleware, **cors_options(settings.cors_origins))
    # a source outside --allow-from gets 403 before anything else reads its request
    token = secrets.token_hex(16)
    app.state.self_headers = {SELF_HEADER: token}  # the server's own smoke request and watchdog check
    app.add_middleware(SourceAllowlist, allow=settings.networks("allow_from"), trusted=settings.networks("trusted_proxies"),
                       self_token=token)
    app.state.access_sink = open_sink(settings.access_log, settings.access_log_max_mb, settings.access_log_files)
    app.add_middleware(AccessLog, sink=app.state.access_sink, on_request=lambda *a: count_request(fleet, *a))

    add_error_handlers(app, lambda request: metrics_of(fleet, request.scope.get("state") or {}))

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def running(request: Request):
        """A reachability probe (Claude Code sends HEAD /): 200, as llama-server and Ollama answer it;
        a browser gets the chat page (unless --no-ui)."""
        if settings.ui and wants_page(request):
            return page()
        return PlainTextResponse("specdeck is running")

    def resolve(name: str | None) -> str:
        """A model name as the monitor's routes take it, by the fleet's one rule."""
        m = fleet.find(name) if name else fleet.shown()
        if m is None:
            raise unknown_model(name, fleet.names())
        return m.name

    if settings.ui:
        mount_ui(app, history, resolve, fleet.draining.is_set)

    @app.get("/health")
    async def health(fail_on_no_slot: bool = False):
        """200 once the start's models are loaded (503 before); with ?fail_on_no_slot=1 (llama-server's),
        503 while every slot of every loaded model is busy, so a balancer can steer away."""
        room = fleet_capacity(fleet)
        if fleet.draining.is_set():
            return JSONResponse({"status": "draining", **room}, 503)
        if not room["ready"]:
            return JSONResponse({"status": "loading", **room}, 503)
        if fail_on_no_slot and room["slots_free"] == 0:
            return JSONResponse({"status": "no slot available", **room}, 503)
        return {"status": "ok", **room}

    @app.get("/health/live")
    async def live():
        """Kubernetes' liveness: the process answers (loading, busy or draining alike)."""
        return {"status": "alive"}

    @app.get("/health/ready")
    async def ready():
        """Kubernetes' readiness: the start's models loaded and the server not stopping. A busy
        replica stays ready (`/health?fail_on_no_slot=1` is the balancer's signal for that); from a
        SIGTERM on, 503 `draining` while the requests in flight finish."""
        if fleet.draining.is_set():
            return JSONResponse({"status": "draining", "in_flight": fleet.in_flight()}, 503)
        if not fleet.ready:
            return JSONResponse({"status": "loading"}, 503)
        return {"status": "ready"}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        """OpenAI's list (each model's state, as llama-server's router lists it), plus the `models`
        catalogue Codex CLI reads from a custom provider."""
        data, catalogue = [], []
        for m, v in zip(fleet.members.values(), fleet.view(), strict=True):
            n_ctx = m.start.plan.ctx
            meta = {"n_ctx": n_ctx, "chat_template": m.start.template_origin, "vision": m.start.mmproj is not None}
            if meta["chat_template"] == FALLBACK:
                meta["note"] = FALLBACK_NOTE
            for n in [m.name, *m.start.aliases]:
                data.append({"id": n, "object": "model", "created": 0, "owned_by": "specdeck",
                             "status": {"value": v["state"]}, "meta": meta})
                catalogue.append({"slug": n, "display_name": n, "context_window": n_ctx})
        return {"object": "list", "data": data, "models": catalogue}

    @app.get("/api/version")
    async def version():
        return {"version": API_VERSION}

    @app.get("/v1/status")
    async def status(model: str | None = None):
        """The named model's live status (default: the default model, else the one used last that is
        loaded), with every model's state; a model not loaded is 503 (this never loads one: the
        dashboard polls it)."""
        m = fleet.find(model) if model else fleet.shown()
        if m is None:
            raise unknown_model(model, fleet.names())
        if not m.service.ready:
            raise ApiError(503, f"model {m.name} is not loaded ({m.label})", "server_error",
                           headers={"Retry-After": "5"}, extra={"fleet": fleet.view()})
        return {**status_json(m.service, m.app.state.metrics), "model": m.name, "fleet": fleet.view(),
                "settings": settings.model_dump(mode="json", exclude={"api_key"})}

    @app.get("/api/tags")
    async def tags():
        return {"models": [model_entry(m.service) for m in fleet.members.values()]}

    @app.get("/api/ps")
    async def ps():
        """What is loaded: each model's whole planned footprint, the part of it in VRAM, and when it
        unloads (a model kept loaded: far in the future, as Ollama says of keep_alive -1)."""
        out = []
        for m, v in zip(fleet.members.values(), fleet.view(), strict=True):
            if v["state"] != "loaded":
                continue
            plan = m.start.plan
            expires = "2318-01-01T00:00:00Z" if v["expires_in"] is None else \
                datetime.fromtimestamp(time.time() + v["expires_in"], timezone.utc).isoformat().replace("+00:00", "Z")
            out.append({**model_entry(m.service), "size": m.bytes + plan.host_used,
                        "size_vram": m.bytes if plan.device != "cpu" else 0, "context_length": m.service.n_ctx,
                        "expires_at": expires})
        return {"models": out}

    @app.get("/metrics")
    async def prometheus():
        for m in fleet.members.values():
            if m.service.ready:
                refresh_gauges(m.service, m.app.state.metrics)
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict:
        """The whole API: the front's routes and a model's (every model's app has the same routes)."""
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                             routes=[*app.routes, *fleet.first.app.routes])
        return app.openapi_schema

    app.openapi = openapi
    app.router.default = Dispatch(settings, fleet)
    return app


def unknown_model(name: str, names: list[str]) -> ApiError:
    """The 404 for a name the fleet's rule (Fleet.find) reaches no model with: OpenAI's code
    `model_not_found` and the served names (each API's envelope is made from it by `shaped`)."""
    return ApiError(404, f"model '{name}' is not served here (served: {', '.join(names)})", "not_found_error", "model",
                    code="model_not_found", extra={"models": names})


def fleet_capacity(fleet: Fleet) -> dict:
    """capacity() of the loaded models, summed; with several models, each one's state too."""
    rooms = [capacity(m.service) for m in fleet.members.values() if m.service.ready]
    room = {"ready": fleet.ready and bool(rooms),
            **{k: sum(r[k] for r in rooms) for k in ("slots_total", "slots_free", "queue", "queue_limit")}}
    if len(fleet.members) > 1:
        room["models"] = {v["name"]: v["state"] for v in fleet.view()}
    return room


class Dispatch:
    """What no route of the front answers: handed to the named model's app, loaded first if need be."""

    def __init__(self, settings: ServeSettings, fleet: Fleet) -> None:
        self.settings, self.fleet = settings, fleet

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        messages = await read_body(receive)
        body = request_json(scope, messages)
        name = requested_model(scope, body)
        m = self.fleet.find(name)
        if m is None:
            raise unknown_model(name, self.fleet.names())
        scope.setdefault("state", {})["model"] = m.name
        path = scope.get("path", "")
        keep = keep_alive_of(path, body)
        if keep == 0 and is_load_only(path, body):  # Ollama: keep_alive 0 and no prompt unloads
            self.fleet.unload_now(m)
            return await JSONResponse(load_only_answer(path, m.name, "unload"))(scope, receive, send)
        stream = path.startswith("/api/") and body.get("stream", path in STREAMED_BY_DEFAULT) \
            or not path.startswith("/api/") and bool(body.get("stream"))
        out = Committed(send, path) if stream else None
        if not await self.wait_loaded(m, out):
            return  # answered in its stream
        try:
            await m.app(scope, replay(messages, receive), out.send if out is not None else send)
        finally:
            self.fleet.release(m, keep)

    async def wait_loaded(self, m: Member, out: Committed | None) -> bool:
        """Until `m` is loaded and counts this request (True). If it fails to load or the request's
        time runs out: raises, or where the stream has begun, answers in it (False)."""
        usage = current_usage.get()
        arrived = usage.arrived if usage is not None else time.monotonic()
        deadline, waiting = arrived + self.settings.request_timeout, None
        while True:
            if waiting is None:
                try:
                    got = self.fleet.claim(m)
                except NeverFits as e:
                    return await self.fail(out, ApiError(503, str(e), "server_error", code="model_too_large"))
                if got is True:
                    return True
                waiting = got if isinstance(got, Load) else None
            elif waiting.done.is_set():
                if waiting.error:
                    return await self.fail(out, ApiError(503, f"model {m.name} failed to load: {waiting.error}",
                                                         "server_error", code="model_load_failed"))
                waiting = None
                continue
            now = time.monotonic()
            if now >= deadline:
                return await self.fail(out, ApiError(503, f"model {m.name} was not loaded within the request's time "
                                                          f"limit ({self.settings.request_timeout:g} s)", "server_error",
                                                     code="model_loading", headers={"Retry-After": "5"}))
            if out is not None and now - out.since >= self.settings.keep_alive:
                await out.keep_alive()
            await asyncio.sleep(POLL)

    async def fail(self, out: Committed | None, e: ApiError) -> bool:
        if out is None or not out.started:
            raise e
        await out.error(e)
        return False


class Committed:
    """A stream whose headers may go out before the model is loaded: keep-alives meanwhile, then the
    model's answer (an error answer is written into the stream)."""

    def __init__(self, send, path: str) -> None:
        self._send, self.path = send, path
        self.started, self.since, self.status = False, time.monotonic(), 200
        self.sse = not path.startswith("/api/")
        self._error_body = b""

    async def _start(self) -> None:
        if not self.started:
            self.started = True
            kind = b"text/event-stream" if self.sse else b"application/x-ndjson"
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": [(b"content-type", kind), (b"cache-control", b"no-cache")]})

    async def keep_alive(self) -> None:
        await self._start()
        if self.sse:
            await self._send({"type": "http.response.body", "more_body": True,
                              "body": ANTHROPIC_PING if api_of(self.path) == "anthropic" else SSE_KEEP_ALIVE})
        self.since = time.monotonic()

    async def error(self, e: ApiError) -> None:
        await self._write_error(shaped(self.path, e))

    async def _write_error(self, body: dict) -> None:
        data = json.dumps(body).encode()
        if not self.sse:
            line = data + b"\n"
        elif api_of(self.path) == "anthropic":
            line = b"event: error\ndata: " + data + b"\n\n"
        else:
            line = b"data: " + data + b"\n\n"
        await self._send({"type": "http.response.body", "body": line, "more_body": False})

    async def send(self, message) -> None:
        if not self.started:
            return await self._send(message)
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        if self.status < 400:
            return await self._send(message)
        self._error_body += message.get("body", b"")
        if not message.get("more_body", False):
            try:
                body = json.loads(self._error_body)
            except ValueError:
                body = {"error": self._error_body.decode(errors="replace")}
            await self._write_error(body)


async def read_body(receive) -> list[dict]:
    """The request's messages up to the end of its body (BodyLimit has capped its size)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def replay(messages: list[dict], receive):
    async def again():
        return messages.pop(0) if messages else await receive()

    return again


def request_json(scope, messages: list[dict]) -> dict:
    """The body as a JSON object, where it is one (else {}: the model's app says what is wrong)."""
    if scope.get("method") != "POST":
        return {}
    raw = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    if b'"model"' not in raw and b'"name"' not in raw and b'"keep_alive"' not in raw and b'"stream"' not in raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def requested_model(scope, body: dict) -> str | None:
    """The model a request names: `model` in its body (Ollama's older `name` too), else `?model=`."""
    name = body.get("model") or (body.get("name") if scope.get("path", "").startswith("/api/") else None)
    if isinstance(name, str) and name:
        return name
    from urllib.parse import parse_qs

    query = parse_qs((scope.get("query_string") or b"").decode(errors="replace"))
    return (query.get("model") or [None])[0]


def keep_alive_of(path: str, body: dict) -> float | None:
    """Ollama's keep_alive (seconds; negative: forever), on Ollama's routes; None where not given."""
    from app.errors import SpecdeckError
    from app.units import parse_duration

    value = body.get("keep_alive") if path.startswith("/api/") else None
    if value is None:
        return None
    try:
        return parse_duration(str(value))
    except SpecdeckError as e:
        raise ApiError(400, f"keep_alive: {e.message} (e.g. 5m, 300, 0 or -1)", param="keep_alive") from None


def is_load_only(path: str, body: dict) -> bool:
    """Ollama's load (or unload) request: /api/generate with no prompt, /api/chat with no messages."""
    if path == "/api/generate":
        return not body.get("prompt") and body.get("suffix") is None and not body.get("images")
    return path == "/api/chat" and not body.get("messages")


def load_only_answer(path: str, name: str, reason: str) -> dict:
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    if path == "/api/chat":
        return {"model": name, "created_at": now, "message": {"role": "assistant", "content": ""}, "done": True,
                "done_reason": reason}
    return {"model": name, "created_at": now, "response": "", "done": True, "done_reason": reason}
