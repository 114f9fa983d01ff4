"""`specdeck serve`: bind first (so /health answers 503 while loading), load the plan's models in
the background, then serve; SIGTERM / Ctrl-C finish or cancel in-flight requests and free the
contexts."""

from __future__ import annotations

import logging
import threading

import uvicorn

from ..gguf_info import ModelInfo
from ..planner import Plan
from ..runtime import Loaded, load
from .app import Service, create_app
from .scheduler import Scheduler
from .settings import ServeSettings

log = logging.getLogger("specdeck.server")


def build_service(plan: Plan, target: ModelInfo, draft: ModelInfo | None, model_id: str) -> Service:
    return Service(model_id=model_id, n_ctx=plan.ctx, speculative_default=True,
                   plan=plan.to_json(), models={"target": str(target.path), "draft": str(draft.path) if draft else None})


def attach(service: Service, loaded: Loaded, settings: ServeSettings, on_done) -> None:
    """Make a loaded engine live behind the service."""
    service.scheduler = Scheduler(loaded.engine, settings.max_queue, on_done=on_done)
    service.tokenizer = loaded.tokenizer
    service.n_ctx = loaded.target.n_ctx
    service.speculative_default = settings.speculative
    service.scheduler.start()
    service.ready = True


def serve(settings: ServeSettings, plan: Plan, target: ModelInfo, draft: ModelInfo | None, threads: int,
          model_id: str) -> int:
    settings.check()
    service = build_service(plan, target, draft, model_id)
    app = create_app(settings, service)
    state: dict = {}

    def loader() -> None:
        try:
            state["loaded"] = load(plan, target, draft, threads, adaptive=settings.speculative)
            attach(service, state["loaded"], settings, app.state.count)
            log.warning("specdeck: models loaded, serving on http://%s:%d", settings.host, settings.port)
        except Exception as e:  # noqa: BLE001 - reported, and the server says why it is not ready
            state["error"] = e
            log.error("specdeck: loading failed: %s", e)

    threading.Thread(target=loader, name="specdeck-load", daemon=True).start()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        if service.scheduler is not None:
            service.scheduler.stop()
        if "loaded" in state:
            state["loaded"].close()
    return 1 if "error" in state else 0
