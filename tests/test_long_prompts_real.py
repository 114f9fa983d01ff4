"""Long prompts as coding agents send them, on a real server with the Qwen2.5-Coder pair (two slots):
a client whose idle watchdog is shorter than the prompt's evaluation is kept alive through it, a
short request is answered while a long prompt is still being evaluated, a client gone mid-prompt
frees its slot at the next chunk, its retry reuses what was evaluated, and the log and metrics say
it went away, not that it failed. Every long prompt starts with its own tag, so no cache shortens it."""

from __future__ import annotations

import json
import logging
import threading
import time

import anthropic
import httpx
import pytest
from support.live import LiveServer, free_port, wait_for

from app.server.settings import ServeSettings

pytestmark = pytest.mark.real

KEEP_ALIVE = 1.0  # --keep-alive here: seconds of silence before a keep-alive
WATCHDOG = 2.0  # the clients' idle timeout (an agent's is 300 s; its prompts take longer than that on a CPU)


@pytest.fixture(scope="module")
def server(real_pair):
    settings = ServeSettings(port=free_port(), keep_alive=KEEP_ALIVE, slots_endpoint=True)
    s = LiveServer(real_pair.target, real_pair.draft, settings, parallel=2, ctx=8192)
    yield s
    s.close()


def long_question(tag: str, n_words: int = 120) -> str:
    """About 3 tokens a word: 120 words take the 1.5B target several slices and ~5 s to read (2.5 x
    WATCHDOG here; the test checks that it did take longer than the watchdog)."""
    words = " ".join(f"{tag}{i % 97}" for i in range(n_words))
    return f"[{tag}] Here is a list: {words}\nSay only: ok."


def timed_lines(response) -> list[tuple[float, str]]:
    t0 = time.monotonic()
    return [(time.monotonic() - t0, line) for line in response.iter_lines() if line]


def chat(content: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0, **kw}


def event_gaps(lines: list[tuple[float, str]], skip: tuple[str, ...] = ()) -> list[float]:
    """Seconds between SSE events (data lines; those whose event is in `skip` not counted), as a
    watchdog that counts events rather than bytes sees them."""
    times, kind = [0.0], None
    for t, line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and kind not in skip:
            times.append(t)
    return [b - a for a, b in zip(times, times[1:])]


def test_clients_with_a_short_idle_watchdog_are_kept_alive_through_a_longer_prompt(server):
    """The stream opens at once (the role chunk; Anthropic's message_start; Responses' created), then
    keep-alives come while the prompt is evaluated: SSE comments on chat completions, events on the
    agents' APIs, whose watchdogs count events (Claude Code's skips pings; Codex's skips comments).
    Clients that give up after WATCHDOG silent seconds get their answers to prompts that take longer."""
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(WATCHDOG)) as c:
        with c.stream("POST", "/v1/chat/completions", json=chat(long_question("oa"), stream=True)) as r:
            lines = timed_lines(r)
        assert lines[0][0] < KEEP_ALIVE and '"role": "assistant"' in lines[0][1], lines[:3]
        last = json.loads(next(line for _, line in lines if '"timings"' in line)[6:])
        assert last["timings"]["prompt_ms"] > WATCHDOG * 1e3  # the watchdog would have fired
        first_token = next(t for t, line in lines if '"timings"' in line)
        alive = [t for t, line in lines if line == ": keep-alive"]
        assert len([t for t in alive if t < first_token]) >= 2, lines
        assert all(b - a < KEEP_ALIVE + 1.5 for a, b in zip(alive, alive[1:])), alive
        assert lines[-1][1] == "data: [DONE]"

        body = {"model": "x", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": long_question("an")}]}
        with c.stream("POST", "/v1/messages", json=body) as r:
            lines = timed_lines(r)
        assert max(event_gaps(lines, skip=("ping",))) < KEEP_ALIVE + 1.5, lines  # pings aside
        assert lines[0][1] == "event: message_start" and lines[-2][1] == "event: message_stop"

        body = {"model": "x", "max_output_tokens": 2, "stream": True, "input": long_question("rs")}
        with c.stream("POST", "/v1/responses", json=body) as r:
            lines = timed_lines(r)
        assert max(event_gaps(lines)) < KEEP_ALIVE + 1.5, lines
        assert ": keep-alive" not in [line for _, line in lines]
        assert '"type": "response.completed"' in lines[-1][1] or '"type": "response.incomplete"' in lines[-1][1]

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=WATCHDOG)
    with claude.messages.stream(model="x", max_tokens=2, messages=[{"role": "user", "content": long_question("sdk")}],
                                extra_body={"temperature": 0}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens > 300 and final.usage.output_tokens >= 1  # the keep-alives' deltas left no trace


def test_a_short_request_is_answered_while_a_long_prompt_is_still_being_evaluated(server):
    """Two slots: the long prompt's chunks and the short request's alternate, so the short answer is
    whole before the long prompt's first token. Its progress (llama-server's return_progress) shows
    the long prompt was still being evaluated when the short answer came."""
    events: list[tuple[float, str, dict]] = []

    def long_stream() -> None:
        with httpx.Client(base_url=server.url, timeout=600) as c:
            body = chat(long_question("lp", 350), stream=True, return_progress=True)
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        kind = "progress" if "prompt_progress" in chunk else "chunk"
                        events.append((time.monotonic(), kind, chunk))

    t = threading.Thread(target=long_stream)
    t.start()
    assert wait_for(lambda: any(k == "progress" for _, k, _ in events), 300, 0.05)
    r = httpx.post(server.url + "/v1/chat/completions", json=chat("Say only: yes.", max_tokens=3), timeout=300)
    short_done = time.monotonic()
    t.join(600)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    progress = [(at, c["prompt_progress"]) for at, k, c in events if k == "progress"]
    first_token = next(at for at, k, c in events if k == "chunk" and c["choices"] and
                       c["choices"][0]["delta"].get("content"))
    assert short_done < first_token
    assert any(at > short_done and p["processed"] < p["total"] for at, p in progress), progress  # still evaluating
    assert progress[-1][1]["processed"] == progress[-1][1]["total"] > 1000


def test_a_client_gone_mid_prompt_frees_its_slot_at_the_next_chunk_and_its_retry_reuses_it(server, caplog):
    """The client closes its stream after the first slice's progress: the log line says how far the
    prompt was when the server saw the client go, evaluation stops at the next slice boundary (never
    more than one slice, at most n_ubatch tokens, later), both slots are free, the metrics count it as
    gone (not failed), and the same prompt resent reuses what was evaluated."""
    caplog.set_level(logging.INFO, logger="specdeck.server.access")
    metrics_before = httpx.get(server.url + "/metrics").text
    content = long_question("gone", 450)
    with httpx.Client(base_url=server.url, timeout=600) as c:
        with c.stream("POST", "/v1/chat/completions", json=chat(content, stream=True, return_progress=True)) as r:
            for line in r.iter_lines():
                if "prompt_progress" in line:
                    seen = json.loads(line[6:])["prompt_progress"]
                    if seen["processed"] > seen["cache"]:  # the first chunk is in (the first report comes before it)
                        break
    chunk = seen["processed"] - seen["cache"]
    assert seen["processed"] < seen["total"] - chunk  # far from done

    def idle() -> bool:
        return all(s["is_processing"] is False for s in httpx.get(server.url + "/slots").json())

    assert wait_for(idle, 60, 0.1)
    gone = [json.loads(r.getMessage()) for r in caplog.records if "client_gone" in r.getMessage()]
    assert [g["client_gone"].startswith("prompt ") and g["status"] == 200 for g in gone] == [True], gone
    at, total = (int(x.replace(",", "")) for x in gone[0]["client_gone"].split()[1::2])  # "prompt 1,088 of 1,350"
    assert total == seen["total"] and seen["processed"] <= at < total
    retry = httpx.post(server.url + "/v1/chat/completions", json=chat(content), timeout=600).json()
    reused = retry["usage"]["prompt_tokens_details"]["cached_tokens"]
    n_ubatch = server.service.scheduler.engine.target.params.n_ubatch
    assert at <= reused <= at + n_ubatch and reused < total, (seen, at, reused)  # at most one slice more
    assert retry["usage"]["prompt_tokens"] == seen["total"]

    def counted(text: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + " ", name + "{")))

    metrics = httpx.get(server.url + "/metrics").text
    assert counted(metrics, "specdeck_client_gone_total") == counted(metrics_before, "specdeck_client_gone_total") + 1
    assert counted(metrics, "specdeck_errors_total") == counted(metrics_before, "specdeck_errors_total")
