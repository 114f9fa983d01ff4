"""systemd's notify protocol, without libsystemd: READY=1 once the models are loaded, STATUS=
lines, and WATCHDOG=1 pings while the server answers its own /health and the engine's worker
thread is alive. Outside systemd (no NOTIFY_SOCKET) every call is a no-op.

Why a watchdog and not only ExecStartPost polling: a poll at start proves the server came up once;
the watchdog keeps proving it (the HTTP loop answers, the worker thread lives) for the life of the
service, and systemd restarts it when the pings stop (Restart=on-failure covers watchdog kills).
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable


def notify(message: str) -> bool:
    """Send one datagram to $NOTIFY_SOCKET; False outside systemd or if it cannot be reached."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)  # a reader that stopped reading must never stall the server
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError:
        return False


def watchdog_period() -> float | None:
    """Seconds between pings (half of WatchdogSec), or None when systemd asks for none."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    return max(int(usec) / 1e6 / 2, 0.1)


def health_ok(url: str, timeout: float, headers: dict | None = None) -> int | None:
    """The HTTP status of GET url, or None if nothing answered (the server's own certificate is not
    verified: it is itself, on loopback)."""
    import ssl

    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout, context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def start_watchdog(health_url: str, headers: dict, worker_alive: Callable[[], bool],
                   stop: threading.Event) -> threading.Thread | None:
    """Ping systemd while /health answers (503 'loading' counts until ready) and the worker lives."""
    period = watchdog_period()
    if period is None:
        return None

    def loop() -> None:
        while not stop.wait(period):
            code = health_ok(health_url, timeout=period / 2, headers=headers)
            if code == 200 and worker_alive() or code == 503:
                notify("WATCHDOG=1")

    t = threading.Thread(target=loop, name="specdeck-watchdog", daemon=True)
    t.start()
    return t
