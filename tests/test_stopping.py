"""Stopping as users expect: a prompt's evaluation stops between chunks and keeps what it evaluated;
the scheduler's stop leaves llama.cpp before anything is freed; a real `specdeck serve` stopped at any
moment (a long prompt, a speculative decode, the smoke request) exits 0 with a clean log, and its
clients get a clean end."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import pytest
from conftest import run_cli
from support.live import Serve, free_port, wait_for

from app.engine.drafters.model import ModelDrafter
from app.engine.engine import Engine, Interrupted, Request, SpecParams
from app.llama.context import Context, LoadCancelled, Model
from app.llama.params import ModelParams
from app.server.scheduler import Done, Failed, Job, Scheduler

PLAIN = SpecParams(enabled=False)


def params(n_ctx=1024, ubatch=32):
    return ModelParams(n_ctx, 512, ubatch, 2, True, "f16", "f16", True, False, 0, 0)


def prompt(n: int) -> list[int]:
    return [1] + [260 + (i * 7) % 60 for i in range(n - 1)]


class After:
    """A `cancelled()` that says yes from its n-th call on (the n-th chunk boundary)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls >= self.n


def test_a_prompt_stops_between_chunks_and_what_it_evaluated_is_reused(tiny):
    eng = Engine(Context(Model(tiny.target), params(), 1), None, 2)
    p = prompt(300)
    req = Request(prompt=p, max_tokens=1, speculative=PLAIN)
    with pytest.raises(Interrupted, match="after 64 of 300 tokens"):
        eng.start(eng.slots[0], req, After(3))  # asked before chunks 0, 32, 64: stops at 64
    assert eng.slots[0].cached == p[:64] and eng.target.pos_max(0) == 63
    assert eng.slots[0].request is None  # nothing started: the slot is free
    first = eng.start(eng.slots[0], req)  # the same prompt again: evaluates only what is left
    assert eng.slots[0].record.reused_tokens == 64
    eng.finish(eng.slots[0], "length")
    fresh = Engine(Context(Model(tiny.target), params(), 1), None, 2)
    assert fresh.start(fresh.slots[0], req).tokens == first.tokens  # the kept prefix is the same cache


def test_a_halted_engine_starts_nothing_and_its_drafter_stops_catching_up(tiny):
    tc, dc = Context(Model(tiny.target), params(), 1), Context(Model(tiny.draft), params(), 1)
    eng = Engine(tc, ModelDrafter(dc, halt=None), 2)
    eng.halt.set()
    with pytest.raises(Interrupted, match="after 0 of"):
        eng.start(eng.slots[0], Request(prompt=prompt(100), max_tokens=4, speculative=PLAIN))
    assert eng.slots[0].cached == [] and tc.pos_max(0) == -1

    halt = eng.halt
    d = ModelDrafter(dc, halt=halt)
    assert d.propose(1, prompt(200), 4).tokens == []  # no draft: the catch-up stopped before its first chunk
    assert d.cached[1] == [] and dc.pos_max(1) == -1
    halt.clear()
    assert len(d.propose(1, prompt(200), 4).tokens) == 4 and dc.pos_max(1) == len(d.cached[1]) - 1


def test_loading_stops_when_asked_and_says_so(tiny):
    stop = threading.Event()
    stop.set()
    with pytest.raises(LoadCancelled, match="loading stopped"):
        Model(tiny.target, cancel=stop)
    assert Model(tiny.target, cancel=threading.Event()).ptr  # not set: it loads


def _job(loop, p: list[int], max_tokens: int) -> Job:
    return Job(Request(prompt=p, max_tokens=max_tokens, speculative=PLAIN), loop, time.monotonic() + 600)


def test_the_scheduler_stop_ends_every_job_cleanly_and_leaves_llama_cpp_first(tiny):
    """Queued: 503. Generating: ends at its next step with finish "shutdown". And stop() returns only
    once the worker is out of the engine, so the contexts can be freed after it."""
    loop = asyncio.new_event_loop()
    # a context the running job cannot fill before the stop, however fast this CPU decodes
    eng = Engine(Context(Model(tiny.target), params(n_ctx=16384), 1), None, 1)
    sched = Scheduler(eng, max_queue=4)
    sched.start()
    running, queued = _job(loop, prompt(20), 100_000), _job(loop, prompt(30), 8)
    sched.submit(running)
    assert wait_for(lambda: sched.busy_slots() == 1, 30, 0.01)
    sched.submit(queued)
    assert sched.stop(timeout=60) and not sched.thread.is_alive()
    loop.run_until_complete(asyncio.sleep(0.05))  # deliver what the worker sent

    def last(job: Job):
        items = []
        while not job.events.empty():
            items.append(job.events.get_nowait())
        return items[-1]

    q, r = last(queued), last(running)
    assert isinstance(q, Failed) and q.status == 503 and "shutting down" in q.message
    assert isinstance(r, Done) and r.record.finish_reason == "shutdown" and len(r.record.completion) >= 1
    eng.target.close()  # nothing runs in it any more
    loop.close()


# -- a real `specdeck serve` with the CPU pair, stopped at several moments -----------------------------

def code_prompt(n_lines: int) -> str:
    """A long module of plausible code, as an agent sends a file (~10 tokens a line)."""
    lines = []
    for i in range(n_lines):
        lines.append(f"def handler_{i}(request, limit={i % 17}):\n    return [x * {i} for x in request.items[:limit]]\n")
    return "".join(lines)


EDIT = ("Repeat this module exactly, adding type hints to every function:\n\n```python\n"
        + code_prompt(30) + "```")


def serve_pair(real_pair, *extra: str, env: dict | None = None) -> tuple[Serve, str]:
    port = free_port()
    s = Serve("--target", str(real_pair.target), "--draft", str(real_pair.draft), "--port", str(port), *extra,
              env=env)
    assert s.wait_line("models loaded", 300), s.output
    return s, f"http://127.0.0.1:{port}"


def stop_and_wait(s: Serve, bound: float = 90.0) -> tuple[int, float]:
    t = time.monotonic()
    s.p.send_signal(signal.SIGTERM)
    rc = s.p.wait(bound)
    s.reader.join(5)
    return rc, time.monotonic() - t


def assert_clean(s: Serve) -> None:
    log = s.output
    assert "Traceback" not in log and "Cancel " not in log and '"status": 500' not in log, log[-3000:]
    assert "smoke request failed" not in log and "loading failed" not in log, log[-3000:]


def in_thread(fn) -> tuple[threading.Thread, list]:
    got: list = []

    def run():
        try:
            got.append(fn())
        except httpx.HTTPError as e:
            got.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, got


@pytest.mark.real
@pytest.mark.parametrize("after", [2.0, 6.0])
def test_sigterm_during_a_long_prompt_exits_0_and_its_clients_get_503(real_pair, after):
    """The issue's case: the CPU pair at --ctx 16384, a ~10K-token prompt of code, SIGTERM 2-6 s into
    its evaluation; a second request waits in the queue (one slot), a streamed one with it."""
    s, url = serve_pair(real_pair, "--ctx", "16384", "--parallel", "1")
    try:
        body = {"messages": [{"role": "user", "content": "Review this module:\n" + code_prompt(350)}], "max_tokens": 64}
        long_, got = in_thread(lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=300))
        assert wait_for(lambda: httpx.get(url + "/health").json()["slots_free"] == 0, 30, 0.05)
        queued, got_q = in_thread(lambda: httpx.post(url + "/v1/completions", json={"prompt": "def f(", "max_tokens": 8},
                                                     timeout=300))
        streamed, got_s = in_thread(lambda: httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8}))
        assert wait_for(lambda: httpx.get(url + "/health").json()["queue"] == 2, 30, 0.05)
        time.sleep(after)
        rc, took = stop_and_wait(s)
        for t in (long_, queued, streamed):
            t.join(30)
    finally:
        s.stop()
    print(f"SIGTERM {after:.0f} s into a 10K-token prompt: exit {rc} in {took:.1f} s")
    assert rc == 0 and took < 60, (rc, took, s.output[-2000:])
    for r in (got[0], got_q[0]):
        assert isinstance(r, httpx.Response) and r.status_code == 503, r
        assert "shutting down" in r.json()["error"]["message"] and r.headers.get("retry-after") == "5"
    events = [x for x in got_s[0].text.splitlines() if x.startswith("data: ")]  # a stream ends with an event saying so
    assert "shutting down" in json.loads(events[-2][6:])["error"]["message"] and events[-1] == "data: [DONE]", events
    assert_clean(s)
    assert '"status": 503' in s.output


@pytest.mark.real
@pytest.mark.parametrize("chunks", [20])
def test_sigterm_mid_speculation_ends_the_stream_with_a_reason_and_exits_0(real_pair, chunks):
    """A code edit (the answer repeats the prompt: prompt lookup drafts, the target verifies and rolls
    back); SIGTERM after 20 streamed chunks (after 5 and 40 it passed as well: cut for the suite's time). The stream's last chunk says "abort", then
    [DONE]; a non-streamed request beside it gets 503."""
    s, url = serve_pair(real_pair, "--ctx", "4096", "--parallel", "2", env={"SPECDECK_SHUTDOWN_GRACE": "0"})
    lines: list[str] = []

    def stream():
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": EDIT}], "stream": True, "max_tokens": 2000,
                "temperature": 0}) as r:
            lines.extend(r.iter_lines())
        return r.status_code

    def status() -> dict:
        return httpx.get(url + "/v1/status", timeout=30).json()

    try:
        t, status_code = in_thread(stream)
        # the stream alone until it has drafted (its answer's copy of the code has begun): a preamble
        # longer than `chunks` would otherwise end it before any draft
        assert wait_for(lambda: sum(x.startswith("data: {") for x in lines) >= chunks
                        and any(x["state"] == "generating" and x.get("drafted", 0) > 0 for x in status()["slots"]),
                        300, 0.02), s.output[-2000:]
        plain, got_p = in_thread(lambda: httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": EDIT}], "max_tokens": 2000}))
        assert wait_for(lambda: status()["busy_slots"] + status()["queue"] >= 2, 60, 0.02)  # the other is in
        rc, took = stop_and_wait(s)
        t.join(30)
        plain.join(30)
    finally:
        s.stop()
    print(f"SIGTERM after {chunks} chunks of a speculative answer: exit {rc} in {took:.1f} s")
    assert rc == 0 and took < 30, (rc, took)
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert status_code == [200] and [x for x in lines if x][-1] == "data: [DONE]"
    assert data[-1]["choices"][0]["finish_reason"] == "abort", data[-1]
    assert data[-1]["timings"]["draft_n"] > 0  # it was speculating: drafts were verified and rolled back
    assert isinstance(got_p[0], httpx.Response) and got_p[0].status_code == 503
    assert_clean(s)


@pytest.mark.real
def test_sigterm_during_the_smoke_request_is_a_stop_not_a_failed_start(real_pair):
    """SIGTERM right as the server answers /health (the smoke request is then in flight): exit 0,
    "stopped during start-up", and the revision is not marked failed (tried until a stop lands
    inside the smoke request, at most three times)."""
    hit = 0
    for _ in range(3):
        s = Serve("--target", str(real_pair.target), "--draft", str(real_pair.draft), "--ctx", "2048",
                  "--port", str(port := free_port()), env={"SPECDECK_SHUTDOWN_GRACE": "0"})
        try:
            def healthy() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            assert wait_for(healthy, 300, 0.005), s.output
            rc, _ = stop_and_wait(s)
        finally:
            s.stop()
        assert rc == 0 and "Traceback" not in s.output and "smoke request failed" not in s.output, s.output
        if "stopped during start-up" in s.output:
            hit += 1
            assert "models loaded" not in s.output
            break
    assert hit, "no SIGTERM landed inside the smoke request in three tries"
    h = json.loads(run_cli("config", "history", "--json").stdout)
    assert h["revisions"] and all(r["status"] != "failed" for r in h["revisions"]), h


def test_a_model_whose_vocabulary_makes_no_tokens_of_text_passes_its_own_smoke(tmp_path):
    """The Qwen3.6-27B stand-in (hybrid, placeholder vocabulary: ordinary text tokenizes to nothing)
    loads, and its smoke request (token ids) passes: the start is good, on the port asked for."""
    from app.gguf.synthetic import SHAPES, small, write_random

    model = write_random(tmp_path / "hybrid.gguf", small(SHAPES["qwen3.6-27b"]), seed=3)
    port = free_port()
    s = Serve("--target", str(model), "--port", str(port), "--ctx", "1024")
    try:
        assert s.wait_line("models loaded", 300), s.output
        assert f"serving on http://127.0.0.1:{port}" in s.output and "smoke: 8 tokens" in s.output
    finally:
        assert s.stop() == 0, s.output
    assert "failed" not in s.output and "Traceback" not in s.output
