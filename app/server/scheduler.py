"""One worker thread owns the engine. HTTP handlers only enqueue jobs and read their events.

Each loop, as llama-server's continuous batching does:
- admit: queued jobs take free slots (`pick_slot`: the one whose cache gives the most of the prompt,
  so coding tools that resend the same file reuse it; else the one used longest ago, so the caches of
  other recent prompts stay for their next turn). A job whose prompt the pool cannot hold while the
  requests in flight hold theirs waits at the head of the queue until they end (never refused for it).
- prefill: while no slot generates, every prompt being evaluated gets one chunk, so a short prompt
  is not held behind a long one: a slice of about PREFILL_SLICE seconds (at the measured rate, 64
  tokens to n_ubatch), except that where several prompts wait the one with the fewest tokens left
  gets n_ubatch tokens. A request that comes while a chunk is computed does not wait for it: the
  chunk gives way part way (llama.cpp's abort callback; where its cells can be taken back: not on a
  model with recurrent state or a sliding window), the newcomer's prompt goes first, and the prompt's
  next chunk runs whole (so it advances however often requests come) and short (RESUME_SLICE: a
  second request of a burst waits little for it). While answers stream, decode
  goes first (Sarathi-Serve's stall-free batching, done here between steps): the prompt with the
  fewest tokens left gets the time the answers may lose, credited step by step: `tbt_budget` times
  the step's cost alone less what it took (a step beside a prompt costs more where its attention
  spans the prompt's cells, as with flash attention off: the cost model learns from steps with no
  prompt being read, and what a step takes beyond its figure is charged to the prompt), and
  PROMPT_FLOOR of the step's time at least, so the prompt advances however dear it makes them. Its
  chunk is sized to cost about CHUNK_STEPS steps from what its last chunk cost (each prompt its
  own: a short prompt at depth 0 is cheap per token, a long one at 16K is not), and runs once the
  steps have earned its cost (a chunk of a few tokens costs about a step on a CPU, where it reads
  every weight as a step does: chunks of several steps keep the prompt's evaluation efficient). A
  prompt whose rest fits one chunk goes at once. On average the answers' time between tokens stays
  within `tbt_budget` of their time alone (where the prompt's cells leave room for the floor), and
  the prompt advances at (tbt_budget - 1) / tbt_budget of the engine's time meanwhile,
  PROMPT_FLOOR / (1 + PROMPT_FLOOR) at least.
  Where a step's verify decode costs little more with prompt tokens in it (a card, or a model whose
  decode is memory-bound: it reads every weight for a few tokens or a hundred), those tokens go in
  it instead (`mixed` "auto": one mixed step is tried, and kept while it costs under MIX_GAIN of a
  step plus those tokens at the chunks' rate; its tokens sized so the step stays within the budget
  at the cost per token it measured). Speculation goes on: the drafts are verified in that batch.
  `tbt_budget` 0: prompts first (the slices above between steps). A job cancelled (client gone,
  time limit, the server stopping) stops between chunks, its evaluated part kept as a reusable
  prefix;
- step: one batched step for every slot that is generating, each slot's record handed to its job.
A cancelled job frees its slot at the next boundary, where the cache is consistent.

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
from collections.abc import Callable
from dataclasses import dataclass, field

from app.engine.engine import Engine, Interrupted, PoolBusy, Prefill, Request, Slot
from app.engine.kv import common_prefix
from app.engine.records import RequestRecord, StepRecord
from app.errors import SpecdeckError
from app.llama.context import DecodeAborted, DecodeError


class QueueFull(SpecdeckError):
    pass


class ShuttingDown(SpecdeckError):
    pass


SHUTTING_DOWN = "the server is shutting down; retry once it is back"
PREFILL_SLICE = 0.5  # seconds of prompt evaluation per loop for a prompt sharing the engine with others
TBT_BUDGET = 1.5  # while a prompt is read, answers' time between tokens may grow to this multiple of their time alone
CHUNK_STEPS = 4  # a prompt's chunk beside answers costs about this many steps (the credit spreads it)
PROMPT_FLOOR = 0.25  # beside answers a prompt gets this share of their steps' time at least (a fifth of the engine's), however dear its cells make them
MIX_GAIN = 0.8  # a mixed batch is kept where it costs at most this share of its parts (the step, the tokens' chunk cost)
PROBE_EVERY = 32  # beside answers, chunks between two tries of a mixed batch where the last one did not pay
RESUME_SLICE = 0.125  # seconds: the chunk after one that gave way (it runs whole) costs about this, so a request that comes meanwhile waits little
RESUME_MIN = 16  # tokens: that chunk's floor (the prompt advances at least this much between two that give way)
SLICE_MIN = 64  # tokens: smaller chunks cost more per token on a CPU (32: 6% more than 512 here; 64: the same)


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


def toward(n: int, want: float, cap: int | None = None) -> int:
    """The next size of a chunk of n tokens whose cost says `want`: moved at most 2x a time, 1 to cap."""
    m = max(1, int(min(2 * n, max(n / 2, want))))
    return min(m, cap) if cap else m


@dataclass
class Done:
    record: RequestRecord


@dataclass
class Failed:
    message: str
    status: int = 500


@dataclass
class Progress:
    """The prompt's evaluation so far (llama-server's `prompt_progress`): sent after each chunk to a
    job that asked for it."""

    total: int  # the prompt's tokens
    cache: int  # of them, reused from a cache
    processed: int  # of them, in the cache now (reused ones included)
    time_ms: float  # since the evaluation began
    eval_ms: float  # of it, evaluating

    @classmethod
    def of(cls, p: Prefill) -> Progress:
        return cls(p.total, p.reused, p.done, (time.perf_counter() - p.t0) * 1e3, p.t_eval * 1e3)


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
    progress: bool = False  # send a Progress event after each chunk of the prompt
    prefill: Prefill | None = None  # the prompt's evaluation, while it runs
    chunk: int = 0  # tokens of its prompt's next chunk beside answers (sized to the budget; 0: not yet measured)
    ride: int = 0  # tokens of its prompt in the answers' next step (a mixed batch; 0: not yet measured)
    chunk_s: float = 0.0  # what that chunk should cost, at its last chunk's cost per token
    gave_way: bool = False  # its prompt's last chunk stopped part way for a newcomer: the next runs whole, and short
    usage: object | None = None  # the HTTP request's audit.Usage: finished() adds this job's tokens

    def whereabouts(self) -> str:
        """Where the job is: "queue", "prompt 4,096 of 20,480" (being evaluated), or "answer"."""
        p = self.prefill
        if p is not None:
            return f"prompt {p.done:,} of {p.total:,}"
        return "answer" if self.slot is not None else "queue"

    def send(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutting down): nobody is left to tell
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int = 16, on_step=None, on_done=None, on_prompt=None,
                 tbt_budget: float = TBT_BUDGET, mixed: str = "auto") -> None:
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
        self.on_prompt = on_prompt or (lambda n: None)  # prompt tokens evaluated by a chunk
        self.recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=512)  # (time, tokens)
        self.last_used: dict[int, float] = {}  # slot id -> when its last request ended
        self.stopping = False  # set by wind_down: nothing new starts, what runs ends at its next step
        self.eval_rate: float | None = None  # seconds per prompt token, as the last chunk took
        self.tbt_budget = tbt_budget  # answers' time between tokens beside a prompt, times their time alone (0: prompts first)
        self.step_time: float | None = None  # a decode step's seconds (moving average)
        self.credit = 0.0  # seconds of prompt evaluation the answers' steps have allowed and no chunk has used
        self.mixed = mixed  # "auto": a prompt's tokens ride in the answers' steps where that measured cheaper; "on", "off"
        self.mix_pays: bool | None = None  # did the last mixed step cost under MIX_GAIN of its parts (None: not tried)
        self.since_probe = 0  # chunks beside answers since the last mixed step
        self.submitted = 0  # jobs ever queued (a chunk gives way to those that came since it began)
        self.chunks_given_way = 0  # prompt chunks stopped part way (a request came, a job cancelled)

    # -- API for handlers ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self.cv:
            if self.stopping:
                raise ShuttingDown(SHUTTING_DOWN)
            if len(self.queue) >= self.max_queue:
                raise QueueFull(f"{len(self.queue)} requests are queued, the most --max-queue allows")
            self.queue.append(job)
            self.submitted += 1
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
        """Queued jobs into free slots, in order, each with its prompt's evaluation begun."""
        while True:
            with self.cv:
                free = self._free_slots()
                if not self.queue or not free:
                    return
                job = self.queue.popleft()
            if job.cancelled.is_set():
                job.send(Failed("client closed the request", 499))
                continue
            if time.monotonic() > job.deadline:
                job.send(Failed("the request ran past its time limit waiting in the queue", 503))
                continue
            slot = pick_slot(free, job.request.prompt, self.last_used, owner=job.request.owner)
            if not self.engine.cache.fits(slot, job.request) and self.busy_slots():
                self._wait(job)  # the requests in flight hold the pool: first in line once they end
                return
            try:
                job.prefill = self.engine.begin(slot, job.request)
            except PoolBusy as e:
                if not self.busy_slots():  # nothing in flight will give the pool back
                    job.send(self._refusal(e))
                    continue
                self._wait(job)
                return
            except Exception as e:  # noqa: BLE001 - a failed request must not stop the server
                job.send(self._refusal(e))
                continue
            job.slot = slot
            self.starting[slot.id] = job  # busy while its prompt is evaluated (/health, balancers)
            if job.progress:  # llama-server's first report: before any token is evaluated
                job.send(Progress.of(job.prefill))

    def _wait(self, job: Job) -> None:
        with self.cv:
            if self.stopping:
                job.send(Failed(SHUTTING_DOWN, 503))
            else:
                self.queue.appendleft(job)

    def _decode_first(self) -> bool:
        """Answers are streaming and the budget is on: the prompts get only the time it allows."""
        return self.tbt_budget > 0 and bool(self.active) and self.step_time is not None

    def _prefill(self) -> None:
        """One chunk of every prompt being evaluated, fewest tokens left first (beside answers: of
        the first, and only when the steps have earned its time); a prompt whose job was cancelled,
        or ran out of time, or whose server stops, stops here with what it evaluated kept."""
        jobs = sorted(self.starting.values(), key=lambda j: j.prefill.left)
        for i, job in enumerate(jobs):
            p = job.prefill
            assert p is not None and job.slot is not None
            if self.stopping or job.cancelled.is_set() or time.monotonic() > job.deadline:
                self._stop_prefill(job, self.engine.abandon(p))
                continue
            beside = self._decode_first()  # asked for each: a prompt finished just before starts an answer
            if beside and (i > 0 or self._rider()[0] is job or (self.credit < self._chunk_cost(job) and p.left > self._budget_chunk(job))):
                continue  # the answers' next step first, or it carries this prompt (a prompt whose rest is one chunk goes: its answer starts)
            done, t = p.done, time.perf_counter()
            n = self._budget_chunk(job) if beside else self._chunk(ahead=i == 0 and len(jobs) > 1 and not self.active)
            resumed = job.gave_way
            if resumed:
                n = min(n, self._resume_chunk())
            try:
                rec = self.engine.advance(p, n, give_way=None if resumed else self._give_way(job))
            except DecodeAborted:
                self._gave_way(job, beside, time.perf_counter() - t)
                continue
            except Exception as e:  # noqa: BLE001 - a failed request must not stop the server
                self._stop_prefill(job, e)
                continue
            job.gave_way = False
            took = time.perf_counter() - t
            if beside:
                self.credit -= took
                self.since_probe += 1
                if not resumed:  # a short chunk after giving way says little of what a chunk of its size costs
                    self._size_chunk(job, p.done - done, took)
            else:
                self.credit = 0.0  # no answer waits on this chunk: the credit counts within one stretch of answers
            if p.done > done:
                self._note_rate(p.done - done, took)
                self.on_prompt(p.done - done)
            if job.progress:
                job.send(Progress.of(p))
            if rec is not None:
                self._started(job, rec)

    def _note_rate(self, tokens: int, took: float) -> None:
        """The prompt tokens' rate, from a chunk of SLICE_MIN tokens or more (or the first, where none
        was measured): a few tokens cost about a step, and taken as a rate they would make a mixed
        batch look as if it paid."""
        if tokens >= SLICE_MIN or self.eval_rate is None:
            self.eval_rate = took / tokens

    def _give_way(self, job: Job) -> Callable[[], bool]:
        """What stops a prompt's chunk part way: a request that came since it began, with a slot free
        to start in (its prompt then waits for no chunk of this one), or this job cancelled, or the
        server stopping. Asked by llama.cpp between the graph's nodes, from this thread."""
        seen, free = self.submitted, bool(self._free_slots())

        def ask() -> bool:
            return (free and self.submitted > seen and bool(self.queue)) or job.cancelled.is_set() or self.stopping
        return ask

    def _gave_way(self, job: Job, beside: bool, took: float) -> None:
        """A chunk stopped part way: its work is lost (the answers' credit pays for the time beside
        them); the prompt's next chunk runs to its end, so a prompt advances however often requests come."""
        job.gave_way = True
        self.chunks_given_way += 1
        if beside:
            self.credit -= took

    def _resume_chunk(self) -> int:
        """Tokens of the chunk after one that gave way: it runs whole, so the prompt advances however
        often requests come, and costs about RESUME_SLICE at the measured rate (RESUME_MIN tokens at
        least), so a request that comes while it runs (a second one of a burst) waits little for it."""
        return self._slice_tokens(RESUME_SLICE, RESUME_MIN)

    def _started(self, job: Job, rec: StepRecord) -> None:
        """A prompt is in: its job generates from now on, its first token delivered."""
        self.starting.pop(job.slot.id, None)
        job.prefill = None
        job.t_first = time.perf_counter()
        self.active[job.slot.id] = job
        self._deliver(job, rec)

    def _chunk(self, ahead: bool) -> int:
        """Tokens of a prompt to evaluate this loop: n_ubatch for the one with fewest tokens left while
        others wait behind it and no slot generates, else about PREFILL_SLICE seconds' worth (a prompt
        alone, too: where its chunk cannot give way, a request that comes meanwhile waits no longer
        than that; on a card that is n_ubatch anyway, and on a CPU a slice of 64 tokens or more costs
        the same per token)."""
        full = self.engine.target.params.n_ubatch
        return full if ahead else self._slice_tokens(PREFILL_SLICE, SLICE_MIN)

    def _slice_tokens(self, seconds: float, least: int) -> int:
        """Tokens of a chunk that costs about `seconds` at the measured rate: `least` at least (and
        where nothing was measured yet), n_ubatch at most."""
        full = self.engine.target.params.n_ubatch
        least = min(least, full)
        if self.eval_rate is None:
            return least
        return max(least, min(full, int(seconds / self.eval_rate)))

    def _chunk_time(self) -> float:
        """What a chunk beside answers should cost: CHUNK_STEPS steps' time. A chunk of a few tokens
        costs about a step on a CPU (it reads every weight, as a step does): one of several steps'
        time is mostly prompt, and the credit spreads it over the steps that earn it."""
        return CHUNK_STEPS * (self.step_time or 0.0)

    def _budget_chunk(self, job: Job) -> int:
        """Tokens of a prompt's chunk beside answers: sized from what its last one cost, or, for its
        first, from the last chunk's rate (one token where nothing was measured yet)."""
        if job.chunk:
            return job.chunk
        return max(1, min(self.engine.target.params.n_ubatch, int(self._chunk_time() / self.eval_rate))) if self.eval_rate else 1

    def _size_chunk(self, job: Job, n: int, took: float) -> None:
        """The next chunk: as many tokens as its cost target holds at this chunk's cost (a chunk's cost
        grows with its tokens, so this settles where a chunk costs the target), moved at most 2x a time."""
        target = self._chunk_time()
        if n <= 0 or took <= 0 or target <= 0:
            return
        job.chunk = toward(n, n * target / took, self.engine.target.params.n_ubatch)
        job.chunk_s = took / n * job.chunk

    def _chunk_cost(self, job: Job) -> float:
        """What the prompt's next chunk beside answers should cost: at its last chunk's cost per
        token, else the target. It runs once the answers' steps have earned that much (so an answer
        of a few steps is not charged a chunk it did not earn)."""
        return job.chunk_s or self._chunk_time()

    def _rider(self) -> tuple[Job | None, int]:
        """The prompt whose next tokens go in the answers' next step (a mixed batch), and how many may:
        the one with the fewest tokens left, beside answers, where the engine can carry its next
        tokens, and, with `mixed` "auto", where the last mixed step cost under MIX_GAIN of its parts
        (tried once first, and again every PROBE_EVERY chunks where it did not pay: the costs move
        with the depth). (None, 0): none."""
        if self.mixed == "off" or not self.starting or not self._decode_first():
            return None, 0
        job = min(self.starting.values(), key=lambda j: j.prefill.left)
        if self.mixed == "auto" and (self.eval_rate is None or (self.mix_pays is False and self.since_probe < PROBE_EVERY)):
            return None, 0
        room = self.engine.rider_room([j.slot for j in self.active.values()], job.prefill)
        return (job, room) if room > 0 else (None, 0)

    def _ride_tokens(self, job: Job, room: int) -> int:
        """Tokens of the rider's prompt in this step: sized from what the last mixed step cost, or for
        the first, what the budget allows where costs add ((B - 1) steps' time at the chunks' rate)."""
        n = job.ride
        if not n and self.eval_rate:
            n = int((self.tbt_budget - 1) * (self.step_time or 0.0) / self.eval_rate)
        return max(1, min(n, room))

    def _measure_ride(self, job: Job, n: int, took: float, alone: float | None) -> None:
        """A mixed step's cost against its parts (the step alone, the tokens at the chunks' rate), and
        the next one's tokens: as many as keep the step within the budget at this step's cost per
        token beyond the step alone (moved at most 2x a time). `alone`: what this step would have cost
        unmixed (its drafting and its verify's size at the measured costs); the steps' moving average
        only where there is none: while every step carries the prompt it is not updated, and one of
        an answer's 9-token verifies is no measure of a completion's 1-token steps (with it, the
        completion's steps beside a 16K prompt rode to 3.4 x their cost alone)."""
        step = alone or self.step_time or took
        if self.eval_rate:
            self.mix_pays = took <= MIX_GAIN * (step + n * self.eval_rate)
        self.since_probe = 0
        extra, allowed = took - step, (self.tbt_budget - 1) * step
        job.ride = toward(n, n * allowed / extra if extra > 0 else 2 * n)
        self.on_prompt(n)
        if job.progress:
            job.send(Progress.of(job.prefill))

    def _stop_prefill(self, job: Job, e: Exception) -> None:
        self.starting.pop(job.slot.id, None)
        job.prefill = None
        self.last_used[job.slot.id] = time.monotonic()
        if isinstance(e, Interrupted) and not self.stopping and not job.cancelled.is_set():
            job.send(Failed(f"the request ran past its time limit while its prompt was evaluated ({e.message})", 503))
        else:
            job.send(self._refusal(e))

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
                while self.running and not self.queue and not self.active and not self.starting:
                    self.cv.wait(0.5)
                if not self.running and not self.active and not self.starting:
                    return
            self._admit()
            self._prefill()
            self._end_cancelled()
            if self.active:
                self._step()

    def _end_cancelled(self) -> None:
        now = time.monotonic()
        for job in list(self.active.values()):
            if self.stopping:
                self._close(job, "shutdown")
            elif job.cancelled.is_set():
                self._close(job, "cancelled")
            elif now > job.deadline:
                self._close(job, "time_limit")

    def _step(self) -> None:
        """One step of the answers, carrying a prompt's next tokens where `_rider` says so."""
        jobs = list(self.active.values())
        rider, room = self._rider()
        n = self._ride_tokens(rider, room) if rider is not None else 0
        done = rider.prefill.done if rider is not None else 0
        t = time.perf_counter()
        try:
            records = self.engine.step([j.slot for j in jobs], (rider.prefill, n) if rider is not None else None)
        except DecodeError as e:  # llama.cpp refused the batch (KV pool full, out of memory): fail these, go on
            self._failed_step(jobs, rider, e, f"generation stopped: {e.message}; retry later or with a shorter request", 503)
            return
        except Exception as e:  # noqa: BLE001 - a failed step must not stop the server
            self._failed_step(jobs, rider, e, f"generation failed: {e}", 500)
            return
        took = time.perf_counter() - t
        if rider is not None and rider.prefill.done > done:
            self._measure_ride(rider, rider.prefill.done - done, took, self.engine.unmixed_cost(records))
            self._ridden(rider)
        else:
            self._stepped(took, self.engine.excess_cost(records))
        by_slot = {r.slot: r for r in records}
        for j in jobs:
            self._deliver(j, by_slot[j.slot.id])

    def _ridden(self, job: Job) -> None:
        """The rider's prompt after the step that carried it: its answer starts once it is all in."""
        try:
            rec = self.engine.ridden(job.prefill)
        except Exception as e:  # noqa: BLE001 - a failed request must not stop the server
            self._stop_prefill(job, e)
            return
        if rec is not None:
            self._started(job, rec)

    def _failed_step(self, jobs: list[Job], rider: Job | None, e: Exception, message: str, status: int) -> None:
        """A step failed: its answers end, and the prompt it carried (its slot free, its cache as before)."""
        for j in jobs:
            j.send(Failed(message, status))
            self._close(j, "error")
        if rider is not None:
            self._stop_prefill(rider, e)

    def _stepped(self, took: float, excess: float) -> None:
        """A step's time: its moving average, and the prompts' credit: what the budget allows beyond the
        step's cost alone (`took` less the `excess` a prompt's cells beside it added), PROMPT_FLOOR of
        the step's time at least (none kept past one chunk's worth once no prompt waits, so a prompt
        that comes later does not get a burst)."""
        self.step_time = took if self.step_time is None else 0.8 * self.step_time + 0.2 * took
        if self.tbt_budget > 0:
            share = max(PROMPT_FLOOR * took, self.tbt_budget * (took - excess) - took)
            self.credit += share
            if not self.starting:
                self.credit = min(self.credit, share)
