"""The server's alert watcher: every `interval` seconds it reads the live figures (the metrics'
counters, the queue, GPU 0 through NVML, the process's RSS) into an Observation, lets the
AlertBook judge them, sets the `specdeck_alert{name}` gauges and logs each transition once."""

from __future__ import annotations

import logging
import threading
import time

import psutil

from app.ops.alerts import AlertBook, AlertSettings, AlertState, Observation
from app.plan.hardware import Gpu, read_gpus
from app.server.metrics import Metrics

log = logging.getLogger("specdeck.server")


def observation(service, metrics: Metrics, gpus: tuple[Gpu, ...], baseline_acceptance: float | None,
                now: float) -> Observation:
    total, failed, rejected = metrics.status_counts()
    reg = metrics.registry
    gpu = gpus[0] if gpus else None
    planned = service.plan.used if service.plan.device == "cuda" else None
    return Observation(
        t=now,
        drafted=int(reg.get_sample_value("specdeck_draft_tokens_total") or 0),
        accepted=int(reg.get_sample_value("specdeck_draft_accepted_total") or 0),
        baseline_acceptance=baseline_acceptance,
        vram_used=gpu.total - gpu.free if gpu else None, vram_total=gpu.total if gpu else None, vram_planned=planned,
        requests=total, failed=failed, rejected=rejected,
        queue_depth=service.scheduler.queue_depth() if service.scheduler else 0,
        queue_limit=service.scheduler.max_queue if service.scheduler else None,
        gpu_temperature=gpu.temperature_c if gpu else None, gpu_slowdown=gpu.temperature_slowdown_c if gpu else None,
        gpu_power=gpu.power_w if gpu else None, gpu_power_limit=gpu.power_limit_w if gpu else None,
        rss=psutil.Process().memory_info().rss,
        cached=service.scheduler.engine.cache.host_bytes() if service.scheduler else None,
    )


def describe(state: AlertState) -> str:
    return f"alert {state.name}: {state.message}" if state.active else f"alert {state.name} cleared"


class AlertWatcher:
    def __init__(self, service, metrics: Metrics, settings: AlertSettings, baseline_acceptance: float | None = None,
                 read=read_gpus, clock=time.monotonic) -> None:
        self.service, self.metrics, self.settings = service, metrics, settings
        self.book = AlertBook(settings)
        self.baseline_acceptance, self.read, self.clock = baseline_acceptance, read, clock
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        for name in self.book.states:
            metrics.alert.labels(name).set(0)

    def check(self, obs: Observation | None = None) -> list[AlertState]:
        """One judgement (of `obs`, or of a fresh reading); returns what changed."""
        with self.lock:
            if obs is None:
                obs = observation(self.service, self.metrics, self.read(), self.baseline_acceptance, self.clock())
            changed = self.book.update(obs)
            for state in self.book.states.values():
                self.metrics.alert.labels(state.name).set(1 if state.active else 0)
        for state in changed:
            (log.warning if state.active else log.info)("specdeck: " + describe(state))
        return changed

    def to_json(self) -> list[dict]:
        with self.lock:
            return self.book.to_json()

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.settings.interval):
                try:
                    self.check()
                except Exception as e:  # noqa: BLE001 - a failed reading must never stop the watcher
                    log.error("specdeck: alert check failed: %s", e)

        self.thread = threading.Thread(target=loop, name="specdeck-alerts", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
