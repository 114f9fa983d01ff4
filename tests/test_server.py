"""The local API with the real `openai` client, on tiny models in-process and on the Qwen pair."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import httpx
import pytest
from conftest import REAL_CACHE, ROOT
from openai import OpenAI
from support.live import LiveServer, free_port, wait_exit, wait_working

from app.server.settings import ServeSettings


@pytest.fixture(scope="module")
def tiny_server(tiny):
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port(), max_queue=1), parallel=2)
    yield s
    s.close()


def client(url, key="none"):
    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_tiny_chat_completion_stream_and_errors(tiny_server):
    c = client(tiny_server.url)
    assert c.models.list().data[0].id == "tiny"
    r = c.completions.create(model="tiny", prompt="a b c the", max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    chunks = list(c.completions.create(model="tiny", prompt="a b c the", max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12
    raw = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": "many"})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "max_tokens"
    raw = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a", "model": "gpt-9", "max_tokens": 2})
    assert raw.status_code == 200 and raw.json()["model"] == "tiny"  # another name is served by this model, as llama-server
    raw = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a " * 3000, "max_tokens": 2})
    err = raw.json()["error"]
    assert raw.status_code == 400 and "context is 1,024 tokens" in err["message"]
    assert (err["type"], err["code"], err["n_ctx"]) == ("exceed_context_size_error", "context_length_exceeded", 1024)
    assert err["n_prompt_tokens"] > 1024
    raw = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3, "n": 2})
    assert raw.status_code == 400
    raw = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3, "frobnicate": 1})
    assert raw.status_code == 200  # unknown fields are ignored
    health = httpx.get(tiny_server.url + "/health").json()  # what a balancer reads
    assert health == {"status": "ok", "ready": True, "slots_total": health["slots_total"],
                      "slots_free": health["slots_total"], "queue": 0, "queue_limit": 1} and health["slots_total"] >= 1
    assert httpx.get(tiny_server.url + "/health?fail_on_no_slot=1").status_code == 200  # a slot is free
    assert httpx.get(tiny_server.url + "/openapi.json").status_code == 200


def test_speculation_per_request_and_timings(tiny_server):
    body = {"prompt": "a b c the def", "max_tokens": 24, "temperature": 0}
    on = httpx.post(tiny_server.url + "/v1/completions", json={**body, "speculative": {"n_max": 4}}).json()
    off = httpx.post(tiny_server.url + "/v1/completions", json={**body, "speculative": {"enabled": False}}).json()
    zero = httpx.post(tiny_server.url + "/v1/completions", json={**body, "speculative": {"n_max": 0}}).json()
    assert off["timings"]["draft_n"] == 0 and zero["timings"]["draft_n"] == 0
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    again = httpx.post(tiny_server.url + "/v1/completions", json={**body, "speculative": {"n_max": 4}}).json()
    assert again["choices"][0]["text"] == on["choices"][0]["text"]
    assert again["timings"]["prompt_cached"] > 0  # the slot's prefix was reused


def test_slot_choice_keeps_each_prompts_cache():
    """Prompts that share nothing go to an empty slot, then to the one used longest ago: prompts sent
    in turn each find their own cache. A slot is taken when its cache holds all of the prompt it last
    served, or half of a longer prompt; a system prompt in common does not evict another's cache."""
    from app.engine.engine import Slot
    from app.engine.records import RequestRecord
    from app.server.scheduler import pick_slot

    a, b, c = Slot(0), Slot(1), Slot(2)
    edit, question = list(range(100, 500)), list(range(100, 120)) + list(range(600, 620))
    assert pick_slot([a, b, c], edit, {}) is a
    a.cached = edit + list(range(900, 1000))  # the prompt and its answer
    a.record, uses = RequestRecord(len(edit)), {0: 9.0}  # uses: when each slot's last request ended
    assert pick_slot([a, b, c], question, uses) is b  # 20 tokens in common: an empty slot, not the edit's
    short = list(range(100, 120)) + list(range(700, 710))  # a short prompt: the shared 20 are over half of it
    assert pick_slot([a, c], short, uses) is c
    b.cached, b.record, uses[1] = question + [7] * 200, RequestRecord(len(question)), 5.0  # a short prompt, a long answer
    assert pick_slot([a, b, c], edit, uses) is a and pick_slot([a, b, c], question, uses) is b
    c.cached, c.record, uses[2] = [1, 2, 3, 9, 9], RequestRecord(5), 1.0
    assert pick_slot([a, b], [5, 6], uses) is b  # none holds anything of it: the one used longest ago
    assert pick_slot([a, b, c], [5, 6], uses) is c
    assert pick_slot([a, c], edit[:250] + [8] * 100, uses) is a  # the same file edited past its middle
    assert pick_slot([a, c], edit[:150] + [8] * 200, uses) is c  # edited before it: a's cache stays
    assert pick_slot([a, c], a.cached + [5, 5, 5], uses) is a  # the conversation goes on
    a.owner = "alice"  # another API key's cache is not taken
    assert pick_slot([a, c], a.cached + [5, 5, 5], uses) is c
    assert pick_slot([a, c], a.cached + [5, 5, 5], uses, owner="alice") is a


def test_prompts_in_turn_are_each_served_from_cache(tiny_server):
    """On the server: more prompts than slots (two here) sent in turn, as an agent's sub-agents do;
    each is cached the second time (the prompts whose slot was taken wait in host memory)."""
    url = tiny_server.url + "/v1/completions"
    assert tiny_server.plan.target.n_seq_max == 2
    bodies = [{"prompt": f"{w} a b c the def " * 8, "max_tokens": 4, "temperature": 0} for w in ("x", "y", "z", "w")]
    for body in bodies:
        httpx.post(url, json=body, timeout=60).raise_for_status()
    for body in bodies:
        r = httpx.post(url, json=body, timeout=60).json()
        assert r["timings"]["prompt_cached"] >= r["usage"]["prompt_tokens"] - 1, r["timings"]
    metrics = httpx.get(tiny_server.url + "/metrics").text
    held = {line.split("{")[0]: float(line.split()[1]) for line in metrics.splitlines()
            if line.startswith("specdeck_prompt_cache_host")}
    assert 'specdeck_prompt_cache_host_prompts{model="tiny"}' in metrics  # each sample names its model
    assert held["specdeck_prompt_cache_host_prompts"] >= 2 and held["specdeck_prompt_cache_host_bytes"] > 0, held


def test_queue_limit_and_disconnect(tiny_server, caplog):
    url = tiny_server.url + "/v1/completions"
    body = {"prompt": "a b c", "max_tokens": 400, "temperature": 0, "speculative": {"enabled": False}}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: httpx.post(url, json=body, timeout=120), range(6)))
    codes = [r.status_code for r in replies]
    # 2 slots and a queue of 1 for 6 requests at once: some are served, the rest turned away. How
    # many get in depends on how soon the worker takes the first from the queue (at least one).
    assert set(codes) == {200, 429}
    assert all(r.headers.get("Retry-After") == "1" for r in replies if r.status_code == 429)
    # a client that goes away mid-stream frees its slot at once, and its log line says so
    caplog.set_level(logging.INFO, logger="specdeck.server.access")
    with httpx.stream("POST", url, json={**body, "max_tokens": 900, "stream": True}, timeout=60) as r:
        for _ in r.iter_lines():
            break
    deadline = time.time() + 5
    while time.time() < deadline and httpx.get(tiny_server.url + "/v1/status").json()["busy_slots"] > 0:
        time.sleep(0.05)
    assert httpx.get(tiny_server.url + "/v1/status").json()["busy_slots"] == 0
    gone = [r.getMessage() for r in caplog.records if '"client_gone"' in r.getMessage()]
    assert len(gone) == 1 and '"client_gone": "answer"' in gone[0] and '"status": 200' in gone[0], gone
    t = time.time()
    assert httpx.post(url, json={**body, "max_tokens": 5}).status_code == 200 and time.time() - t < 5


def test_metrics_and_status(tiny_server):
    httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 5})
    m = httpx.get(tiny_server.url + "/metrics").text
    for name in ("specdeck_requests_total", "specdeck_completion_tokens_total", "specdeck_ttft_seconds_bucket",
                 "specdeck_draft_tokens_total", "specdeck_queue_depth", "specdeck_busy_slots", "specdeck_process_rss_bytes"):
        assert name in m
    st = httpx.get(tiny_server.url + "/v1/status").json()
    assert len(st["slots"]) == 2 and st["plan"]["ctx"] == 1024 and st["host"]["rss"] > 0


def test_auth(tiny):
    key = "s3cret-key"
    s = LiveServer(tiny.target, None, ServeSettings(port=free_port(), api_key=key), parallel=1)
    try:
        url = s.url + "/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200
        assert client(s.url, key).completions.create(model="tiny", prompt="a", max_tokens=2,
                                                extra_body={"ignore_eos": True}).usage.completion_tokens == 2
    finally:
        s.close()


def test_refuses_public_bind_without_key(tiny):
    p = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--target", str(tiny.target), "--host", "0.0.0.0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "SPECDECK_API_KEY"})
    assert p.returncode != 0 and "without an API key" in p.stderr and "Traceback" not in p.stderr


# routes that answer 501 until a flag turns them on (--slots, --embedding-model), as llama-server's do
OFF_BY_DEFAULT = {"/slots", "/v1/embeddings", "/embeddings", "/api/embed"}


def test_schema_fuzz_no_server_errors(tiny_server):
    """A bounded schemathesis run against the served OpenAPI schema: no 5xx."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    failures, tried = [], []
    for result in schema.get_all_operations():
        op = result.ok()

        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case):
            if isinstance(case.body, dict):
                case.body["max_tokens"] = 2
                case.body["n_predict"] = 2
            r = case.call(base_url=tiny_server.url, timeout=30)
            tried.append(r.status_code)
            if r.status_code >= 500 and not (r.status_code == 501 and case.path in OFF_BY_DEFAULT):
                failures.append((case.path, case.body, r.status_code, r.text[:200]))

        check()
    assert len(tried) >= 30 and failures == []


# -- the real Qwen pair, through `specdeck serve` -------------------------------------------------

@pytest.fixture(scope="module")
def qwen_server(real_pair):
    port = free_port()
    env = {**os.environ, "SPECDECK_HOME": str(REAL_CACHE)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "coder-1.5b", "--port", str(port), "--ctx", "4096",
                             "--parallel", "2"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    if not wait_working(healthy, proc.pid, every=0.3):
        proc.kill()
        raise RuntimeError(proc.stderr.read())
    yield url
    proc.terminate()
    wait_exit(proc)


def test_qwen_chat_completion_fim_stream_stop(qwen_server):
    c = client(qwen_server)
    msg = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]
    r = c.chat.completions.create(model="coder-1.5b", messages=msg, max_tokens=60, temperature=0)
    text = r.choices[0].message.content
    assert "def" in text and r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 5
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="coder-1.5b", messages=msg, max_tokens=60, temperature=0, stream=True) if ch.choices)
    assert streamed == text
    stop = c.chat.completions.create(model="coder-1.5b", messages=msg, max_tokens=60, temperature=0, stop=["def"])
    assert "def" not in stop.choices[0].message.content and stop.choices[0].finish_reason == "stop"
    fim = c.completions.create(model="coder-1.5b", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                               max_tokens=10, temperature=0)
    assert "a + b" in fim.choices[0].text
    inf = httpx.post(qwen_server + "/infill", json={"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n",
                                                    "n_predict": 8}, timeout=60).json()
    assert "a + b" in inf["content"]


FIB = ("def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n    out = [0, 1]\n"
       "    while len(out) < n:\n        out.append(out[-1] + out[-2])\n    return out[:n]\n")


def test_qwen_speculation_on_off_identical(qwen_server):
    """Greedy with speculation on equals it off, but for llama.cpp's batch numerics (FACTS.md: a
    logit may move by up to ~0.8 between a batch of one and a larger one): where the texts part, the
    first token that differs must be a near tie, the two tokens' log-probabilities within 1.0. The
    answer copies a function of the prompt, so drafts are proposed whatever the controller thinks of
    the draft model on this CPU (prompt lookup is free; the draft model alone once drafted nothing)."""
    body = {"model": "coder-1.5b", "prompt": FIB + "\n\n# The same function, copied exactly:\n" + FIB.split("\n")[0] + "\n",
            "max_tokens": 48, "temperature": 0, "logprobs": 2}
    on = httpx.post(qwen_server + "/v1/completions", json=body, timeout=120).json()
    off = httpx.post(qwen_server + "/v1/completions", json={**body, "speculative": {"enabled": False}}, timeout=120).json()
    assert off["timings"]["draft_n"] == 0 and on["timings"]["draft_n"] > 0
    a, b = on["choices"][0]["logprobs"], off["choices"][0]["logprobs"]
    assert "".join(a["tokens"]) == on["choices"][0]["text"] and "".join(b["tokens"]) == off["choices"][0]["text"]
    i = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
    if i is None:
        assert a["tokens"] == b["tokens"]
        return
    top = b["top_logprobs"][i]
    assert a["tokens"][i] in top and abs(top[a["tokens"][i]] - top[b["tokens"][i]]) < 1.0, (i, a["tokens"][i], top)


def test_qwen_parallel_streams_complete(qwen_server):
    c = client(qwen_server)

    def one(i):
        chunks = list(c.completions.create(model="coder-1.5b", prompt=f"# task {i}\ndef f{i}(x):", max_tokens=24,
                                           temperature=0, stream=True))
        return chunks[-1].choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        reasons = list(pool.map(one, range(3)))
    assert reasons == ["length"] * 3


def test_probes_of_the_root_answer_200_and_clients_gone_are_not_failures(tiny_server):
    """Claude Code's reachability probe (HEAD /) is answered as llama-server and Ollama answer it; a
    request whose client went away (499) is neither a failure nor a refusal in the alert's counts."""
    from app.server.metrics import Metrics

    assert httpx.head(tiny_server.url + "/").status_code == 200
    assert httpx.get(tiny_server.url + "/").text == "specdeck is running"
    m = Metrics()
    for status, n in (("200", 5), ("499", 7), ("500", 1), ("429", 2), ("529", 1), ("404", 1)):
        m.requests.labels("/v1/chat/completions", status).inc(n)
    assert m.status_counts() == (10, 2, 3)  # 529 (Anthropic's overloaded) is a refusal, as 429
    text = httpx.get(tiny_server.url + "/metrics").text
    assert "specdeck_client_gone_total" in text and "specdeck_cache_host_bytes" in text

