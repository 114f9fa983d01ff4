"""`specdeck serve`: bind first (so /health answers 503 while loading), load the plan's models in
the background, then serve; SIGTERM / Ctrl-C finish or cancel in-flight requests and free the
contexts."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn

from app.chat.detect import detect
from app.chat.spec import ChatSpec
from app.engine.embed import Embedder
from app.engine.loader import Loaded, load
from app.errors import SpecdeckError
from app.gguf.info import ModelInfo
from app.ops.alerts import AlertSettings
from app.ops.smoke import smoke_request
from app.server import sdnotify
from app.server.app import Service, create_app
from app.server.keys import KeyStore
from app.server.model_start import ModelStart
from app.server.scheduler import Scheduler
from app.server.settings import ServeSettings
from app.server.watch import AlertWatcher

log = logging.getLogger("specdeck.server")


def open_service(m: ModelStart, settings: ServeSettings, start: Start) -> tuple[Service, object]:
    """The model's service with its whole identity (name, plan, files, and the start's revision,
    machine, digests and fallback) and its app (keys read, SIGHUP re-reads them); it answers 503
    until `go_live`."""
    plan = m.plan
    service = Service(model_id=m.name, n_ctx=plan.ctx, speculative_default=True, plan=plan,
                      models={"target": str(m.target.path),
                              "draft": str(m.draft.path) if m.draft else "mtp" if plan.mtp else None},
                      details=model_details(m.target), revision=start.revision, machine=start.machine,
                      digests=start.digests, fallback=start.fallback)
    app = create_app(settings, service)
    reload_keys_on_hangup(app.state.keys)
    return service, app


def load_model(m: ModelStart, threads: int, settings: ServeSettings, cancel: threading.Event | None = None) -> Loaded:
    return load(m.plan, m.target, m.draft, threads, adaptive=settings.speculative, suffix_tokens=settings.suffix_tokens,
                cache_ram_mib=settings.cache_ram, cancel=cancel, chat_template=m.chat_template, mmproj=m.mmproj)


def go_live(service: Service, app, loaded: Loaded, m: ModelStart, settings: ServeSettings, threads: int,
            start: Start) -> None:
    """The loaded model behind its service: the embedding model, the scheduler, the alert watcher."""
    if m.embedder is not None and m.plan.embedding is not None:
        service.embedder = Embedder(m.embedder, m.plan.embedding, threads)
    attach(service, loaded, settings, app.state.count)
    watch_alerts(service, app.state.metrics, start)


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
    service.use_chat(chat_spec(loaded.tokenizer, settings.reasoning_format))
    service.thinking_default = False if settings.reasoning_budget == 0 else None
    service.n_ctx = loaded.target.n_ctx
    service.speculative_default = settings.speculative
    service.scheduler.start()
    service.ready = True


def chat_spec(tok, reasoning_format: str) -> ChatSpec:
    """The chat format of the template being served, found by rendering through it; said in the log,
    with one line when the template's tool calls are not parsed."""
    if not tok.chat_template:
        return ChatSpec()
    spec = detect(tok.chat_template, lambda m, t, g: tok.render_chat(m, t, generation_prompt=g))
    if reasoning_format == "none":
        spec = spec.without_reasoning()
    log.warning("specdeck: chat format %s", spec.name)
    if spec.note:
        log.warning("specdeck: %s", spec.note)
    return spec


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


# seconds uvicorn waits, after a stop, for the connections in flight to close before it cancels their
# handlers: only a safety net, since the scheduler ends every request within a prompt chunk or a step
# of the wind-down (a client that stops reading can still hold its connection)
GRACEFUL_LIMIT = 60


class _Server(uvicorn.Server):
    """uvicorn, and on a stop (SIGTERM / Ctrl-C, or `stop()` where no signal can reach it) the
    generation in flight gets `shutdown_grace` seconds to finish, then the scheduler winds down
    (queued requests 503, a prompt being evaluated stops at its next chunk, answers end at their next
    step), so streams close and the process exits in seconds. `on_stop` is told at once."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_stop = on_stop
        self.stop_asked = False

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after its shutdown, which would skip our cleanup (and make Ctrl-C
        # exit 130): a stop asked for is a clean exit 0
        self._captured_signals.clear()
        self._stopping()

    def stop(self) -> None:
        self.should_exit = True
        self._stopping()

    def _stopping(self) -> None:
        if self.stop_asked:
            return
        self.stop_asked = True
        if self.on_stop is not None:
            self.on_stop()
        state = self.config.app.state
        if state.service.scheduler is not None:
            timer = threading.Timer(state.settings.shutdown_grace, state.service.scheduler.wind_down)
            timer.daemon = True
            timer.start()


def _server(app, on_stop: Callable[[], None] | None = None) -> _Server:
    settings = app.state.settings
    tls = {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)} if settings.tls_cert else {}
    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-For from any loopback peer; the
    # client address is app/server/access.py's, from --trusted-proxies only
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(settings.shutdown_grace) + GRACEFUL_LIMIT,
                            proxy_headers=False, **tls)
    return _Server(config, on_stop)


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
        """Stop accepting and wind down as a signal would (see _Server); returns once the requests in
        flight have ended."""
        self.server.stop()
        self.thread.join(self.server.config.timeout_graceful_shutdown + 5)


def shutdown(service: Service, loaded: Loaded | None) -> None:
    """After the HTTP server stopped: cancel what is left, wait for the engine's worker to leave
    llama.cpp, then free the contexts (never while a decode may still run in them)."""
    if service.alerts is not None:
        service.alerts.stop()
    if service.scheduler is not None and not service.scheduler.stop():
        log.error("specdeck: the engine did not stop in time; its contexts are left to the process's exit")
        return
    if loaded is not None:
        loaded.close()
    if service.embedder is not None:
        service.embedder.close()


class StartFailed(SpecdeckError):
    """The server never became good: models did not load, health never came, or the smoke failed."""


@dataclass
class Start:
    """How one start is judged and reported (the command supplies it; everything optional)."""

    alerts: AlertSettings | None = None
    baseline_acceptance: float | None = None
    on_good: Callable[[], None] | None = None  # called once healthy and the smoke request passed
    timeout: float = 900.0  # seconds to become good, else the start failed
    revision: int | None = None
    machine: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    status_line: str = ""  # appended to systemd's STATUS= (e.g. the fallback that led here)
    plan: dict | None = None  # the plan this start serves (recorded with the revision)
    fallback: dict | None = None  # {"from": revision, "reason": ...} when this start stands in for a failed one


def watch_alerts(service: Service, metrics, start: Start) -> None:
    if start.alerts is not None:
        service.alerts = AlertWatcher(service, metrics, start.alerts, start.baseline_acceptance)
        service.alerts.check()
        service.alerts.start()


def reload_keys_on_hangup(store: KeyStore) -> None:
    """SIGHUP (`systemctl reload specdeck`) reads the key file again. The reload runs in a thread of
    its own: a signal handler may interrupt the main thread anywhere, logging included."""
    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=store.reload, name="specdeck-keys",
                                                                 daemon=True).start())


def local_url(settings: ServeSettings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else "[::1]" if settings.host == "::" else settings.host
    return f"{settings.scheme}://{host}:{settings.port}"


def serve(settings: ServeSettings, m: ModelStart, threads: int, start: Start | None = None) -> int:
    """Serve until stopped. Raises StartFailed if it never became good (the caller may fall back);
    returns 0 after a clean stop, also one during start-up (a stop is not a failed start)."""
    start = start or Start()
    start.plan = m.plan.to_json()
    model_id = m.name
    settings.check()
    sock = bind_socket(settings.host, settings.port)
    service, app = open_service(m, settings, start)
    stop = threading.Event()  # a stop was asked for (signal), or the server has ended
    server = _server(app, on_stop=stop.set)
    state: dict = {}
    url = local_url(settings)
    tail = f" ({start.status_line})" if start.status_line else ""

    def fail(why: str) -> None:
        state["error"] = why
        log.error("specdeck: %s", why)
        sdnotify.notify(f"STATUS={why}"[:400])
        server.should_exit = True

    def loader() -> None:
        try:
            state["loaded"] = load_model(m, threads, settings, cancel=stop)
            if stop.is_set():
                return
            go_live(service, app, state["loaded"], m, settings, threads, start)
        except Exception as e:  # noqa: BLE001 - reported, and the start has failed (unless it was stopped)
            if not stop.is_set():
                fail(f"loading failed: {e}")
            return
        while not server.started and not stop.is_set():
            time.sleep(0.02)
        if stop.is_set():
            return
        try:
            result = smoke_request(url, None, app.state.self_headers)
        except SpecdeckError as e:
            if not stop.is_set():  # a stop cuts the smoke request short: that is no failure
                fail(f"smoke request failed: {e.message}")
            return
        state["good"] = True
        if start.on_good is not None:
            start.on_good()
        log.warning("specdeck: models loaded, serving on %s://%s:%d (smoke: %s)", settings.scheme, settings.host,
                    settings.port, result)
        sdnotify.notify(f"READY=1\nSTATUS=serving {model_id} on {settings.host}:{settings.port}"
                        + (f", revision {start.revision}" if start.revision else "") + tail)

    def deadline() -> None:
        if not stop.wait(start.timeout) and "good" not in state and "error" not in state:
            fail(f"not healthy after {start.timeout:.0f} s")

    sdnotify.notify(f"STATUS=loading {model_id}" + (f" (revision {start.revision})" if start.revision else "") + tail)
    loading = threading.Thread(target=loader, name="specdeck-load", daemon=True)
    loading.start()
    threading.Thread(target=deadline, name="specdeck-start-timeout", daemon=True).start()
    sdnotify.start_watchdog(f"{url}/health", app.state.self_headers,
                            lambda: service.scheduler is not None and service.scheduler.thread is not None
                            and service.scheduler.thread.is_alive(), stop)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        sock.close()
        if "good" in state or "error" not in state:
            sdnotify.notify("STOPPING=1")
        loading.join()  # loading stops at llama.cpp's next progress report, the smoke request with the engine
        shutdown(service, state.get("loaded"))
    if "error" in state and "good" not in state:
        raise StartFailed(state["error"])
    if "good" not in state:
        log.warning("specdeck: stopped during start-up (nothing was serving yet)")
    return 1 if "error" in state else 0
