"""`specdeck serve`: bind first (so /health answers 503 while loading), load the plan's models in
the background, then serve; SIGTERM / Ctrl-C finish or cancel in-flight requests and free the
contexts."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

import uvicorn

from app.engine.embed import Embedder
from app.engine.loader import Loaded, load
from app.errors import SpecdeckError
from app.gguf.info import ModelInfo
from app.plan.planner import Plan
from app.server import sdnotify
from app.server.app import Service, create_app
from app.server.scheduler import Scheduler
from app.server.settings import ServeSettings

log = logging.getLogger("specdeck.server")


def build_service(plan: Plan, target: ModelInfo, draft: ModelInfo | None, model_id: str) -> Service:
    return Service(model_id=model_id, n_ctx=plan.ctx, speculative_default=True,
                   plan=plan.to_json(), models={"target": str(target.path), "draft": str(draft.path) if draft else None},
                   details=model_details(target))


def model_details(info: ModelInfo) -> dict:
    """What Ollama's /api/tags and /api/show report about the served model (from its GGUF header)."""
    stat = info.path.stat()
    return {"architecture": info.architecture, "n_params": info.n_params, "file_type": info.file_type,
            "context_length": info.context_length, "size": info.file_size, "mtime": stat.st_mtime,
            "chat_template": info.vocab.chat_template, "n_layers": info.n_layers, "n_embd": info.n_embd,
            "n_head": info.n_head}


def attach(service: Service, loaded: Loaded, settings: ServeSettings, on_done) -> None:
    """Make a loaded engine live behind the service (its live figures counted in `service.stats`)."""

    def done(job, rec) -> None:
        service.stats.done(rec)
        on_done(job, rec)

    service.scheduler = Scheduler(loaded.engine, settings.max_queue, on_step=service.stats.step, on_done=done)
    service.tokenizer = loaded.tokenizer
    service.n_ctx = loaded.target.n_ctx
    service.speculative_default = settings.speculative
    service.scheduler.start()
    service.ready = True


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening address, bound now so a busy port is one clear error before anything loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SpecdeckError(f"cannot listen on {host}:{port}: {e.strerror}",
                            hint="stop whatever uses that port, or pick another with --port") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn, and on SIGTERM / Ctrl-C the generation in flight gets `shutdown_grace` seconds to
    finish, then ends (finish "length"), so streams close and the process exits in seconds rather
    than at uvicorn's 10 s graceful limit or the end of a long answer."""

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:  # uvicorn re-raises it after shutdown, which skips our cleanup: exit 0 instead
            self._captured_signals.remove(sig)
        state = self.config.app.state
        if state.service.scheduler is not None:
            timer = threading.Timer(state.settings.shutdown_grace, state.service.scheduler.wind_down)
            timer.daemon = True
            timer.start()


def _server(app) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=10)
    return _Server(config)


class HttpThread:
    """uvicorn in a background thread (the main thread keeps the terminal: `specdeck up`'s dashboard)."""

    def __init__(self, app, sock: socket.socket) -> None:
        self.server = _server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="specdeck-http", daemon=True)

    def start(self, timeout: float = 15.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SpecdeckError("the HTTP server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop accepting; requests in flight get up to 10 s to finish (the scheduler still runs)."""
        self.server.should_exit = True
        self.thread.join(15)


def shutdown(service: Service, loaded: Loaded | None) -> None:
    """After the HTTP server stopped: cancel what is left, stop the worker, free the contexts."""
    if service.scheduler is not None:
        service.scheduler.stop()
    if loaded is not None:
        loaded.close()
    if service.embedder is not None:
        service.embedder.close()


def serve(settings: ServeSettings, plan: Plan, target: ModelInfo, draft: ModelInfo | None, threads: int,
          model_id: str, embedder: ModelInfo | None = None) -> int:
    settings.check()
    sock = bind_socket(settings.host, settings.port)
    service = build_service(plan, target, draft, model_id)
    app = create_app(settings, service)
    server = _server(app)
    state: dict = {}
    stop = threading.Event()

    def loader() -> None:
        try:
            state["loaded"] = load(plan, target, draft, threads, adaptive=settings.speculative)
            if embedder is not None and plan.embedding is not None:
                service.embedder = Embedder(embedder, plan.embedding, threads)
            attach(service, state["loaded"], settings, app.state.count)
            log.warning("specdeck: models loaded, serving on http://%s:%d", settings.host, settings.port)
            sdnotify.notify(f"READY=1\nSTATUS=serving {model_id} on {settings.host}:{settings.port}")
        except Exception as e:  # noqa: BLE001 - reported, and the server says why it is not ready
            state["error"] = e
            log.error("specdeck: loading failed: %s", e)
            if sdnotify.notify(f"STATUS=loading failed: {e}"):
                server.should_exit = True  # under systemd: exit 1, so Restart=on-failure tries again

    sdnotify.notify(f"STATUS=loading {model_id}")
    threading.Thread(target=loader, name="specdeck-load", daemon=True).start()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else "[::1]" if settings.host == "::" else settings.host
    sdnotify.start_watchdog(f"http://{host}:{settings.port}/health",
                            lambda: service.scheduler is not None and service.scheduler.thread is not None
                            and service.scheduler.thread.is_alive(), stop)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        sdnotify.notify("STOPPING=1")
        shutdown(service, state.get("loaded"))
    return 1 if "error" in state else 0
