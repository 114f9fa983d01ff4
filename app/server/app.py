"""The FastAPI app, built by `create_app(settings, service)`: OpenAI routes, llama.cpp's /infill,
health, status and Prometheus metrics. Handlers only translate and enqueue; the scheduler's
worker thread owns the engine."""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time

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
from app.server.core import (
    Service,
    finished,
    refresh_gauges,
    require_ready,
    status_json,
)
from app.server.embeddings import add_embedding_routes
from app.server.errors import ApiError, error_response, validation_error
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


def create_app(settings: ServeSettings, service: Service) -> FastAPI:
    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over a speculative llama.cpp engine")
    metrics = Metrics()
    app.state.service, app.state.metrics, app.state.settings = service, metrics, settings
    app.state.count = lambda job, rec: finished(metrics, settings, service, job, rec)  # the scheduler reports here
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        t = time.perf_counter()
        key = settings.api_key
        if key and request.url.path not in ("/health",) and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), key.encode()):
                metrics.requests.labels(request.url.path, "401").inc()
                return error_response(request.url.path, ApiError(401, "invalid or missing API key", "authentication_error",
                                                                 code="invalid_api_key"))
        response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        log.info(json.dumps({"path": request.url.path, "status": response.status_code,
                             "ms": round((time.perf_counter() - t) * 1e3, 1)}))
        return response

    if settings.cors_origins:  # so refusals (401, 413) carry the CORS headers too
        app.add_middleware(CORSMiddleware, **cors_options(settings.cors_origins))
    # outermost: a source outside --allow-from gets 403 before anything else reads its request
    token = secrets.token_hex(16)
    app.state.self_headers = {SELF_HEADER: token}  # the server's own smoke request and watchdog check
    app.add_middleware(SourceAllowlist, allow=settings.networks("allow_from"), trusted=settings.networks("trusted_proxies"),
                       self_token=token)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
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

    @app.get("/health")
    async def health():
        if not service.ready:
            return JSONResponse({"status": "loading"}, 503)
        return {"status": "ok"}

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
