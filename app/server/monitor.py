"""The monitor's sampler: once a second, every loaded model's status snapshot (the very dict
/v1/status answers, made by `status_json`) and the machine's readings become one row of the
history (app/monitor/), whether or not a page is open. The page reads it through /ui/api/series
and /ui/api/live."""

from __future__ import annotations

import logging
import math
import threading
import time

from app.monitor.figures import machine_point, model_point
from app.monitor.history import History
from app.plan.hardware import read_gpus
from app.server.core import machine_json, status_json

log = logging.getLogger("specdeck.server")
PERIOD = 1.0  # seconds between rows


def open_history(fleet, gpus: int) -> History:
    """A ring for the fleet's models (their slots from their plans) and `gpus` GPUs."""
    return History({m.name: m.start.plan.parallel for m in fleet.members.values()}, gpus)


class Sampler:
    """Writes a row every PERIOD seconds, on whole seconds of the wall clock, in its own thread."""

    def __init__(self, fleet, history: History) -> None:
        self.fleet, self.history = fleet, history
        self.prev: dict[str, tuple[dict, float]] = {}  # model -> (its running counts, when read): the rates' base
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specdeck-monitor", daemon=True)

    def start(self) -> None:
        """From now on every token counts: the first row's rates run from here."""
        mono = time.monotonic()
        self.prev = {m.name: (m.service.stats.snapshot()["counts"], mono) for m in self.fleet.members.values()}
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(math.floor(time.time()) + PERIOD - time.time()):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a bad reading costs one row, never the server
                log.exception("specdeck: the monitor's reading failed")

    def tick(self) -> None:
        now, mono = time.time(), time.monotonic()
        machine, points = None, {}
        for m in self.fleet.members.values():
            svc = m.service
            if not svc.ready or svc.scheduler is None:  # its counts go on from here when it is loaded again
                points[m.name] = {"loaded": 0.0}
                self.prev[m.name] = (svc.stats.snapshot()["counts"], mono)
                continue
            status = status_json(svc, m.app.state.metrics)
            prev = self.prev.get(m.name)
            points[m.name] = model_point(status, prev[0] if prev else None, mono - prev[1] if prev else 0.0)
            self.prev[m.name] = (status["counts"], mono)
            machine = machine or status
        if machine is None:  # nothing loaded: the machine is still read
            machine = machine_json(read_gpus(), self.fleet.first.service.stats.cpu_percent())
        self.history.add(now, machine_point(machine), points)
