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

from app.engine.drafters.mtp import MtpDrafter
from app.engine.records import RequestRecord, StepRecord

HEAD = MtpDrafter.name  # a step's drafter when the target's MTP head drafted it


class LiveStats:
    def __init__(self, window: float = 30.0, bucket: float = 5.0, history: float = 300.0, clock=time.monotonic) -> None:
        self.window, self.bucket, self.history, self.clock = window, bucket, history, clock
        self.lock = threading.Lock()
        self.started = clock()
        self.steps: collections.deque[tuple[float, int, int, int, int]] = collections.deque()  # t, tokens, drafted, accepted, k
        self.buckets: collections.OrderedDict[int, int] = collections.OrderedDict()  # bucket index -> tokens
        self.slot_last: dict[int, dict] = {}
        # each slot's steps in the window: t, tokens, drafted, accepted, whether the MTP head drafted
        self.slot_steps: dict[int, collections.deque[tuple[float, int, int, int, bool]]] = {}
        self.requests = 0
        self.last: dict | None = None  # the last finished request's timings
        self.ttfts: collections.deque[float] = collections.deque(maxlen=32)
        self.prompt_tps: collections.deque[float] = collections.deque(maxlen=32)
        self._cpu_prev: tuple | None = None
        self._cpu_last: float | None = None

    # -- reported by the scheduler's worker ---------------------------------------------------

    def step(self, rec: StepRecord) -> None:
        now = self.clock()
        with self.lock:
            self.steps.append((now, len(rec.tokens), rec.drafted, rec.accepted, rec.k))
            b = int((now - self.started) // self.bucket)
            self.buckets[b] = self.buckets.get(b, 0) + len(rec.tokens)
            self.slot_last[rec.slot] = {"k": rec.k, "drafter": rec.drafter, "drafted": rec.drafted, "accepted": rec.accepted}
            self.slot_steps.setdefault(rec.slot, collections.deque()).append(
                (now, len(rec.tokens), rec.drafted, rec.accepted, rec.drafter == HEAD))
            self._prune(now)

    def done(self, rec: RequestRecord) -> None:
        with self.lock:
            self.requests += 1
            self.ttfts.append(rec.ttft)
            if rec.prompt_tps:
                self.prompt_tps.append(rec.prompt_tps)
            self.last = {"ttft_s": rec.ttft, "prompt_tokens_per_second": rec.prompt_tps,
                         "tokens_per_second": rec.generation_tps, "completion_tokens": len(rec.completion),
                         "acceptance": rec.acceptance, "tokens_per_step": rec.tokens_per_decode,
                         "finish_reason": rec.finish_reason}

    def _prune(self, now: float) -> None:
        while self.steps and now - self.steps[0][0] > self.window:
            self.steps.popleft()
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
            "prompt_tokens_per_second_mean": sum(ptps) / len(ptps) if ptps else None,
            "last_request": last,
            "history": {"bucket_s": self.bucket, "tokens_per_second": spark},
        }
