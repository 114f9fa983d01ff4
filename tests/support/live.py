"""Real specdeck servers for tests: `specdeck serve` as a process (`Serve`), uvicorn in a thread
over a real engine (`LiveServer`); a free loopback port; a self-signed certificate."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn

from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.gguf.projector import read_projector
from app.plan.planner import PlanRequest, make_plan
from app.server.model_start import ModelStart, Start
from app.server.serve import close_fleet, load_at_start, open_fleet
from app.server.settings import ServeSettings

ROOT = Path(__file__).resolve().parents[2]
SPECDECK = [sys.executable, "-m", "app.cli"]


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


def up_until_sigterm(*args: str, port: int, during, ready: float = 120.0, settle: float = 1.5) -> subprocess.CompletedProcess[str]:
    """`specdeck up ARGS --port PORT` as a subprocess (no TTY: it logs lines): once its /health
    answers 200, `during(url)`, then after `settle` seconds (a log interval) SIGTERM; what it printed."""
    import urllib.request

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    p = subprocess.Popen([*SPECDECK, "up", *args, "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: p.poll() is not None or healthy(), ready), "never ready"
        assert p.poll() is None, p.communicate()
        during(f"http://127.0.0.1:{port}")
        time.sleep(settle)
        p.terminate()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


class Progress:
    """Whether a process (with its children) is still working: its CPU time went on advancing within
    the last `stall` seconds. A wait on a server is bounded by this, not by a fixed time, so a slow or
    shared machine is waited for and only a stuck process fails."""

    def __init__(self, pid: int, stall: float = 120.0) -> None:
        import psutil

        try:
            self.proc = psutil.Process(pid)
        except psutil.NoSuchProcess:  # it has ended already
            self.proc = None
        self.stall, self.cpu, self.since = stall, -1.0, time.monotonic()

    def _cpu(self) -> float:
        import psutil

        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            return sum(sum(p.cpu_times()[:2]) for p in procs)
        except psutil.Error:
            return self.cpu

    def alive(self) -> bool:
        """False once the process is gone, or has not used the CPU for `stall` seconds."""
        import psutil

        # (a zombie is not done: a process whose main thread has ended shows as one while its other
        # threads still run, and cannot be reaped until they end)
        try:
            if self.proc is None or not self.proc.is_running():
                return False
        except psutil.NoSuchProcess:
            return False
        cpu = self._cpu()
        if cpu > self.cpu + 0.05:
            self.cpu, self.since = cpu, time.monotonic()
        return time.monotonic() - self.since < self.stall


def wait_working(what, pid: int, stall: float = 120.0, every: float = 0.25):
    """`what()` once it is truthy, or None once process `pid` has ended or stalled (see Progress)."""
    progress = Progress(pid, stall)
    while True:
        got = what()
        if got:
            return got
        if not progress.alive():
            return what() or None
        time.sleep(every)


def wait_exit(proc: subprocess.Popen, stall: float = 120.0) -> int:
    """The exit code of `proc`, waited for while it keeps working (killed if it stalls)."""
    if proc.poll() is not None:
        return proc.returncode
    t0 = time.monotonic()
    if wait_working(lambda: proc.poll() is not None, proc.pid, stall, 0.1) is None:
        state = _state(proc.pid)
        proc.send_signal(signal.SIGUSR1)  # specdeck prints every thread's stack (app/cli.py), for the log
        time.sleep(1)
        proc.kill()
        raise AssertionError(f"process {proc.pid} did not exit: {time.monotonic() - t0:.0f} s, {state}")
    return proc.wait()


def _state(pid: int) -> str:
    import psutil

    try:
        p = psutil.Process(pid)
        return f"status {p.status()}, cpu {p.cpu_times()}"
    except psutil.Error as e:
        return f"{type(e).__name__}"


class LiveServer:
    """A real uvicorn server in a thread, over a real engine."""

    def __init__(self, target, draft, settings: ServeSettings, parallel=2, ctx=1024, embedding=None,
                 chat_template: str | None = None, mmproj=None):
        t, d = read_model_info(target), read_model_info(draft) if draft else None
        e = read_model_info(embedding) if embedding else None
        self.plan = make_plan(t, d, PlanRequest(ctx=ctx, ctx_is_user_choice=True, parallel=parallel, draft_max=4), detect(),
                              ctx, e, projector=read_projector(mmproj) if mmproj else None)
        m = ModelStart("tiny", self.plan, t, d, e, chat_template, mmproj, tuple(settings.model_aliases))
        # started as serve starts: the fleet (of one) and its front, the model loaded as a start loads it
        self.fleet, self.app = open_fleet([m], settings, Start(), 1)
        self.fleet.start()
        why = load_at_start(self.fleet, self.fleet.stopping)
        assert why is None, why
        self.fleet.ready = True
        member = self.fleet.first
        self.service, self.loaded = member.service, member.loaded
        self.settings = member.app.state.settings  # the running server's own (a test may change a setting the routes read)
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
        close_fleet(self.fleet)


class Serve:
    """`specdeck serve` as a user starts it, its output kept."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.p = subprocess.Popen([*SPECDECK, "serve", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.p.stdout.readline, "")), daemon=True)
        self.reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_line(self, text: str, stall: float = 120) -> bool:
        """Whether `text` appears in the output while the server keeps working (see Progress)."""
        wait_working(lambda: text in self.output or self.p.poll() is not None, self.p.pid, stall)
        return text in self.output

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return wait_exit(self.p)
        except AssertionError as e:  # with the server's own last words (a stuck one prints its threads' stacks)
            self.reader.join(5)
            raise AssertionError(f"{e}\n{self.output[-6000:]}") from None
        finally:
            self.p.kill()
            self.reader.join(5)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (openssl)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key
