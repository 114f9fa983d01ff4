"""Live readings of a server while checks run against it: peak memory, GPU heat and power, restarts,
from its /v1/status."""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from app.ops.client import Client


class Sampler:
    """Reads /v1/status every `period` seconds: peak RSS and VRAM, GPU temperature and power, uptime
    (a drop means the server restarted)."""

    def __init__(self, client: Client, period: float = 0.5) -> None:
        self.client, self.period = client, period
        self.samples: list[dict] = []
        self.restarts = 0
        self.lock = threading.Lock()  # one reading at a time, so uptimes arrive in order
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="validate-sampler", daemon=True)

    def read(self) -> None:
        """One reading now (the thread takes one every `period` seconds)."""
        with self.lock:
            self._read_locked()

    def _read_locked(self) -> None:
        try:
            r = self.client.http.get("/v1/status", timeout=10)
            s = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            s = None
        if s is None:
            return
        gpu = (s.get("gpu") or [None])[0] or {}
        sample = {"t": time.monotonic(), "rss": s.get("host", {}).get("rss"), "uptime": s.get("uptime_s"),
                  "vram": gpu["total"] - gpu["free"] if gpu.get("total") else None,
                  "temperature": gpu.get("temperature_c"), "power": gpu.get("power_w"),
                  "power_limit": gpu.get("power_limit_w"), "slowdown": gpu.get("temperature_slowdown_c")}
        if self.samples and sample["uptime"] is not None and self.samples[-1]["uptime"] is not None \
                and sample["uptime"] < self.samples[-1]["uptime"]:
            self.restarts += 1
        self.samples.append(sample)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(self.period)

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(15)
        self.read()

    def peak(self, key: str, since: float = 0.0) -> float | None:
        values = [s[key] for s in self.samples if s["t"] >= since and s.get(key) is not None]
        return max(values) if values else None

    def rss_trend(self, since: float) -> float | None:
        """Resident memory's slope, MiB per minute (least squares) since `since`."""
        pts = [(s["t"], s["rss"]) for s in self.samples if s["t"] >= since and s.get("rss")]
        if len(pts) < 3:
            return None
        slope = statistics.linear_regression([t for t, _ in pts], [r for _, r in pts]).slope
        return slope * 60 / 2**20
