"""Named API keys: the key file's format and its errors (which never show a key), the per-minute
windows, the access log's lines and rotation; and on a real `specdeck serve`: per-key limits (429
with Retry-After), rotation by SIGHUP under load with no failed request, and the access log's
fields with no key and no prompt text in it."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from datetime import datetime

import httpx
import pytest
from conftest import run_cli
from support.live import Serve, free_port, wait_for

from app.errors import SpecdeckError
from app.server.audit import Usage, access_line, close_sink, open_sink
from app.server.keys import ApiKey, KeyStore, Windows, parse_keys, read_keys

SECRETS = {"old": "sk-old-4b1c0e9f2d7a", "limited": "sk-lim-7e2d55aa10c3", "tok": "sk-tok-0c3e9a41b2f8",
           "new": "sk-new-93d1f0c7a6e5"}


def key_lines(*names: str, limits: dict | None = None) -> str:
    limits = limits or {}
    return "# name key limits\n" + "".join(f"{n}  {SECRETS[n]}  {limits.get(n, '')}\n" for n in names)


def test_key_file_names_keys_and_limits(tmp_path):
    keys = parse_keys("# clients\nalice  sk-alice-1  requests_per_minute=60 generated_tokens_per_minute=2000\n\n"
                      "ci.bot@build  sk-ci-2   # the CI runner\n", "keys")
    assert [(k.name, k.secret, k.requests_per_minute, k.generated_tokens_per_minute) for k in keys] == \
        [("alice", "sk-alice-1", 60, 2000), ("ci.bot@build", "sk-ci-2", None, None)]
    assert parse_keys("  sk-only-one  \n", "keys") == [ApiKey("default", "sk-only-one")]  # the older one-key file
    assert "sk-alice-1" not in repr(keys[0])
    f = tmp_path / "keys"
    f.write_text("a sk-a-1\n")
    ring = read_keys(f, "sk-from-env")
    assert ring.names() == ["a", "env"] and ring.match("sk-from-env").name == "env" and ring.match("sk-a-1").name == "a"
    assert ring.match("sk-a-") is None and ring.match("") is None and not read_keys(None)


@pytest.mark.parametrize("text, message", [
    ("alice sk-secret-1\nbob\n", "keys:2: expected a name and a key"),
    ("alice sk-secret-1\nbo/b sk-secret-2\n", "keys:2: the name must be"),
    ("alice sk-secret-1 requests_per_hour=5\n", "keys:1: key 'alice': unknown option 'requests_per_hour'"),
    ("alice sk-secret-1 requests_per_minute=0\n", "keys:1: key 'alice': requests_per_minute must be a whole number"),
    ("alice sk-secret-1 generated_tokens_per_minute=lots\n", "keys:1: key 'alice': generated_tokens_per_minute"),
    ("alice sk-secret-1\n# rotated\nalice sk-secret-2\n", "keys:3: the name 'alice' is also on line 1"),
    ("alice sk-secret-1\nbob sk-secret-1\n", "keys:2: key 'bob' is the same key as 'alice'"),
])
def test_a_malformed_key_file_is_one_line_naming_the_line_never_the_key(text, message):
    with pytest.raises(SpecdeckError) as e:
        parse_keys(text, "keys")
    assert e.value.message.startswith(message), e.value.message
    assert "sk-secret" not in e.value.message + (e.value.hint or "")


def test_a_key_file_that_does_not_parse_keeps_the_keys_being_served(tmp_path):
    f = tmp_path / "keys"
    f.write_text("a sk-a-1\n")
    store = KeyStore(f, None)
    f.write_text("a sk-a-1\nb\n")
    assert "keys not reloaded, still serving 1" in store.reload() and store.ring.names() == ["a"]
    f.write_text("")
    assert "holds no key" in store.reload() and store.ring.names() == ["a"]
    f.write_text("a sk-a-1\nb sk-b-2\n")
    assert "reloaded" in store.reload() and store.ring.names() == ["a", "b"]


def test_windows_count_requests_and_generated_tokens_per_minute():
    w = Windows()
    key = ApiKey("a", "s", requests_per_minute=2)
    assert w.admit(key, now=100.0) is None and w.admit(key, now=110.0) is None
    assert w.admit(key, now=115.0) == pytest.approx(45.0)  # the first leaves the window at 160
    assert w.admit(key, now=160.5) is None and w.admit(key, now=161.0) == pytest.approx(9.0)
    key = ApiKey("t", "s", generated_tokens_per_minute=100)
    assert w.admit(key, now=0.0) is None
    w.charge("t", 80, now=1.0)
    assert w.admit(key, now=2.0) is None  # 80 < 100: this request may cross the limit
    w.charge("t", 40, now=3.0)
    assert w.admit(key, now=4.0) == pytest.approx(57.0)  # until the 80 leaves: 40 left, under 100
    assert w.admit(key, now=61.5) is None
    assert w.admit(ApiKey("u", "s"), now=0.0) is None  # no limits: always admitted


def test_access_line_fields_and_rotation(tmp_path):
    scope = {"method": "POST", "path": "/v1/completions", "headers": [(b"user-agent", b"OpenAI/Python 1.0")],
             "state": {"key_name": "alice", "client_address": "10.0.0.7"}}
    usage = Usage()
    charged = []
    usage.on_generated = charged.append
    usage.add(12, 8, 5)
    line = access_line(scope, 200, usage, 0.25)
    assert {k: line[k] for k in ("key", "client", "method", "route", "status", "prompt_tokens", "cached_tokens",
                                 "completion_tokens", "ms", "agent")} == \
        {"key": "alice", "client": "10.0.0.7", "method": "POST", "route": "/v1/completions", "status": 200,
         "prompt_tokens": 12, "cached_tokens": 8, "completion_tokens": 5, "ms": 250.0, "agent": "OpenAI/Python 1.0"}
    assert charged == [5] and datetime.fromisoformat(line["time"]) and "prompt" not in line
    usage.add(1, 0, 1, {"prompt": "def f():", "completion": " pass"})  # only with --log-prompts
    assert access_line(scope, 200, usage, 0.1)["prompt"] == "def f():"
    path = tmp_path / "access.log"
    sink = open_sink(path, 1 / 1024, 2)  # 1 KiB per file, 2 kept
    for i in range(60):
        sink.info(json.dumps({"n": i, "pad": "x" * 40}))
    close_sink(sink)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["access.log", "access.log.1", "access.log.2"]
    assert all(p.stat().st_size <= 1024 for p in tmp_path.iterdir())
    assert json.loads(path.read_text().splitlines()[-1])["n"] == 59
    assert logging.getLogger("specdeck.server.access").handlers == []  # the file sink is the app's own


def test_bad_key_file_and_access_log_are_one_line(tmp_path, tiny):
    keys = tmp_path / "keys"
    keys.write_text("alice sk-secret-1\nalice sk-secret-2\n")
    base = ["serve", "--target", str(tiny.target), "--port", str(free_port())]
    r = run_cli(*base, "--api-key-file", str(keys))
    assert r.returncode == 1 and "error: " in r.stderr and "keys:2: the name 'alice' is also on line 1" in r.stderr
    assert "sk-secret" not in r.stdout + r.stderr and "Traceback" not in r.stderr
    r = run_cli(*base, "--access-log", str(tmp_path / "no" / "access.log"))
    assert r.returncode == 1 and "--access-log" in r.stderr and "no directory" in r.stderr and "Traceback" not in r.stderr


def _complete(url: str, key: str, prompt: str = "a b", n: int = 2) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": n, "ignore_eos": True},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


class Load:
    """Clients sending requests back to back with whichever key `key` names now."""

    def __init__(self, url: str, key: str, clients: int = 2) -> None:
        self.url, self.key, self.stop = url, key, threading.Event()
        self.results: list[tuple[str, int]] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            key = self.key
            try:
                status = _complete(self.url, key).status_code
            except httpx.HTTPError as e:
                status = repr(e)
            self.results.append((key, status))

    def finish(self) -> list:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return self.results


def test_limits_rotation_under_load_and_the_access_log(tmp_path, tiny):
    keys, log = tmp_path / "keys", tmp_path / "access.log"
    limits = {"limited": "requests_per_minute=2", "tok": "generated_tokens_per_minute=5"}
    keys.write_text(key_lines("old", "limited", "tok", limits=limits))
    keys.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    s = Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--port", str(port), "--ctx", "512",
              "--api-key-file", str(keys), "--access-log", str(log), env={"SPECDECK_API_KEY": ""})
    try:
        assert s.wait_line("models loaded"), s.output
        # per-key limits: requests per minute, then generated tokens per minute
        assert [_complete(url, SECRETS["limited"]).status_code for _ in range(2)] == [200, 200]
        r = _complete(url, SECRETS["limited"])
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60 and "'limited'" in r.json()["error"]["message"]
        assert _complete(url, SECRETS["tok"], n=6).status_code == 200  # crosses its 5 tokens a minute
        r = _complete(url, SECRETS["tok"])
        assert r.status_code == 429 and 50 <= int(r.headers["retry-after"]) <= 60, r.headers
        assert _complete(url, SECRETS["old"]).status_code == 200  # other keys are not held back
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {SECRETS['old']}"}).text
        assert 'specdeck_key_limited_total{key="limited",model="custom"} 1.0' in metrics and 'key="tok",model="custom"} 1.0' in metrics
        assert _complete(url, "sk-wrong-000").status_code == 401

        # rotation under load: add the new key, HUP, move the clients, remove the old key, HUP
        load = Load(url, SECRETS["old"])
        time.sleep(1.0)
        keys.write_text(key_lines("old", "limited", "tok", "new", limits=limits))
        s.p.send_signal(signal.SIGHUP)
        assert wait_for(lambda: _complete(url, SECRETS["new"]).status_code == 200, 20), s.output
        load.key = SECRETS["new"]
        time.sleep(1.0)
        keys.write_text("old sk-old\nnew\n")  # a broken edit: the keys being served stay
        s.p.send_signal(signal.SIGHUP)
        assert s.wait_line("keys not reloaded", 20), s.output
        keys.write_text(key_lines("limited", "tok", "new", limits=limits))
        s.p.send_signal(signal.SIGHUP)
        assert wait_for(lambda: _complete(url, SECRETS["old"]).status_code == 401, 20), s.output
        time.sleep(1.0)
        results = load.finish()
        failed = [r for r in results if r[1] != 200]
        by_key = {name: sum(1 for k, _ in results if k == SECRETS[name]) for name in ("old", "new")}
        assert not failed and by_key["old"] >= 3 and by_key["new"] >= 3, (failed, by_key, s.output[-2000:])
        assert s.p.poll() is None  # SIGHUP reloads; it does not stop the server
    finally:
        assert s.stop() == 0, s.output

    lines = [json.loads(x) for x in log.read_text().splitlines()]
    completions = [x for x in lines if x["route"] == "/v1/completions"]
    assert {(x["key"], x["status"]) for x in completions} >= {("limited", 200), ("limited", 429), ("tok", 429),
                                                               ("old", 200), ("new", 200), (None, 401)}
    ok = next(x for x in completions if x["key"] == "tok" and x["status"] == 200)
    assert ok["completion_tokens"] == 6 and ok["prompt_tokens"] >= 1 and ok["client"] == "127.0.0.1" and ok["ms"] > 0
    assert ok["method"] == "POST" and ok["agent"].startswith("python-httpx") and datetime.fromisoformat(ok["time"])
    assert len(completions) >= len(results)  # every request of the load has its line
    everything = log.read_text() + s.output
    assert not [name for name, secret in SECRETS.items() if secret in everything]  # never a key
    assert '"a b"' not in log.read_text() and "\"prompt\":" not in log.read_text()  # no text without --log-prompts


def test_one_keys_cached_prompt_is_never_anothers(tmp_path, tiny):
    """Through the API with two keys: a prompt alice sent is served to bob from nothing cached (his
    usage shows no cached tokens, so his time to first token says nothing of alice's prompt), and
    to alice again from her cache."""
    from openai import OpenAI
    from support.live import LiveServer

    from app.server.settings import ServeSettings

    keys = tmp_path / "keys"
    keys.write_text(key_lines("old", "new"))
    keys.chmod(0o600)
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port(), api_key_file=keys), parallel=2)
    try:
        def cached(name: str) -> int:
            c = OpenAI(base_url=s.url + "/v1", api_key=SECRETS[name], max_retries=0, timeout=60)
            r = c.completions.create(model="tiny", prompt="the a b c " * 40, max_tokens=4, temperature=0)
            return r.usage.prompt_tokens_details.cached_tokens

        assert cached("old") == 0
        assert cached("new") == 0 and cached("new") > 100
        assert cached("old") > 100
    finally:
        s.close()
