"""The FastAPI app, built by `create_app(settings, service)`: OpenAI routes, llama.cpp's /infill,
health, status and Prometheus metrics. Handlers only translate and enqueue; the scheduler's
worker thread owns the engine."""

from __future__ import annotations

import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import __version__
from app.server.access import SELF_HEADER, SourceAllowlist
from app.server.anthropic import add_anthropic_routes
from app.server.audit import AccessLog, Usage, open_sink
from app.server.core import (
    Service,
    capacity,
    finished,
    refresh_gauges,
    require_ready,
    status_json,
)
from app.server.embeddings import add_embedding_routes
from app.server.errors import CLIENT_GONE, ApiError, error_response, validation_error
from app.server.keys import KeyGate, KeyStore, Windows
from app.server.limits import BodyLimit
from app.server.llamacpp import add_llamacpp_routes, add_unprefixed_routes
from app.server.metrics import Metrics
from app.server.ollama import add_ollama_routes
from app.server.openai import add_openai_routes
from app.server.responses import add_responses_routes
from app.server.settings import ServeSettings

log = logging.getLogger("specdeck.server")



LOCAL_ORIGINS = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"


def cors_options(origins: list[str]) -> dict:
    """CORS for the origins given; the keyword `localhost` allows any local origin (any port)."""
    exact = [o for o in origins if o != "localhost"]
    return {"allow_origins": exact, "allow_origin_regex": LOCAL_ORIGINS if "localhost" in origins else None,
            "allow_methods": ["GET", "POST", "OPTIONS"],
            "allow_headers": ["*"],  # a preflight gets back the headers it asked for (SDKs send many)
            "max_age": 600}


def count_request(metrics: Metrics, state: dict, route: str, status: int, usage: Usage) -> None:
    if state.get("limited"):
        metrics.key_limited.labels(state.get("key_name") or "").inc()
        return
    metrics.requests.labels(route, str(status)).inc()
    if usage.gone and status < 400:  # a stream its client dropped (a 499 is counted where it is raised)
        metrics.client_gone.inc()


def create_app(settings: ServeSettings, service: Service) -> FastAPI:
    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over a speculative llama.cpp engine")
    metrics = Metrics()
    app.state.service, app.state.metrics, app.state.settings = service, metrics, settings
    app.state.count = lambda job, rec: finished(metrics, settings, service, job, rec)  # the scheduler reports here
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
    app.add_middleware(AccessLog, sink=app.state.access_sink, on_request=lambda *a: count_request(metrics, *a))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        if e.status == CLIENT_GONE:  # the client gave up: its habit, not the server's fault
            metrics.client_gone.inc()
        else:
            metrics.errors.labels(e.type).inc()
        return error_response(request.url.path, e)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError):
        metrics.errors.labels("invalid_request_error").inc()
        return error_response(request.url.path, validation_error(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return error_response(request.url.path, ApiError(e.status_code, str(e.detail),
                                                         "not_found_error" if e.status_code == 404 else "invalid_request_error"))

    # -- health, status, metrics -------------------------------------------------------------

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def running():
        """A reachability probe (Claude Code sends HEAD /): 200, as llama-server and Ollama answer it."""
        return PlainTextResponse("specdeck is running")

    @app.get("/health")
    async def health(fail_on_no_slot: bool = False):
        """200 when ready (503 while loading); with ?fail_on_no_slot=1 (llama-server's), 503 while every
        slot is busy, so a balancer's health check can steer away from a full instance."""
        room = capacity(service)
        if not room["ready"]:
            return JSONResponse({"status": "loading", **room}, 503)
        if fail_on_no_slot and room["slots_free"] == 0:
            return JSONResponse({"status": "no slot available", **room}, 503)
        return {"status": "ok", **room}

    @app.get("/v1/models")
    async def models():
        """OpenAI's list, plus the `models` catalogue Codex CLI reads from a custom provider."""
        names = [service.model_id, *settings.model_aliases]
        return {"object": "list",
                "data": [{"id": n, "object": "model", "created": 0, "owned_by": "specdeck",
                          "meta": {"n_ctx": service.n_ctx}} for n in names],
                "models": [{"slug": n, "display_name": n, "context_window": service.n_ctx} for n in names]}

    @app.get("/v1/status")
    async def status():
        require_ready(service)
        return {**status_json(service, metrics), "settings": settings.model_dump(mode="json", exclude={"api_key"})}

    @app.get("/metrics")
    async def prometheus():
        if service.ready:
            refresh_gauges(service, metrics)
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    add_openai_routes(app, settings, service, metrics)
    add_anthropic_routes(app, settings, service, metrics)
    add_responses_routes(app, settings, service, metrics)
    add_llamacpp_routes(app, settings, service, metrics)
    add_embedding_routes(app, settings, service, metrics)
    add_ollama_routes(app, settings, service, metrics)
    add_unprefixed_routes(app)
    return app
