"""Prompts as coding agents send them, through the scheduler with tiny models: a long prompt's
evaluation goes a chunk at a time between other slots' work, a client that goes away stops it at the
next chunk (what it evaluated stays reusable), a prompt the pool cannot hold yet waits for room
instead of being refused, and a prefix shared with a busy slot is counted once. Beside answers being
generated, decode goes first: a prompt takes only the time the answers' budget allows (and still
advances), a greedy answer with speculation on is the same beside a prompt as alone, and `tbt_budget`
0 puts prompts first as before."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest
from support.live import wait_for

from app.engine.drafters.model import ModelDrafter
from app.engine.engine import Engine, Request, SpecParams
from app.llama.context import Context, Model
from app.llama.params import ModelParams
from app.server import scheduler as scheduling
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


def scheduler(tiny, n_ctx: int, on_step=None, tbt_budget: float = 1.5, draft: bool = False, mixed: str = "off") -> Scheduler:
    """The tiny pair's scheduler; decode first between steps unless `mixed` says otherwise (a tiny
    model's mixed batch costs about its verify alone, so "auto" would mix everywhere)."""
    drafter = ModelDrafter(Context(Model(tiny.draft), params(n_ctx), 2)) if draft else None
    return Scheduler(Engine(Context(Model(tiny.target), params(n_ctx), 2), drafter, 2), max_queue=4, on_step=on_step,
                     tbt_budget=tbt_budget, mixed=mixed)


class Timed:
    """The engine's prompt chunks and steps, each with when it began and what it took (the real
    calls, timed as they pass)."""

    def __init__(self, sched: Scheduler) -> None:
        self.calls: list[tuple[str, float, float]] = []  # (what, began, seconds)
        eng = sched.engine
        for name, what in (("advance", "chunk"), ("step", "step")):
            setattr(eng, name, self._timed(getattr(eng, name), what))

    def _timed(self, call, what: str):
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                self.calls.append((what, t, time.perf_counter() - t))
        return timed

    def between(self, start: float, end: float, what: str) -> list[float]:
        return [d for w, t, d in self.calls if w == what and start <= t < end]


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
    """Both queued at once: the long prompt takes 60 chunks or more (smaller ones beside the short
    answer), the short one one chunk, so the short answer is whole long before the long prompt's first
    token (evaluated whole first, it would wait behind all 60)."""
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
    assert progress == sorted(progress) and progress[:2] == [0, 32] and progress[-1] == 1900
    assert len(progress) >= 61 and all(0 < b - a <= 32 for a, b in zip(progress[1:], progress[2:], strict=False))
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


def test_beside_an_answer_a_prompt_takes_only_the_answers_budget_and_still_advances(tiny):
    """An answer streams; a long prompt comes. While both run, the prompt's chunks take at most
    (tbt_budget - 1) of the steps' time (plus the one chunk that may overdraw), and it advances."""
    log: list = []
    ends: list[float] = []
    sched = scheduler(tiny, 4096, on_step=lambda rec: ends.append(time.perf_counter()) if rec.finish_reason else None)
    timed = Timed(sched)
    sched.submit(client("answer", log, prompt(12, 5), 200))
    sched.start()
    assert wait_for(lambda: any(n == "answer" for n, _ in log), 30, 0.001)
    came = time.perf_counter()
    sched.submit(client("long", log, prompt(1900), 4, progress=True))
    assert wait_for(lambda: finished(log, "answer") and finished(log, "long"), 120, 0.01)
    sched.stop(10)
    assert order(log).index(("answer", "done")) < order(log).index(("long", "first"))
    chunks, steps = timed.between(came, ends[0], "chunk"), timed.between(came, ends[0], "step")
    assert steps and chunks, "the prompt starved while the answer streamed"
    assert sum(chunks) <= 0.5 * sum(steps) + max(chunks) + 0.005, (sum(chunks), sum(steps), max(chunks))
    assert not any(isinstance(e, Failed) for _, e in log)


def test_prompts_first_still_gives_a_prompt_a_slice_between_every_step(tiny):
    """`tbt_budget` 0 (prompts first): every loop gives the prompt a chunk before the answer's step."""
    log: list = []
    ends: list[float] = []
    sched = scheduler(tiny, 4096, tbt_budget=0, on_step=lambda rec: ends.append(time.perf_counter()) if rec.finish_reason else None)
    timed = Timed(sched)
    sched.submit(client("answer", log, prompt(12, 5), 60))
    sched.start()
    assert wait_for(lambda: any(n == "answer" for n, _ in log), 30, 0.001)
    came = time.perf_counter()
    sched.submit(client("long", log, prompt(1900), 4))
    assert wait_for(lambda: finished(log, "answer") and finished(log, "long"), 120, 0.01)
    sched.stop(10)
    chunks, steps = timed.between(came, ends[0], "chunk"), timed.between(came, ends[0], "step")
    assert len(chunks) >= len(steps) - 1  # a chunk (about 0.5 s, or 64 tokens at least) each loop


def test_a_greedy_answer_with_speculation_is_the_same_beside_a_prompt_as_alone(tiny):
    spec = SpecParams(enabled=True, n_max=4)

    def ask(name: str, log: list) -> Client:
        return Client(Request(prompt=prompt(20, 9), max_tokens=80, speculative=spec), LOOP, time.monotonic() + 600,
                      name=name, log=log)

    alone_log: list = []
    sched = scheduler(tiny, 4096, draft=True)
    sched.submit(ask("alone", alone_log))
    sched.start()
    assert wait_for(lambda: finished(alone_log, "alone"), 60, 0.01)
    sched.stop(10)
    alone = next(e for _, e in alone_log if isinstance(e, Done)).record

    log: list = []
    sched = scheduler(tiny, 4096, draft=True)
    timed = Timed(sched)
    sched.submit(client("long", log, prompt(1900), 4, progress=True))
    sched.start()
    assert wait_for(lambda: any(isinstance(e, Progress) and e.processed > 0 for _, e in log), 30, 0.001)
    sched.submit(ask("beside", log))
    assert wait_for(lambda: finished(log, "beside") and finished(log, "long"), 120, 0.01)
    sched.stop(10)
    beside = next(e for n, e in log if n == "beside" and isinstance(e, Done)).record
    assert beside.completion == alone.completion and beside.drafted > 0
    progress = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)]
    first_step = next(t for w, t, _ in timed.calls if w == "step")
    assert any(t > first_step for w, t, _ in timed.calls if w == "chunk")  # the prompt was read beside the answer
    assert progress[-1] == 1900


def long_and_newcomer(tiny, arrive_at: int | None) -> tuple[list, Scheduler]:
    """A 1,200-token prompt ("long") and a short one ("short") through the scheduler, both to their
    8-token answers: "short" submitted from inside the long prompt's chunk once its evaluation reaches
    `arrive_at` tokens (where the scheduler asks whether to give way, so it comes mid-chunk however
    fast the tiny model is), or, with None, right after "long" (the answers alone)."""
    log: list = []
    sched = scheduler(tiny, 4096)
    long, short = client("long", log, prompt(1200, 3), 8, progress=True), client("short", log, prompt(12, 5), 8)
    real, sent = sched._give_way, threading.Event()

    def give_way(job):
        ask = real(job)

        def asked() -> bool:
            if arrive_at is not None and not sent.is_set() and job is long and job.prefill.done >= arrive_at:
                sent.set()
                sched.submit(short)
            return ask()
        return asked
    sched._give_way = give_way
    sched.submit(long)
    if arrive_at is None:
        sched.submit(short)
    sched.start()
    assert wait_for(lambda: finished(log, "long") and finished(log, "short"), 60, 0.01)
    sched.stop(10)
    return log, sched


def test_a_chunk_gives_way_to_a_request_that_comes_while_it_is_computed_and_both_answers_are_as_alone(tiny):
    """A request that comes while a long prompt's chunk is being computed does not wait for that
    chunk: it stops part way (llama.cpp's abort callback, asked between the graph's nodes), the
    newcomer's prompt goes first, and the long prompt goes on from where it was; both greedy answers
    are the same as alone."""
    alone, _ = long_and_newcomer(tiny, None)
    log, sched = long_and_newcomer(tiny, 320)
    assert sched.chunks_given_way == 1
    events = [(n, e.processed if isinstance(e, Progress) else type(e).__name__) for n, e in log]
    after = events[[i for i, (n, x) in enumerate(events) if n == "long" and x == 320][0] + 1:]
    assert after[0][0] == "short", after[:3]  # the newcomer's first token before the long prompt's next chunk
    progress = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)]
    assert progress == sorted(progress) and progress[-1] == 1200
    for name in ("long", "short"):
        want = next(e for n, e in alone if n == name and isinstance(e, Done)).record.completion
        assert next(e for n, e in log if n == name and isinstance(e, Done)).record.completion == want, name


def test_the_chunk_after_one_that_gave_way_runs_short_and_the_next_ones_as_before(tiny, monkeypatch):
    """After a chunk gives way, the long prompt's next chunk runs whole (it cannot give way: the prompt
    advances however often requests come) and short, so the second request of a burst waits little
    for it: RESUME_MIN tokens where RESUME_SLICE buys fewer (set to nothing here: the tiny model is
    fast), then chunks of their size before (n_ubatch here)."""
    monkeypatch.setattr(scheduling, "RESUME_SLICE", 0.0)
    log, sched = long_and_newcomer(tiny, 320)
    assert sched.chunks_given_way == 1
    progress = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)]
    at = progress.index(320)
    assert [b - a for a, b in zip(progress[at:at + 4], progress[at + 1:at + 4])] == [scheduling.RESUME_MIN, 32, 32], progress


def test_a_chunk_that_gives_way_leaves_the_prompt_and_its_cache_where_they_were(tiny):
    from app.llama.context import DecodeAborted

    eng = Engine(Context(Model(tiny.target), params(4096), 2), None, 2)
    req = Request(prompt=prompt(200, 1), max_tokens=4, speculative=PLAIN)
    p = eng.begin(eng.slots[0], req)
    eng.advance(p, 64)
    with pytest.raises(DecodeAborted):
        eng.advance(p, 32, give_way=lambda: True)
    assert p.done == 64 and eng.slots[0].cached == req.prompt[:64]
    assert eng.target.pos_max(0) == 63
    before = eng.target.decodes  # a chunk of three ubatches that gives way in its second: the first goes too
    with pytest.raises(DecodeAborted):
        eng.advance(p, 96, give_way=lambda: eng.target.decodes > before)
    assert eng.target.decodes == before + 2 and p.done == 64 and eng.target.pos_max(0) == 63  # one whole, one stopped
    eng.advance(p, 64, give_way=lambda: False)
    assert p.done == 128


class Rides:
    """The engine's steps that carried a prompt's tokens (a mixed batch): how many tokens each."""

    def __init__(self, sched: Scheduler) -> None:
        self.tokens: list[int] = []
        step = sched.engine.step

        def counted(slots, ride=None):
            if ride is not None:
                self.tokens.append(ride[1])
            return step(slots, ride)

        sched.engine.step = counted


def test_mixed_a_prompt_rides_in_the_answers_steps_and_answers_and_prompt_are_as_alone(tiny):
    """`mixed` "on": the long prompt's tokens go in the answer's verify decodes. The greedy answer, with
    speculation on and its drafts verified in those mixed batches, is the same as alone; so are the
    prompt's own first tokens (its cache, built in mixed batches, is the one a prompt alone builds);
    and the prompt advanced while the answer streamed."""
    spec = SpecParams(enabled=True, n_max=4)

    def ask(name: str, log: list) -> Client:
        return Client(Request(prompt=prompt(20, 9), max_tokens=120, speculative=spec), LOOP, time.monotonic() + 600,
                      name=name, log=log)

    def long(log: list) -> Client:
        return client("long", log, prompt(1200, 3), 6, progress=True)

    alone_log: list = []
    sched = scheduler(tiny, 4096, draft=True)
    sched.submit(ask("alone", alone_log))
    sched.submit(long(alone_log))
    sched.start()
    assert wait_for(lambda: finished(alone_log, "alone") and finished(alone_log, "long"), 60, 0.01)
    sched.stop(10)
    done = {n: e.record for n, e in alone_log if isinstance(e, Done)}

    log: list = []
    sched = scheduler(tiny, 4096, draft=True, mixed="on")
    rides = Rides(sched)
    sched.submit(ask("beside", log))
    sched.start()
    assert wait_for(lambda: any(n == "beside" for n, _ in log), 30, 0.001)
    sched.submit(long(log))
    assert wait_for(lambda: finished(log, "beside") and finished(log, "long"), 120, 0.01)
    sched.stop(10)
    beside = {n: e.record for n, e in log if isinstance(e, Done)}
    assert beside["beside"].completion == done["alone"].completion and beside["beside"].drafted > 0
    assert beside["long"].completion == done["long"].completion
    assert len(rides.tokens) >= 3 and sum(rides.tokens) > 100, rides.tokens  # it rode, and grew past one token
    progress = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)]
    assert progress == sorted(progress) and progress[-1] == 1200
    assert not any(isinstance(e, Failed) for _, e in log)


def test_mixed_a_cancelled_prompt_stops_at_its_next_step_and_the_answer_goes_on(tiny):
    """A prompt riding in the answer's steps whose client goes away stops at the next step's boundary
    (499, what it evaluated kept), and the answer beside it finishes whole."""
    log: list = []
    sched = scheduler(tiny, 4096, mixed="on")
    sched.submit(client("answer", log, prompt(12, 5), 150))
    sched.start()
    assert wait_for(lambda: any(n == "answer" for n, _ in log), 30, 0.001)
    sched.submit(client("long", log, prompt(1900, 4), 4, progress=True, cancel_at=200))
    assert wait_for(lambda: finished(log, "answer") and finished(log, "long"), 120, 0.01)
    sched.stop(10)
    failed = next(e for n, e in log if n == "long" and isinstance(e, Failed))
    assert failed.status == 499
    last = [e.processed for n, e in log if n == "long" and isinstance(e, Progress)][-1]
    assert 200 <= last < 1900
    answer = next(e for n, e in log if n == "answer" and isinstance(e, Done)).record
    assert len(answer.completion) == 150


def test_mixed_auto_keeps_a_mixed_batch_only_where_it_costs_less_than_its_parts():
    """"auto" decides from measured costs: a mixed step at or above its parts (the step alone plus its
    prompt tokens at the chunks' rate) is dropped for decode-first, and tried again PROBE_EVERY chunks
    later; one well under its parts is kept, its next size from its cost beyond the step."""
    from app.server.scheduler import MIX_GAIN

    sched = Scheduler.__new__(Scheduler)
    sched.tbt_budget, sched.step_time, sched.eval_rate, sched.on_prompt = 1.5, 0.04, 0.01, lambda n: None
    job = Client(Request(prompt=[1, 2]), LOOP, 0.0)
    sched._measure_ride(job, 2, 0.04 + 2 * 0.01, None)  # costs added: a CPU with a Q4 target
    assert sched.mix_pays is False
    sched._measure_ride(job, 8, MIX_GAIN * (0.04 + 8 * 0.01) - 0.001, None)
    assert sched.mix_pays is True
    sched._measure_ride(job, 8, 0.045, None)  # 5 ms beyond the step for 8 tokens: the budget's 20 ms holds 32 (at most 2x a time)
    assert sched.mix_pays is True and job.ride == 16


def test_the_prompt_rate_comes_from_whole_chunks_not_a_few_tokens():
    """A chunk of a few tokens (a resent prompt's last token) costs about a step: the rate the mixed
    batch's pay test uses stays the last whole chunk's, or riding would look as if it paid."""
    from app.server.scheduler import SLICE_MIN

    sched = Scheduler.__new__(Scheduler)
    sched.eval_rate = None
    sched._note_rate(3, 0.09)  # the first chunk sets a rate, whatever its size
    assert sched.eval_rate == pytest.approx(0.03)
    sched._note_rate(SLICE_MIN, SLICE_MIN * 0.01)
    assert sched.eval_rate == pytest.approx(0.01)
    sched._note_rate(1, 0.083)  # one token at a step's cost
    assert sched.eval_rate == pytest.approx(0.01)
    sched._note_rate(2 * SLICE_MIN, 2 * SLICE_MIN * 0.012)
    assert sched.eval_rate == pytest.approx(0.012)


def test_a_ride_is_judged_against_its_own_step_not_the_average_of_other_answers_steps():
    """The steps' moving average is not updated while every step carries a prompt, and an answer's
    9-token verifies (0.23 s) are no measure of a completion's 1-token steps (0.13 s): judged against
    them, a mixed step of 0.2 s looked free and its ride doubled each step (beside a 16K prompt the
    completion's steps rode to 3.4 x their cost alone). Against what this step costs alone, the ride
    shrinks to the budget."""
    sched = Scheduler.__new__(Scheduler)
    sched.tbt_budget, sched.step_time, sched.eval_rate, sched.on_prompt = 1.5, 0.23, 0.02, lambda n: None
    job = Client(Request(prompt=[1, 2]), LOOP, 0.0)
    sched._measure_ride(job, 8, 0.2, alone=0.13)  # 0.07 s beyond its step for 8 tokens; the budget allows 0.065
    assert job.ride == 7
    job.ride = 0
    sched._measure_ride(job, 8, 0.2, alone=None)  # no cost model: the average, as before
    assert job.ride == 16


def test_a_steps_cost_alone_is_its_drafting_and_its_verify_at_the_measured_costs():
    from app.engine.controller import Controller, CostModel
    from app.engine.records import StepRecord

    eng = Engine.__new__(Engine)
    eng.costs = Controller(CostModel({1: 0.10, 2: 0.11, 8: 0.20, 16: 0.30}))
    recs = [StepRecord(slot=0, tokens=[5], drafted=0, accepted=0, k=0, drafter="none", t_draft=0.0, t_verify=0.0, t_sample=0.0),
            StepRecord(slot=1, tokens=[5, 6], drafted=6, accepted=1, k=6, drafter="draft", t_draft=0.03, t_verify=0.0, t_sample=0.0)]
    assert eng.unmixed_cost(recs) == pytest.approx(0.03 + 0.20)  # 1 + 7 tokens verified
    assert eng.unmixed_cost([]) is None
    eng.costs = None
    assert eng.unmixed_cost(recs) is None


def test_a_prompt_is_charged_what_its_cells_add_to_a_step_and_still_advances_at_the_floor():
    """A step beside a prompt that costs more than its figure alone (with flash attention off its
    attention spans the prompt's cells): the prompt's credit is the budget beyond the step's cost
    alone, so step and chunks together stay within tbt_budget of the step alone; however dear the
    step, PROMPT_FLOOR of its time."""
    from app.server.scheduler import PROMPT_FLOOR

    sched = Scheduler.__new__(Scheduler)
    sched.tbt_budget, sched.step_time, sched.credit, sched.starting = 1.5, None, 0.0, {1: None}
    sched._stepped(0.10, excess=0.0)  # as alone: half the step
    assert sched.credit == pytest.approx(0.05)
    sched._stepped(0.12, excess=0.02)  # 0.10 alone: the step and its credit 0.15 together
    assert sched.credit == pytest.approx(0.05 + 0.03)
    sched._stepped(0.20, excess=0.10)  # twice its cost alone: the floor
    assert sched.credit == pytest.approx(0.08 + PROMPT_FLOOR * 0.20)


@dataclass
class Told:
    """A cost observer that keeps what the engine tells it (the engine's report is under test)."""

    verifies: list = field(default_factory=list)

    def observe_verify(self, n: int, seconds: float) -> None:
        self.verifies.append(n)

    def verify_cost(self, n: int) -> float:
        return 0.001 * n


def test_the_cost_model_learns_steps_alone_and_not_beside_a_prompt_being_read(tiny):
    """A step's verify beside a prompt being read costs what the prompt's cells add: it is not taken as
    the step's cost alone (the scheduler charges the excess to the prompt against that figure)."""
    told = Told()
    eng = Engine(Context(Model(tiny.target), params(4096), 2), None, 2, costs=told)
    answer = eng.slots[0]
    eng.start(answer, Request(prompt=prompt(12, 5), max_tokens=50, speculative=PLAIN))
    eng.step([answer])
    assert told.verifies == [1]
    p = eng.begin(eng.slots[1], Request(prompt=prompt(300), max_tokens=4, speculative=PLAIN))
    eng.advance(p, 64)
    recs = eng.step([answer])
    assert told.verifies == [1] and eng.reading()
    assert eng.excess_cost(recs) == pytest.approx(max(0.0, recs[0].t_verify - 0.001))
    while eng.advance(p, 64) is None:
        pass
    eng.step([answer, eng.slots[1]])
    assert told.verifies == [1, 2] and not eng.reading()
