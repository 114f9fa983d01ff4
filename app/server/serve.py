"""Starting a server, the one way `serve`, `up` and `validate`'s own server do it: bind first (so
/health answers 503 while loading), build each model's service whole (`open_service`) and the
fleet's front over them (`open_fleet`), load what the start loads in the background, then serve;
SIGTERM / Ctrl-C finish or cancel in-flight requests and free the contexts."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from app.engine.loader import Loaded
from app.errors import SpecdeckError
from app.ops.smoke import smoke_request
from app.server import sdnotify
from app.server.fleet import Fleet, Member, NeverFits
from app.server.front import create_front
from app.server.keys import KeyStore
from app.server.lifecycle import go_live, load_model, model_settings, open_service, shutdown
from app.server.model_start import ModelStart, Start
from app.server.settings import ServeSettings

log = logging.getLogger("specdeck.server")


def open_fleet(models: list[ModelStart] | tuple[ModelStart, ...], settings: ServeSettings, start: Start,
               threads: int) -> tuple[Fleet, object]:
    """Every model's service, whole (none loaded yet), and the front that serves them: the one
    app a server runs (its keys read; SIGHUP re-reads them)."""
    members = [Member(m, *open_service(m, settings, start)) for m in models]
    fleet = Fleet(members, fleet_budget(models), settings.models_max, default_model(settings, models),
                  load=lambda member, cancel: load_member(member, settings, threads, start, cancel),
                  unload=unload_member, strict=settings.strict_model)
    front = create_front(settings, fleet)
    reload_keys_on_hangup(front.state.keys)
    return fleet, front


def fleet_budget(models) -> int:
    """The memory the models share: the plans' budget (the smallest, where one model's was set apart)."""
    return min(m.plan.budget for m in models)


def default_model(settings: ServeSettings, models) -> str | None:
    names = [m.name for m in models]
    if settings.default_model is not None:
        if settings.default_model not in names:
            raise SpecdeckError(f"--default-model {settings.default_model} is not one of the models served ({', '.join(names)})")
        return settings.default_model
    return names[0] if len(names) == 1 else None


def load_member(member: Member, settings: ServeSettings, threads: int, start: Start, cancel: threading.Event) -> None:
    """Load a model of the fleet and put it live behind its service."""
    loaded = load_model(member.start, threads, settings, cancel=cancel, costs=member.costs)  # measured once: a reload reuses them
    if cancel.is_set():
        loaded.close()
        raise SpecdeckError("stopped")
    go_live_member(member, loaded, settings, threads, start)


def go_live_member(member: Member, loaded: Loaded, settings: ServeSettings, threads: int, start: Start) -> None:
    member.loaded, member.costs = loaded, loaded.costs
    go_live(member.service, member.app, loaded, member.start, model_settings(settings, member.start), threads, start)


def unload_member(member: Member) -> None:
    shutdown(member.service, member.loaded)
    member.service.detach()
    member.loaded = None


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
    """uvicorn, with a drain. On SIGTERM (or Ctrl-C) the server first drains: readiness and /health
    answer 503 `draining` at once while it goes on listening and serving, until no request is in
    flight or `shutdown_grace` seconds have passed (Kubernetes takes the replica out of its endpoints
    meanwhile). Then uvicorn stops accepting and what is still generating is wound down (queued
    requests 503, a prompt being evaluated stops at its next chunk, answers end at their next step),
    so the process exits within the grace. A second signal, or `stop()` (where no signal can reach
    it), skips the drain. `on_stop` is told at once."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_stop = on_stop
        self.stop_asked = False
        self.drain_started = False

    def handle_exit(self, sig, frame) -> None:
        if self.drain_started or self.stop_asked:
            self._exit(sig, frame, 0.0)
            return
        self.drain_started = True
        state = self.config.app.state
        fleet, grace = state.fleet, state.settings.shutdown_grace
        fleet.draining.set()
        if self.on_stop is not None:
            self.on_stop()
        log.warning("specdeck: stopping: draining (%d request(s) in flight, up to %.0f s)", fleet.in_flight(), grace)

        def drain() -> None:
            deadline = time.monotonic() + grace
            while fleet.in_flight() and time.monotonic() < deadline:
                time.sleep(0.05)
            self._exit(sig, frame, max(0.0, deadline - time.monotonic()))

        threading.Thread(target=drain, name="specdeck-drain", daemon=True).start()

    def _exit(self, sig, frame, grace: float) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after its shutdown, which would skip our cleanup (and make Ctrl-C
        # exit 130): a stop asked for is a clean exit 0
        self._captured_signals.clear()
        self._stopping(grace)

    def stop(self) -> None:
        self.should_exit = True
        self._stopping(self.config.app.state.settings.shutdown_grace)

    def _stopping(self, grace: float) -> None:
        if self.stop_asked:
            return
        self.stop_asked = True
        if self.on_stop is not None:
            self.on_stop()
        state = self.config.app.state
        state.fleet.draining.set()
        timer = threading.Timer(grace, wind_down, args=(state.fleet,))
        timer.daemon = True
        timer.start()


def wind_down(fleet: Fleet) -> None:
    for m in fleet.members.values():
        if m.service.scheduler is not None:
            m.service.scheduler.wind_down()


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


def close_fleet(fleet: Fleet) -> None:
    """After the HTTP server stopped: no more loads or unloads, then every loaded model freed."""
    fleet.stop()
    for m in fleet.members.values():
        if m.loaded is not None or m.service.scheduler is not None:
            shutdown(m.service, m.loaded)
            m.loaded = None


class StartFailed(SpecdeckError):
    """The server never became good: models did not load, health never came, or the smoke failed."""


def reload_keys_on_hangup(store: KeyStore) -> None:
    """SIGHUP (`systemctl reload specdeck`) reads the key file again. The reload runs in a thread of
    its own: a signal handler may interrupt the main thread anywhere, logging included."""
    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=store.reload, name="specdeck-keys",
                                                                 daemon=True).start())


def local_url(settings: ServeSettings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else "[::1]" if settings.host == "::" else settings.host
    return f"{settings.scheme}://{host}:{settings.port}"


def start_loads(fleet: Fleet) -> list[Member]:
    """What a start loads: the default model (else the first named), then each other one in the
    order named while it fits beside those (the rest load when asked for)."""
    first = fleet.first
    return [first] + [m for m in fleet.members.values() if m is not first]


def load_at_start(fleet: Fleet, stop: threading.Event) -> str | None:
    """Load the start's models; None, or why the first failed (the others' failures are logged:
    they stay unloaded, and a request for one tries again)."""
    for i, m in enumerate(start_loads(fleet)):
        if stop.is_set():
            return None
        if i and not fleet.fits_beside_loaded(m):
            log.warning("specdeck: model %s loads when asked for (it does not fit beside the loaded ones)", m.name)
            continue
        try:
            why = fleet.load_now(m)
        except NeverFits as e:
            why = str(e)
        if why is None or stop.is_set():
            continue
        if i == 0:
            return why
        log.error("specdeck: model %s is not loaded: %s", m.name, why)
    return None


def serve(settings: ServeSettings, models: list[ModelStart] | tuple[ModelStart, ...], threads: int,
          start: Start | None = None) -> int:
    """Serve until stopped. Raises StartFailed if it never became good (the caller may fall back);
    returns 0 after a clean stop, also one during start-up (a stop is not a failed start)."""
    start = start or Start()
    start.plan = models[0].plan.to_json()
    names = ", ".join(m.name for m in models)
    settings.check()
    sock = bind_socket(settings.host, settings.port)
    fleet, app = open_fleet(models, settings, start, threads)
    stop = threading.Event()  # a stop was asked for (signal), or the server has ended
    server = _server(app, on_stop=lambda: (stop.set(), fleet.stopping.set()))
    state: dict = {}
    url = local_url(settings)
    tail = f" ({start.status_line})" if start.status_line else ""

    def fail(why: str) -> None:
        state["error"] = why
        log.error("specdeck: %s", why)
        sdnotify.notify(f"STATUS={why}"[:400])
        server.should_exit = True

    def loader() -> None:
        why = load_at_start(fleet, stop)
        if stop.is_set():
            return
        if why is not None:
            fail(f"loading failed: {why}")
            return
        fleet.ready = True
        while not server.started and not stop.is_set():
            time.sleep(0.02)
        if stop.is_set():
            return
        try:
            result = smoke_models(url, app.state.self_headers, fleet)
        except SpecdeckError as e:
            if not stop.is_set():  # a stop cuts the smoke request short: that is no failure
                fail(f"smoke request failed: {e.message}")
            return
        state["good"] = True
        if start.on_good is not None:
            start.on_good()
        log.warning("specdeck: models loaded, serving on %s://%s:%d (smoke: %s)", settings.scheme, settings.host,
                    settings.port, result)
        sdnotify.notify(f"READY=1\nSTATUS=serving {names} on {settings.host}:{settings.port}"
                        + (f", revision {start.revision}" if start.revision else "") + tail)

    def deadline() -> None:
        if not stop.wait(start.timeout) and "good" not in state and "error" not in state:
            fail(f"not healthy after {start.timeout:.0f} s")

    sdnotify.notify(f"STATUS=loading {names}" + (f" (revision {start.revision})" if start.revision else "") + tail)
    fleet.start()
    loading = threading.Thread(target=loader, name="specdeck-load", daemon=True)
    loading.start()
    threading.Thread(target=deadline, name="specdeck-start-timeout", daemon=True).start()
    sdnotify.start_watchdog(f"{url}/health", app.state.self_headers, lambda: engines_alive(fleet), stop)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        sock.close()
        if "good" in state or "error" not in state:
            sdnotify.notify("STOPPING=1")
        fleet.stopping.set()  # a load in progress stops at llama.cpp's next progress report
        loading.join()  # the smoke request ends with the engine
        close_fleet(fleet)
    if "error" in state and "good" not in state:
        raise StartFailed(state["error"])
    if "good" not in state:
        log.warning("specdeck: stopped during start-up (nothing was serving yet)")
    return 1 if "error" in state else 0


def engines_alive(fleet: Fleet) -> bool:
    """The watchdog's check: every loaded model's engine thread runs (and one is loaded)."""
    live = [m.service.scheduler for m in fleet.members.values() if m.service.scheduler is not None]
    return bool(live) and all(s.thread is not None and s.thread.is_alive() for s in live)


def smoke_models(url: str, headers: dict, fleet: Fleet) -> str:
    """The start-up smoke request, to each loaded model."""
    loaded = [m for m in fleet.members.values() if m.service.ready]
    results = [smoke_request(url, None, headers, model=m.name if len(fleet.members) > 1 else None) for m in loaded]
    return results[0] if len(results) == 1 else ", ".join(f"{m.name} {r}" for m, r in zip(loaded, results, strict=True))
