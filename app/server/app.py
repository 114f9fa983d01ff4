"""The FastAPI app, built by `create_app(settings, service)`: OpenAI routes, llama.cpp's /infill,
health, status and Prometheus metrics. Handlers only translate and enqueue; the scheduler's
worker thread owns the engine."""

from __future__ import annotations

import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import __version__
from app.server.core import (
    ApiError,
    Service,
    error_body,
    finished,
    refresh_gauges,
    require_ready,
    status_json,
)
from app.server.limits import BodyLimit
from app.server.metrics import Metrics
from app.server.ollama import add_ollama_routes
from app.server.openai import add_openai_routes
from app.server.settings import ServeSettings

log = logging.getLogger("specdeck.server")



def create_app(settings: ServeSettings, service: Service) -> FastAPI:
    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over a speculative llama.cpp engine")
    metrics = Metrics()
    app.state.service, app.state.metrics, app.state.settings = service, metrics, settings
    app.state.count = lambda job, rec: finished(metrics, settings, service, job, rec)  # the scheduler reports here
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"])
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
                return JSONResponse(error_body("invalid or missing API key", "authentication_error", code="invalid_api_key"), 401)
        response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        log.info(json.dumps({"path": request.url.path, "status": response.status_code,
                             "ms": round((time.perf_counter() - t) * 1e3, 1)}))
        return response

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        metrics.errors.labels(e.type).inc()
        return JSONResponse(error_body(e.message, e.type, e.param), e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        metrics.errors.labels("invalid_request_error").inc()
        if request.url.path.startswith("/api/"):  # Ollama's routes answer in Ollama's error shape
            where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
            return JSONResponse({"error": f"{where}: {first.get('msg')}"}, 400)
        if first.get("type") == "json_invalid":  # loc is ("body", character offset)
            where, why = first.get("loc", ("?",))[-1], first.get("ctx", {}).get("error", first.get("msg"))
            return JSONResponse(error_body(f"the body is not valid JSON (character {where}: {why})", "invalid_request_error"), 400)
        param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
        return JSONResponse(error_body(f"{param or 'body'}: {first.get('msg')}", "invalid_request_error", param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        return JSONResponse(error_body(str(e.detail), "invalid_request_error"), e.status_code)

    # -- health, status, metrics -------------------------------------------------------------

    @app.get("/health")
    async def health():
        if not service.ready:
            return JSONResponse({"status": "loading"}, 503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_id, "object": "model", "created": 0, "owned_by": "specdeck"}]}

    @app.get("/v1/status")
    async def status():
        require_ready(service)
        return status_json(service, metrics)

    @app.get("/metrics")
    async def prometheus():
        if service.ready:
            refresh_gauges(service, metrics)
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    add_openai_routes(app, settings, service, metrics)
    add_ollama_routes(app, settings, service, metrics)
    return app
