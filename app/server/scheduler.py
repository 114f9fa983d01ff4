"""One worker thread owns the engine. HTTP handlers only enqueue jobs and read their events.

Each loop: take queued jobs into free slots (`pick_slot`: the one whose cache gives the most of the
prompt, so coding tools that resend the same file reuse it; else the one used longest ago, so the
caches of other recent prompts stay for their next turn), then run one batched step for
every active slot, then hand each slot's step record to its job. A cancelled job (client gone, stop
string seen, time limit) frees its slot at the next step boundary, where the cache is consistent.

Stopping (`wind_down`, then `stop`): queued jobs fail with 503, a prompt being evaluated stops at its
next chunk (503), running answers end at their next step with finish reason "shutdown", and `stop`
returns only once the worker has left llama.cpp, so the contexts can be freed after it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from dataclasses import dataclass, field

from app.engine.engine import Engine, Interrupted, PoolBusy, Request, Slot
from app.engine.kv import common_prefix
from app.engine.records import RequestRecord, StepRecord
from app.errors import SpecdeckError
from app.llama.context import DecodeError


class QueueFull(SpecdeckError):
    pass


class ShuttingDown(SpecdeckError):
    pass


SHUTTING_DOWN = "the server is shutting down; retry once it is back"


def pick_slot(free: list[Slot], prompt: list[int], last_used: dict[int, float], min_shared: int = 64,
              owner: str = "") -> Slot:
    """The free slot for a prompt. A slot's cache is taken when it holds all of the prompt that slot
    last served (the same prompt resent, a conversation going on), or at least half of this prompt
    and `min_shared` tokens (a file edited past its middle); of those, the one that holds most.
    Otherwise an empty slot, else the one used longest ago: an editor's completions and its chat
    each keep their cache, and a system prompt in common does not evict a conversation. Only the
    caches of the same owner (API key) count. (In a unified cache the engine still shares any long
    prefix across slots, see Engine._donor.)"""
    def holds(s: Slot) -> int:
        if s.owner != owner:
            return 0
        n = common_prefix(s.cached, prompt)
        served = s.record.prompt_tokens if s.record is not None else len(s.cached)  # its cache: that prompt, then the answer
        return n if n and (n >= served or (2 * n >= len(prompt) and n >= min_shared)) else 0

    best = max(free, key=holds)
    if holds(best):
        return best
    return min(free, key=lambda s: (len(s.cached) > 0, last_used.get(s.id, 0.0)))


@dataclass
class Done:
    record: RequestRecord


@dataclass
class Failed:
    message: str
    status: int = 500


@dataclass
class Job:
    request: Request
    loop: asyncio.AbstractEventLoop
    deadline: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    cancelled: threading.Event = field(default_factory=threading.Event)
    slot: Slot | None = None
    enqueued: float = field(default_factory=time.monotonic)
    t_first: float = 0.0  # when the first token was ready
    # only the end matters (a whole answer, no stop strings to watch): no event per step, so the
    # event loop sleeps while the engine works (on a small CPU it shares cores with llama.cpp)
    quiet: bool = False
    usage: object | None = None  # the HTTP request's audit.Usage: finished() adds this job's tokens

    def send(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutting down): nobody is left to tell
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int = 16, on_step=None, on_done=None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.queue: collections.deque[Job] = collections.deque()
        self.active: dict[int, Job] = {}  # slot id -> the job generating there
        self.starting: dict[int, Job] = {}  # slot id -> the job whose prompt is being evaluated there
        self.cv = threading.Condition()
        self.running = False
        self.thread: threading.Thread | None = None
        self.on_step = on_step or (lambda rec: None)
        self.on_done = on_done or (lambda job, rec: None)
        self.recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=512)  # (time, tokens)
        self.last_used: dict[int, float] = {}  # slot id -> when its last request ended
        self.stopping = False  # set by wind_down: nothing new starts, what runs ends at its next step

    # -- API for handlers ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self.cv:
            if self.stopping:
                raise ShuttingDown(SHUTTING_DOWN)
            if len(self.queue) >= self.max_queue:
                raise QueueFull("the request queue is full")
            self.queue.append(job)
            self.cv.notify()

    def queue_depth(self) -> int:
        return len(self.queue)

    def busy_slots(self) -> int:
        return len(self.active) + len(self.starting)

    def start(self) -> None:
        self.running = True
        self.thread = threading.Thread(target=self._run, name="specdeck-engine", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 300.0) -> bool:
        """Wind down at once and wait for the worker to leave the engine (at most one prompt chunk or
        one step). Returns False if it is still inside llama.cpp after `timeout`: then nothing may
        free the contexts."""
        self.wind_down()
        with self.cv:
            self.running = False
            self.cv.notify()
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def wind_down(self) -> None:
        """Shutting down: queued jobs fail with 503 now; a prompt being evaluated stops at its next
        chunk (503); running answers end at their next step (finish "shutdown"), so open streams
        close within a step."""
        with self.cv:
            self.stopping = True
            self.engine.halt.set()
            for job in list(self.queue):
                job.send(Failed(SHUTTING_DOWN, 503))
            self.queue.clear()
            self.cv.notify()

    # -- the worker ------------------------------------------------------------------------

    def _free_slots(self) -> list[Slot]:
        return [s for s in self.engine.slots if s.id not in self.active and s.id not in self.starting]

    def _admit(self) -> None:
        while True:
            with self.cv:
                free = self._free_slots()
                if not self.queue or not free:
                    return
                job = self.queue.popleft()
            if job.cancelled.is_set():
                continue
            slot = pick_slot(free, job.request.prompt, self.last_used, owner=job.request.owner)
            self.starting[slot.id] = job  # busy while its prompt is evaluated (/health, balancers)
            try:
                rec = self.engine.start(slot, job.request, job.cancelled.is_set)
            except Exception as e:  # noqa: BLE001 - a failed request must not stop the server
                job.send(self._refusal(e))
                continue
            finally:
                self.starting.pop(slot.id, None)
            job.slot = slot
            job.t_first = time.perf_counter()
            self.active[slot.id] = job
            self._deliver(job, rec)

    def _refusal(self, e: Exception) -> Failed:
        """What a request whose prompt could not be started is told."""
        if isinstance(e, Interrupted):  # the server is stopping, or the client went away mid-prompt
            return Failed(SHUTTING_DOWN, 503) if self.stopping else Failed("client closed the request", 499)
        if isinstance(e, PoolBusy):
            return Failed(f"the server is busy: {e.message}", 429)
        if isinstance(e, DecodeError):  # llama.cpp refused the prompt (out of memory): not the client's fault
            return Failed(f"the prompt could not be evaluated: {e.message}; retry later", 503)
        if isinstance(e, SpecdeckError):
            return Failed(e.message, 400)
        return Failed(f"{type(e).__name__}: {e}")

    def _deliver(self, job: Job, rec: StepRecord) -> None:
        self.recent.append((time.monotonic(), len(rec.tokens)))
        self.on_step(rec)
        if not job.quiet:
            job.send(rec)
        if rec.finish_reason is not None:
            self._close(job, rec.finish_reason)

    def _close(self, job: Job, reason: str) -> None:
        slot = job.slot
        assert slot is not None and slot.record is not None
        slot.record.t_generate = time.perf_counter() - job.t_first
        record = self.engine.finish(slot, reason)
        self.active.pop(slot.id, None)
        self.last_used[slot.id] = time.monotonic()
        self.on_done(job, record)
        job.send(Done(record))

    def _run(self) -> None:
        while True:
            with self.cv:
                while self.running and not self.queue and not self.active:
                    self.cv.wait(0.5)
                if not self.running and not self.active:
                    return
            self._admit()
            now = time.monotonic()
            for job in list(self.active.values()):
                if self.stopping:
                    self._close(job, "shutdown")
                elif job.cancelled.is_set():
                    self._close(job, "cancelled")
                elif now > job.deadline:
                    self._close(job, "time_limit")
            if not self.active:
                continue
            jobs = list(self.active.values())
            try:
                records = self.engine.step([j.slot for j in jobs])
            except DecodeError as e:  # llama.cpp refused the batch (KV pool full, out of memory): fail these, go on
                for j in jobs:
                    j.send(Failed(f"generation stopped: {e.message}; retry later or with a shorter request", 503))
                    self._close(j, "error")
                continue
            except Exception as e:  # noqa: BLE001 - a failed step must not stop the server
                for j in jobs:
                    j.send(Failed(f"generation failed: {e}"))
                    self._close(j, "error")
                continue
            by_slot = {r.slot: r for r in records}
            for j in jobs:
                self._deliver(j, by_slot[j.slot.id])
