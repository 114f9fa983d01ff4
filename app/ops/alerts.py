"""Alerts: each a state (active or not, since when, the figure that raised it) decided from the
server's figures. `AlertBook.update(observation)` is pure bookkeeping over plain numbers, so every
rule can be raised and cleared from injected figures; the server feeds it real ones (see
app/server/watch.py) and deploy/prometheus/alerts.yml states the same rules in PromQL.

    acceptance_low       share of drafted tokens kept over the window < threshold, or < baseline - margin
    vram_high            GPU memory used > watermark x total, or > the plan x (1 + margin)
    error_rate_high      failed requests (4xx/5xx but 429) / requests over the window > threshold
    queue_saturated      queue depth >= saturation x the queue limit, or a 429 within the window
    gpu_temperature_high GPU temperature >= the card's slowdown temperature - margin
    gpu_power_high       GPU power >= fraction x the card's enforced power limit
    rss_growth           resident memory beyond what the bounded caches hold (saved prompts, the suffix
                         index: designed growth) grew by more than a fraction of the resident memory
                         one RSS window ago (judged once the server has run a whole window, as
                         PromQL's `offset` does: the first requests fault in the KV cache, no leak)
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SLOWDOWN_C = 83.0  # where a card does not report its slowdown temperature

NAMES = ("acceptance_low", "vram_high", "error_rate_high", "queue_saturated", "gpu_temperature_high",
         "gpu_power_high", "rss_growth")


CONFIG_ONLY = {"flag": False}  # a threshold set in the config file's [alerts] table or SPECDECK_ALERT_*, not a flag


class AlertSettings(BaseSettings):
    """Alert thresholds: defaults, then the config file's [alerts] table, then SPECDECK_ALERT_*, then flags."""

    model_config = SettingsConfigDict(env_prefix="SPECDECK_ALERT_", extra="forbid")

    window: float = Field(60.0, gt=0,
        description="seconds over which acceptance and the error rate are taken", json_schema_extra=CONFIG_ONLY)
    interval: float = Field(5.0, gt=0,
        description="seconds between alert checks in the server", json_schema_extra=CONFIG_ONLY)
    acceptance_min: float = Field(0.30, ge=0, le=1, description="alert when acceptance over the window is below this")
    acceptance_margin: float = Field(0.15, ge=0, le=1,
        description="... or this far below the saved baseline's", json_schema_extra=CONFIG_ONLY)
    acceptance_min_drafted: int = Field(64, ge=1,
        description="drafted tokens in the window before acceptance is judged", json_schema_extra=CONFIG_ONLY)
    vram_watermark: float = Field(0.95, gt=0, le=1, description="alert when GPU memory used exceeds this share of the total")
    vram_plan_margin: float = Field(0.10, ge=0,
        description="... or exceeds the plan by this share", json_schema_extra=CONFIG_ONLY)
    error_rate: float = Field(0.25, gt=0, le=1, description="alert when this share of requests in the window fail")
    error_min_requests: int = Field(8, ge=1,
        description="requests in the window before the error rate is judged", json_schema_extra=CONFIG_ONLY)
    queue_saturation: float = Field(1.0, gt=0, le=1,
        description="alert when the queue holds this share of --max-queue", json_schema_extra=CONFIG_ONLY)
    gpu_temperature_margin: float = Field(5.0, ge=0,
        description="alert this many degrees C below the card's slowdown temperature", json_schema_extra=CONFIG_ONLY)
    gpu_power: float = Field(0.98, gt=0, le=1.5,
        description="alert at this share of the card's enforced power limit", json_schema_extra=CONFIG_ONLY)
    rss_growth: float = Field(0.25, gt=0, description="alert when resident memory beyond the bounded caches grows by this share over the RSS window")
    rss_window: float = Field(600.0, gt=0,
        description="seconds over which RSS growth is taken", json_schema_extra=CONFIG_ONLY)


@dataclass
class Observation:
    """One reading of the server's figures. Counters are cumulative; None: not known here."""

    t: float
    drafted: int = 0  # drafted tokens so far
    accepted: int = 0  # of them, kept by the target
    baseline_acceptance: float | None = None
    vram_used: int | None = None
    vram_total: int | None = None
    vram_planned: int | None = None
    requests: int = 0  # all requests answered so far
    failed: int = 0  # of them, 4xx/5xx except 429
    rejected: int = 0  # of them, 429 (queue full)
    queue_depth: int = 0
    queue_limit: int | None = None
    gpu_temperature: float | None = None
    gpu_slowdown: float | None = None
    gpu_power: float | None = None
    gpu_power_limit: float | None = None
    rss: int | None = None
    cached: int | None = None  # of it, what the bounded host caches hold (saved prompts, suffix index)


@dataclass
class AlertState:
    name: str
    active: bool = False
    since: float | None = None  # wall-clock time (epoch seconds) of the last transition
    value: float | None = None  # the figure that raised it
    threshold: float | None = None
    message: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "active": self.active, "since": self.since, "value": self.value,
                "threshold": self.threshold, "message": self.message}


@dataclass
class _Verdict:
    active: bool
    value: float | None = None
    threshold: float | None = None
    message: str = ""


@dataclass
class AlertBook:
    settings: AlertSettings
    wall: object = time.time  # the clock for `since`
    states: dict[str, AlertState] = field(default_factory=lambda: {n: AlertState(n) for n in NAMES})
    _history: collections.deque = field(default_factory=collections.deque)

    def update(self, obs: Observation) -> list[AlertState]:
        """Judge every rule on this reading; returns the alerts that changed state."""
        self._history.append(obs)
        keep = max(self.settings.window, self.settings.rss_window)
        # the oldest reading kept is the latest one at least `keep` old (the RSS window's reference)
        while len(self._history) > 1 and obs.t - self._history[1].t >= keep:
            self._history.popleft()
        changed = []
        for name in NAMES:
            verdict: _Verdict = getattr(self, "_" + name)(obs)
            state = self.states[name]
            state.value, state.threshold = verdict.value, verdict.threshold
            if verdict.active != state.active:
                state.active, state.since = verdict.active, self.wall()
                changed.append(state)
            if verdict.active:
                state.message = verdict.message
        return changed

    def active(self) -> list[AlertState]:
        return [s for s in self.states.values() if s.active]

    def to_json(self) -> list[dict]:
        return [s.to_json() for s in self.states.values()]

    # -- the rules -------------------------------------------------------------------------------

    def _oldest(self, obs: Observation, span: float) -> Observation:
        """The earliest reading within `span` seconds of `obs`."""
        return next(o for o in self._history if obs.t - o.t <= span)

    def _at_or_before(self, t: float) -> Observation | None:
        """The latest reading at or before time `t` (None: the history starts after it)."""
        found = None
        for o in self._history:
            if o.t > t:
                break
            found = o
        return found

    def _acceptance_low(self, obs: Observation) -> _Verdict:
        s = self.settings
        then = self._oldest(obs, s.window)
        drafted = obs.drafted - then.drafted if then is not obs else 0
        if drafted < s.acceptance_min_drafted:
            return _Verdict(False)
        acceptance = (obs.accepted - then.accepted) / drafted
        floor = s.acceptance_min
        if obs.baseline_acceptance is not None:
            floor = max(floor, obs.baseline_acceptance - s.acceptance_margin)
        return _Verdict(acceptance < floor, acceptance, floor,
                        f"acceptance {acceptance:.2f} over the last {s.window:.0f} s ({drafted} drafted), below {floor:.2f}")

    def _vram_high(self, obs: Observation) -> _Verdict:
        s = self.settings
        if obs.vram_used is None or not obs.vram_total:
            return _Verdict(False)
        limit = s.vram_watermark * obs.vram_total
        if obs.vram_planned:
            limit = min(limit, obs.vram_planned * (1 + s.vram_plan_margin))
        gib = 2**30
        return _Verdict(obs.vram_used > limit, obs.vram_used, limit,
                        f"GPU memory {obs.vram_used / gib:.2f} GiB in use, over {limit / gib:.2f} GiB "
                        f"(of {obs.vram_total / gib:.2f} GiB{', plan ' + format(obs.vram_planned / gib, '.2f') + ' GiB' if obs.vram_planned else ''})")

    def _error_rate_high(self, obs: Observation) -> _Verdict:
        s = self.settings
        then = self._oldest(obs, s.window)
        n = obs.requests - then.requests if then is not obs else 0
        if n < s.error_min_requests:
            return _Verdict(False)
        rate = (obs.failed - then.failed) / n
        return _Verdict(rate > s.error_rate, rate, s.error_rate,
                        f"{rate:.0%} of {n} requests failed in the last {s.window:.0f} s")

    def _queue_saturated(self, obs: Observation) -> _Verdict:
        s = self.settings
        then = self._oldest(obs, s.window)
        refused = obs.rejected - then.rejected
        full = obs.queue_limit is not None and obs.queue_limit > 0 and obs.queue_depth >= s.queue_saturation * obs.queue_limit
        return _Verdict(full or refused > 0, float(obs.queue_depth), obs.queue_limit,
                        f"queue {obs.queue_depth} of {obs.queue_limit}, {refused} request(s) refused (429) "
                        f"in the last {s.window:.0f} s")

    def _gpu_temperature_high(self, obs: Observation) -> _Verdict:
        if obs.gpu_temperature is None:
            return _Verdict(False)
        limit = (obs.gpu_slowdown or DEFAULT_SLOWDOWN_C) - self.settings.gpu_temperature_margin
        return _Verdict(obs.gpu_temperature >= limit, obs.gpu_temperature, limit,
                        f"GPU at {obs.gpu_temperature:.0f} °C, at or over {limit:.0f} °C "
                        f"(slowdown {obs.gpu_slowdown or DEFAULT_SLOWDOWN_C:.0f} °C)")

    def _gpu_power_high(self, obs: Observation) -> _Verdict:
        if obs.gpu_power is None or not obs.gpu_power_limit:
            return _Verdict(False)
        limit = self.settings.gpu_power * obs.gpu_power_limit
        return _Verdict(obs.gpu_power >= limit, obs.gpu_power, limit,
                        f"GPU drawing {obs.gpu_power:.0f} W of its {obs.gpu_power_limit:.0f} W limit")

    def _rss_growth(self, obs: Observation) -> _Verdict:
        s = self.settings
        if obs.rss is None:
            return _Verdict(False)
        then = self._at_or_before(obs.t - s.rss_window)
        if then is None or then.rss is None or then.rss <= 0:  # not a whole window yet
            return _Verdict(False)
        cached, cached_then = obs.cached or 0, then.cached or 0
        growth = ((obs.rss - cached) - (then.rss - cached_then)) / then.rss
        caches = (f"; the caches {cached_then / 2**20:,.0f} -> {cached / 2**20:,.0f} MiB, not counted"
                  if cached or cached_then else "")
        return _Verdict(growth > s.rss_growth, growth, s.rss_growth,
                        f"resident memory grew {growth:.0%} in {obs.t - then.t:.0f} s "
                        f"({then.rss / 2**20:,.0f} -> {obs.rss / 2**20:,.0f} MiB{caches})")
