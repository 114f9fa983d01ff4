"""Live figures for /v1/status and the dashboard: the scheduler reports every step and every
finished request here (from its worker thread); `snapshot()` reads them under a lock.

Windows: acceptance, tokens per step and draft length over the last `window` seconds; tokens/s
per `bucket` seconds over the last `history` seconds (the dashboard's sparkline).
"""

from __future__ import annotations

import collections
import threading
import time

import psutil

from app.engine.drafters.adaptive import head_key
from app.engine.drafters.mtp import MtpDrafter
from app.engine.records import RequestRecord, StepRecord

HEAD = MtpDrafter.name  # a step's drafter when the target's MTP head drafted it
TTFT_WINDOW = 60.0  # seconds of finished requests the TTFT percentiles are taken over


def drafter_key(rec: StepRecord) -> str:
    """Whose draft a step verified: the drafter's name; the MTP head's with its depth band
    ("mtp@4k"), as the adaptive drafter measures it."""
    if rec.drafter == HEAD:
        return head_key(HEAD, MtpDrafter.depth_bands, sum(rec.depth >= b for b in MtpDrafter.depth_bands))
    return rec.drafter


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0-1) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


class LiveStats:
    def __init__(self, window: float = 30.0, bucket: float = 5.0, history: float = 300.0, clock=time.monotonic) -> None:
        self.window, self.bucket, self.history, self.clock = window, bucket, history, clock
        self.lock = threading.Lock()
        self.started = clock()
        # t, tokens, drafted, accepted, k, whose draft (drafter_key)
        self.steps: collections.deque[tuple[float, int, int, int, int, str]] = collections.deque()
        self.buckets: collections.OrderedDict[int, int] = collections.OrderedDict()  # bucket index -> tokens
        self.slot_last: dict[int, dict] = {}
        # each slot's steps in the window: t, tokens, drafted, accepted, whether the MTP head drafted
        self.slot_steps: dict[int, collections.deque[tuple[float, int, int, int, bool]]] = {}
        self.requests = 0
        self.last: dict | None = None  # the last finished request's timings
        self.ttfts: collections.deque[float] = collections.deque(maxlen=32)
        self.ttft_times: collections.deque[tuple[float, float]] = collections.deque()  # (when finished, ttft) in TTFT_WINDOW
        # time between tokens: the gap between a slot's steps in one answer (a step may bring several tokens)
        self.slot_step_at: dict[int, float] = {}
        self.gaps: collections.deque[tuple[float, float]] = collections.deque()  # (t, seconds since the slot's previous step)
        # running counts since the start: the monitor's rates are their differences
        self.counts = {"generated": 0, "decodes": 0, "drafted": 0, "accepted": 0, "prompt_evaluated": 0}
        self.prompt_tps: collections.deque[float] = collections.deque(maxlen=32)
        self._cpu_prev: tuple | None = None
        self._cpu_last: float | None = None

    # -- reported by the scheduler's worker ---------------------------------------------------

    def step(self, rec: StepRecord) -> None:
        now = self.clock()
        with self.lock:
            self.steps.append((now, len(rec.tokens), rec.drafted, rec.accepted, rec.k, drafter_key(rec)))
            b = int((now - self.started) // self.bucket)
            self.buckets[b] = self.buckets.get(b, 0) + len(rec.tokens)
            self.slot_last[rec.slot] = {"k": rec.k, "drafter": rec.drafter, "drafted": rec.drafted, "accepted": rec.accepted}
            self.slot_steps.setdefault(rec.slot, collections.deque()).append(
                (now, len(rec.tokens), rec.drafted, rec.accepted, rec.drafter == HEAD))
            if rec.slot in self.slot_step_at:
                self.gaps.append((now, now - self.slot_step_at[rec.slot]))
            if rec.finish_reason is None:
                self.slot_step_at[rec.slot] = now
            else:
                self.slot_step_at.pop(rec.slot, None)
            c = self.counts
            c["generated"] += len(rec.tokens)
            c["decodes"] += 1
            c["drafted"] += rec.drafted
            c["accepted"] += rec.accepted
            self._prune(now)

    def prompt(self, n: int) -> None:
        """`n` more prompt tokens evaluated (a chunk of a prompt being read)."""
        with self.lock:
            self.counts["prompt_evaluated"] += n

    def done(self, rec: RequestRecord) -> None:
        with self.lock:
            self.requests += 1
            self.ttfts.append(rec.ttft)
            self.ttft_times.append((self.clock(), rec.ttft))
            if rec.prompt_tps:
                self.prompt_tps.append(rec.prompt_tps)
            self.last = {"ttft_s": rec.ttft, "prompt_tokens_per_second": rec.prompt_tps,
                         "tokens_per_second": rec.generation_tps, "completion_tokens": len(rec.completion),
                         "acceptance": rec.acceptance, "tokens_per_step": rec.tokens_per_decode,
                         "finish_reason": rec.finish_reason}

    def _prune(self, now: float) -> None:
        while self.steps and now - self.steps[0][0] > self.window:
            self.steps.popleft()
        while self.gaps and now - self.gaps[0][0] > self.window:
            self.gaps.popleft()
        while self.ttft_times and now - self.ttft_times[0][0] > TTFT_WINDOW:
            self.ttft_times.popleft()
        for steps in self.slot_steps.values():
            while steps and now - steps[0][0] > self.window:
                steps.popleft()
        oldest = int((now - self.started - self.history) // self.bucket)
        while self.buckets and next(iter(self.buckets)) < oldest:
            self.buckets.popitem(last=False)

    # -- read by /v1/status -------------------------------------------------------------------

    def cpu_percent(self) -> float | None:
        """Host CPU use since the previous reading at least a second ago (readers do not reset each other)."""
        now, times = self.clock(), psutil.cpu_times()
        with self.lock:
            prev = self._cpu_prev
            if prev is None or now - prev[0] >= 1.0:
                if prev is not None:
                    busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)
                    total = sum(times) - sum(prev[1])
                    self._cpu_last = max(0.0, min(100.0, 100.0 * (busy(times) - busy(prev[1])) / total)) if total > 0 else None
                self._cpu_prev = (now, times)
            return self._cpu_last

    def slot(self, slot_id: int) -> dict:
        """The slot's last step, and over the window: tokens per target decode (every step is one
        decode), and the MTP head's acceptance on the steps it drafted (None where it drafted none)."""
        with self.lock:
            self._prune(self.clock())
            steps = list(self.slot_steps.get(slot_id, ()))
            last = dict(self.slot_last.get(slot_id, {}))
        head = [s for s in steps if s[4]]
        drafted = sum(s[2] for s in head)
        return {**last, "recent_tokens_per_decode": sum(s[1] for s in steps) / len(steps) if steps else None,
                "recent_head_acceptance": sum(s[3] for s in head) / drafted if drafted else None,
                "recent_head_drafted": drafted}

    def snapshot(self) -> dict:
        now = self.clock()
        with self.lock:
            self._prune(now)
            steps = list(self.steps)
            current = int((now - self.started) // self.bucket)
            n = int(self.history // self.bucket)
            # whole buckets only: the current one is still filling
            spark = [self.buckets.get(b, 0) / self.bucket for b in range(current - n, current) if b >= 0]
            ttfts, ptps, last, requests = list(self.ttfts), list(self.prompt_tps), self.last, self.requests
            recent_ttfts = [x for _, x in self.ttft_times]
            counts = dict(self.counts)
            gaps = [g for _, g in self.gaps]
        tokens = sum(s[1] for s in steps)
        drafted = sum(s[2] for s in steps)
        accepted = sum(s[3] for s in steps)
        spec = [s for s in steps if s[4] > 0]
        return {
            "uptime_s": now - self.started,
            "window_s": self.window,
            "requests_done": requests,
            "recent_acceptance": accepted / drafted if drafted else None,
            "recent_tokens_per_step": tokens / len(steps) if steps else None,
            "recent_draft_length": drafted / len(steps) if steps else None,  # tokens drafted per step, 0 = plain
            "recent_draft_cap": sum(s[4] for s in spec) / len(spec) if spec else None,  # k asked for, where drafting
            "ttft_s_mean": sum(ttfts) / len(ttfts) if ttfts else None,
            "ttft_window_s": TTFT_WINDOW,
            "ttft_s_p50": percentile(recent_ttfts, 0.50),
            "ttft_s_p95": percentile(recent_ttfts, 0.95),
            "drafters": by_drafter(steps),
            "tbt_s_p50": percentile(gaps, 0.50),  # time between tokens: between an answer's steps, last `window_s`
            "tbt_s_p95": percentile(gaps, 0.95),
            "counts": counts,
            "prompt_tokens_per_second_mean": sum(ptps) / len(ptps) if ptps else None,
            "last_request": last,
            "history": {"bucket_s": self.bucket, "tokens_per_second": spark},
        }


def by_drafter(steps: list[tuple[float, int, int, int, int, str]]) -> dict[str, dict]:
    """Each drafter's steps in the window (those it drafted for): acceptance (accepted / drafted) and
    mean accepted length (tokens a verify of its draft kept, the target's own token included: vLLM's
    mean acceptance length)."""
    out: dict[str, dict] = {}
    for _, _, drafted, accepted, _, key in steps:
        if not drafted:
            continue
        d = out.setdefault(key, {"steps": 0, "drafted": 0, "accepted": 0})
        d["steps"] += 1
        d["drafted"] += drafted
        d["accepted"] += accepted
    for d in out.values():
        d["acceptance"] = d["accepted"] / d["drafted"]
        d["mean_accepted_length"] = 1 + d["accepted"] / d["steps"]
    return out
