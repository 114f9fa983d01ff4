"""One model's app, built by `create_app(settings, service)`: the OpenAI, Anthropic, Responses,
llama.cpp and Ollama routes over its service, with its own metrics. Handlers only translate and
enqueue; the scheduler's worker thread owns the engine. The server's front (app/server/front.py)
runs the middlewares, health and the listings, and hands each request to its model's app."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import __version__
from app.server.anthropic import add_anthropic_routes
from app.server.core import Service, finished
from app.server.embeddings import add_embedding_routes
from app.server.errors import CLIENT_GONE, ApiError, error_response, validation_error
from app.server.llamacpp import add_llamacpp_routes, add_unprefixed_routes
from app.server.metrics import Metrics
from app.server.ollama import add_ollama_routes
from app.server.openai import add_openai_routes
from app.server.responses import add_responses_routes
from app.server.settings import ServeSettings

log = logging.getLogger("specdeck.server")


def create_app(settings: ServeSettings, service: Service) -> FastAPI:
    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over a speculative llama.cpp engine")
    metrics = Metrics()
    app.state.service, app.state.metrics, app.state.settings = service, metrics, settings
    app.state.count = lambda job, rec: finished(metrics, settings, service, job, rec)  # the scheduler reports here

    add_error_handlers(app, lambda request: metrics)

    add_openai_routes(app, settings, service, metrics)
    add_anthropic_routes(app, settings, service, metrics)
    add_responses_routes(app, settings, service, metrics)
    add_llamacpp_routes(app, settings, service, metrics)
    add_embedding_routes(app, settings, service, metrics)
    add_ollama_routes(app, settings, service, metrics)
    add_unprefixed_routes(app)
    return app


def add_error_handlers(app: FastAPI, metrics_of: Callable[[Request], Metrics]) -> None:
    """Errors in the envelope of the API the path belongs to, counted in the request's metrics."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        if e.status == CLIENT_GONE:  # the client gave up: its habit, not the server's fault
            metrics_of(request).client_gone.inc()
        else:
            metrics_of(request).errors.labels(e.type).inc()
        return error_response(request.url.path, e)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError):
        metrics_of(request).errors.labels("invalid_request_error").inc()
        return error_response(request.url.path, validation_error(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return error_response(request.url.path, ApiError(e.status_code, str(e.detail),
                                                         "not_found_error" if e.status_code == 404 else "invalid_request_error"))
