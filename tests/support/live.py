"""A real specdeck server (uvicorn in a thread, over a real engine) and a free loopback port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from app.engine.embed import Embedder
from app.engine.loader import load
from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.plan.planner import PlanRequest, make_plan
from app.server.app import create_app
from app.server.serve import attach, build_service
from app.server.settings import ServeSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, timeout: float, every: float = 0.25):
    """`what()` once it is truthy (polled every `every` seconds), or None after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    return None


class LiveServer:
    """A real uvicorn server in a thread, over a real engine."""

    def __init__(self, target, draft, settings: ServeSettings, parallel=2, ctx=1024, embedding=None):
        t, d = read_model_info(target), read_model_info(draft) if draft else None
        e = read_model_info(embedding) if embedding else None
        self.plan = make_plan(t, d, PlanRequest(ctx=ctx, ctx_is_user_choice=True, parallel=parallel, draft_max=4), detect(),
                              ctx, e)
        self.loaded = load(self.plan, t, d, 1, adaptive=True)
        self.service = build_service(self.plan, t, d, "tiny")
        if e is not None:
            self.service.embedder = Embedder(e, self.plan.embedding, 1)
        self.app = create_app(settings, self.service)
        attach(self.service, self.loaded, settings, self.app.state.count)
        self.port = settings.port
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(100):
            if self.server.started:
                break
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.service.scheduler.stop()
        self.loaded.close()
        if self.service.embedder is not None:
            self.service.embedder.close()
