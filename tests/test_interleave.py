"""Prompts as coding agents send them, through the scheduler with tiny models: a long prompt's
evaluation goes a chunk at a time between other slots' work, a client that goes away stops it at the
next chunk (what it evaluated stays reusable), a prompt the pool cannot hold yet waits for room
instead of being refused, and a prefix shared with a busy slot is counted once."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from support.live import wait_for

from app.engine.engine import Engine, Request, SpecParams
from app.llama.context import Context, Model
from app.llama.params import ModelParams
from app.server.scheduler import Done, Failed, Job, Progress, Scheduler

PLAIN = SpecParams(enabled=False)
LOOP = asyncio.new_event_loop()  # never run: the jobs below keep their events themselves


def params(n_ctx: int, ubatch: int = 32) -> ModelParams:
    return ModelParams(n_ctx, 512, ubatch, 2, True, "f16", "f16", True, False, 0, 0)


def prompt(n: int, salt: int = 0) -> list[int]:
    return [1] + [260 + (i * 7 + salt) % 60 for i in range(n - 1)]


@dataclass
class Client(Job):
    """A job that keeps what the scheduler sends it, in order, in a log all clients share."""

    name: str = ""
    log: list = field(default_factory=list)
    cancel_at: int | None = None  # goes away once the prompt's progress reaches this many tokens

    def send(self, event) -> None:
        self.log.append((self.name, event))
        if isinstance(event, Progress) and self.cancel_at is not None and event.processed >= self.cancel_at:
            self.cancel()


def client(name: str, log: list, p: list[int], max_tokens: int, **kw) -> Client:
    return Client(Request(prompt=p, max_tokens=max_tokens, speculative=PLAIN), LOOP, time.monotonic() + 600,
                  name=name, log=log, **kw)


def scheduler(tiny, n_ctx: int, on_step=None) -> Scheduler:
    return Scheduler(Engine(Context(Model(tiny.target), params(n_ctx), 2), None, 2), max_queue=4, on_step=on_step)


def finished(log: list, name: str) -> bool:
    return any(n == name and isinstance(e, (Done, Failed)) for n, e in log)


def order(log: list) -> list[tuple[str, str]]:
    """(client, what) in the order sent: "first" for a job's first token, "done", "failed"."""
    out, seen = [], set()
    for name, e in log:
        if isinstance(e, Done):
            out.append((name, "done"))
        elif isinstance(e, Failed):
            out.append((name, "failed"))
        elif not isinstance(e, Progress) and name not in seen:
            seen.add(name)
            out.append((name, "first"))
    return out


def test_a_short_prompt_is_answered_while_a_long_one_is_still_being_evaluated(tiny):
    """Both queued at once: the long prompt takes 60 chunks, the short one one chunk, so the short
    answer is whole long before the long prompt's first token (evaluated whole first, it would wait
    behind all 60)."""
    log: list = []
    sched = scheduler(tiny, 4096)
    long, short = client("long", log, prompt(1900), 4, progress=True), client("short", log, prompt(12, 5), 4)
    sched.submit(long)
    sched.submit(short)
    sched.start()
    assert wait_for(lambda: finished(log, "long") and finished(log, "short"), 60, 0.01)
    sched.stop(10)
    steps = order(log)
    assert steps.index(("short", "done")) < steps.index(("long", "first")), steps
    progress = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)]
    assert progress == sorted(progress) and progress[:2] == [0, 32] and progress[-1] == 1900 and len(progress) == 61
    assert isinstance(log[-1][1], Done) and [n for n, e in log if isinstance(e, Done)] == ["short", "long"]


def test_a_client_gone_mid_prompt_frees_its_slot_at_the_next_chunk_and_its_retry_reuses_what_was_evaluated(tiny):
    log: list = []
    sched = scheduler(tiny, 4096)
    p = prompt(1500)
    sched.submit(client("gone", log, p, 4, progress=True, cancel_at=320))
    sched.start()
    assert wait_for(lambda: finished(log, "gone"), 60, 0.01)
    failed = log[-1][1]
    assert isinstance(failed, Failed) and failed.status == 499
    assert max(e.processed for n, e in log if isinstance(e, Progress)) == 320  # not one chunk more
    assert wait_for(lambda: sched.busy_slots() == 0, 5, 0.01)
    assert [s.cached for s in sched.engine.slots if s.cached] == [p[:320]]  # a prefix to reuse

    sched.submit(client("retry", log, p, 4))
    assert wait_for(lambda: finished(log, "retry"), 60, 0.01)
    sched.stop(10)
    done = log[-1][1]
    assert isinstance(done, Done) and done.record.reused_tokens == 320 and len(done.record.completion) == 4


def test_a_prompt_the_pool_cannot_hold_yet_waits_for_room_instead_of_being_refused(tiny):
    """A 1,024-cell pool: while "first" holds 600 prompt tokens and its answer, "second" (500 other
    tokens) cannot start; it waits at the head of the queue and starts once "first" ends."""
    log: list = []
    sched = scheduler(tiny, 1024)
    sched.submit(client("first", log, prompt(600), 150))
    sched.submit(client("second", log, prompt(500, 11), 4))
    sched.start()
    assert wait_for(lambda: finished(log, "first") and finished(log, "second"), 60, 0.01)
    sched.stop(10)
    assert order(log) == [("first", "first"), ("first", "done"), ("second", "first"), ("second", "done")]
    assert not any(isinstance(e, Failed) for n, e in log)


def test_a_prefix_shared_with_a_busy_slot_counts_once_so_the_resent_prompt_starts_at_once(tiny):
    """A 1,024-cell pool: "agent" generates after its 600-token prompt; the same prompt resent with 20
    tokens more while it still generates shares those 600 cells (nothing copied) and needs only its
    own 20 and its answer's: it starts at once and ends first. Counted twice (1,220 cells), it would
    have had to wait for the first to end."""
    log: list = []
    p = prompt(600)
    sched: Scheduler | None = None
    resent = client("resent", log, p + prompt(21, 3)[1:], 4)
    submitted = threading.Event()

    def on_step(rec) -> None:  # the agent's first token is out: the prompt comes again
        if not submitted.is_set():
            submitted.set()
            sched.submit(resent)

    sched = scheduler(tiny, 1024, on_step=on_step)
    sched.submit(client("agent", log, p, 200))
    sched.start()
    assert wait_for(lambda: finished(log, "agent") and finished(log, "resent"), 60, 0.01)
    sched.stop(10)
    steps = order(log)
    assert steps.index(("resent", "done")) < steps.index(("agent", "done")), steps
    done = next(e for n, e in log if n == "resent" and isinstance(e, Done))
    assert done.record.reused_tokens == 600
