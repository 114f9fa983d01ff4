"""Several models behind one server: the fleet's residency rules (app/server/fleet.py) with loads
that only take memory, then the real small models behind `specdeck serve --model ...`."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from app.plan.rows import Term
from app.server.fleet import Fleet, Load, Member, NeverFits
from app.server.model_start import ModelStart

GiB = 2**30


def member(name: str, gib: float, unload_after: float | None = None) -> Member:
    plan = SimpleNamespace(terms=[Term("target weights", int(gib * GiB), "device"),
                                  Term("runtime reserve", GiB // 2, "device"), Term("safety margin", GiB // 4, "device")],
                           budget=0)
    return Member(ModelStart(name, plan, None, None, unload_after=unload_after), service=None, app=None)


class Machine:
    """Loads and unloads that hold memory as a real one does (and fail for the names in `broken`)."""

    def __init__(self, budget_gib: float) -> None:
        self.held: dict[str, int] = {}
        self.peak = 0
        self.budget = budget_gib * GiB
        self.broken: set[str] = set()
        self.lock = threading.Lock()
        self.loads: list[str] = []

    def load(self, m: Member, cancel) -> None:
        time.sleep(0.05)
        if m.name in self.broken:
            raise RuntimeError(f"{m.name}.gguf: unexpected end of file")
        with self.lock:
            self.held[m.name] = m.bytes
            self.loads.append(m.name)
            self.peak = max(self.peak, sum(self.held.values()) + int(0.75 * GiB))

    def unload(self, m: Member) -> None:
        time.sleep(0.02)
        with self.lock:
            self.held.pop(m.name)


def fleet_of(machine: Machine, *members: Member, models_max: int | None = None, default: str | None = None) -> Fleet:
    f = Fleet(list(members), int(machine.budget), models_max, default, machine.load, machine.unload)
    f.start()
    return f


def use(fleet: Fleet, m: Member, keep_alive: float | None = None, hold: float = 0.0, timeout: float = 10.0) -> None:
    """One request through `m`, as the front makes it: claim (waiting for a load), hold, release."""
    deadline = time.monotonic() + timeout
    waiting = None
    while True:
        assert time.monotonic() < deadline, f"{m.name} never loaded: {fleet.view()}"
        if waiting is None:
            got = fleet.claim(m)
            if got is True:
                break
            waiting = got if isinstance(got, Load) else None
        elif waiting.done.is_set():
            if waiting.error:
                raise RuntimeError(waiting.error)
            waiting = None
            continue
        time.sleep(0.01)
    time.sleep(hold)
    fleet.release(m, keep_alive)


def state(fleet: Fleet) -> dict[str, str]:
    return {v["name"]: v["state"] for v in fleet.view()}


def test_models_that_fit_together_stay_loaded_and_one_that_does_not_unloads_the_least_recently_used():
    machine = Machine(10)
    a, b, c = member("a", 4), member("b", 3), member("c", 4)
    fleet = fleet_of(machine, a, b, c)
    try:
        use(fleet, a)
        use(fleet, b)
        assert state(fleet) == {"a": "loaded", "b": "loaded", "c": "idle"}  # 4 + 3 + 0.75 shared <= 10
        use(fleet, a)  # b is now the least recently used
        use(fleet, c)
        assert state(fleet) == {"a": "loaded", "b": "idle", "c": "loaded"}
        assert machine.peak <= machine.budget, "a load started while the memory it needed was still held"
    finally:
        fleet.stop()


def test_models_max_caps_the_loaded_count():
    machine = Machine(100)
    a, b = member("a", 1), member("b", 1)
    fleet = fleet_of(machine, a, b, models_max=1)
    try:
        use(fleet, a)
        use(fleet, b)
        assert state(fleet) == {"a": "idle", "b": "loaded"}
    finally:
        fleet.stop()


def test_requests_to_two_models_that_do_not_fit_together_all_finish_in_turns():
    """A busy model is drained (its requests finish, none new start), never cut; both make progress."""
    machine = Machine(6)
    a, b = member("a", 4), member("b", 4)
    fleet = fleet_of(machine, a, b)
    done: list[str] = []
    try:
        threads = [threading.Thread(target=lambda m=m: (use(fleet, m, hold=0.1, timeout=30), done.append(m.name)))
                   for m in [a, b] * 4]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join(60)
        assert sorted(done) == ["a"] * 4 + ["b"] * 4
        assert machine.peak <= machine.budget
        assert machine.loads.count("a") + machine.loads.count("b") >= 2
    finally:
        fleet.stop()


def test_keep_alive_zero_unloads_after_the_answer_and_a_models_own_idle_time_unloads_it():
    machine = Machine(100)
    a, b = member("a", 1), member("b", 1, unload_after=0.3)
    fleet = fleet_of(machine, a, b)
    try:
        use(fleet, a, keep_alive=0)
        time.sleep(0.2)
        assert state(fleet)["a"] == "idle"
        use(fleet, b)
        assert state(fleet)["b"] == "loaded"
        time.sleep(1.0)  # the reaper looks every 0.25 s
        assert state(fleet)["b"] == "idle"
        use(fleet, a, keep_alive=-1)  # forever
        time.sleep(0.5)
        assert state(fleet)["a"] == "loaded" and next(v for v in fleet.view() if v["name"] == "a")["expires_in"] is None
    finally:
        fleet.stop()


def test_a_failed_load_tells_its_waiters_why_and_the_others_keep_serving():
    machine = Machine(100)
    a, b = member("a", 1), member("b", 1)
    machine.broken.add("b")
    fleet = fleet_of(machine, a, b)
    try:
        use(fleet, a)
        with pytest.raises(RuntimeError, match="unexpected end of file"):
            use(fleet, b)
        assert state(fleet) == {"a": "loaded", "b": "idle"}
        assert next(v for v in fleet.view() if v["name"] == "b")["error"].endswith("unexpected end of file")
        use(fleet, a)
        machine.broken.clear()
        use(fleet, b)  # the next request tries again
        assert state(fleet) == {"a": "loaded", "b": "loaded"}
    finally:
        fleet.stop()


def test_a_model_larger_than_the_budget_is_refused_in_one_line():
    fleet = fleet_of(Machine(4), member("big", 8))
    try:
        with pytest.raises(NeverFits, match="model big needs 8.75 GiB; the budget is 4.00 GiB"):
            fleet.claim(fleet.first)
    finally:
        fleet.stop()


def test_names_aliases_and_the_default():
    machine = Machine(100)
    a = Member(ModelStart("qwen", member("x", 1).start.plan, None, None, aliases=("coder",)), None, None)
    b = member("gemma", 1)
    fleet = fleet_of(machine, a, b)
    try:
        assert fleet.find("qwen") is a and fleet.find("coder") is a and fleet.find("gemma:latest") is b
        assert fleet.find("gpt-4o") is None  # several models, no default: unknown
        assert fleet.find(None) is a and fleet.find("specdeck") is a  # no name, or the server's: the first
        fleet.default = "gemma"
        assert fleet.find("gpt-4o") is b and fleet.find(None) is b
        fleet.strict = True  # --strict-model: only the served names and aliases
        assert fleet.find("gpt-4o") is None and fleet.find("coder:latest") is a and fleet.find("specdeck") is b
        del fleet.members["gemma"]
        fleet.default, fleet.strict = None, False  # one model: any name reaches it
        assert fleet.find("gpt-4o") is a and fleet.find("llama3:8b") is a
    finally:
        fleet.stop()


# -- the real small models behind `specdeck serve --model ...` ------------------------------------

import shutil  # noqa: E402

import json  # noqa: E402

import httpx  # noqa: E402
from conftest import run_cli  # noqa: E402

from support.live import Serve, free_port, wait_for  # noqa: E402

CTX = 2048


def config(path, models: dict[str, dict]) -> str:
    lines = []
    for name, keys in models.items():
        lines.append(f"[models.{name}]")
        lines += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def ask(url: str, model: str, text: str = "def fibonacci(n):", **more) -> httpx.Response:
    """A completion (Gemma 3 270M's GGUF has no chat template)."""
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": text, "max_tokens": 6, "temperature": 0,
                                                      **more}, timeout=300)


def loaded(url: str) -> set[str]:
    return {m["name"] for m in httpx.get(f"{url}/api/ps", timeout=30).json()["models"]}


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def three(real_pair, gemma_270m, tmp_path_factory):
    """The Qwen pair, Gemma 3 270M and a copy of it (`spare`, to be damaged), all resident: the
    budget holds them together."""
    d = tmp_path_factory.mktemp("fleet")
    spare = d / "spare.gguf"
    shutil.copyfile(gemma_270m, spare)
    cfg = config(d / "config.toml", {
        "coder": {"model": str(real_pair.target), "draft": str(real_pair.draft), "ctx": CTX, "parallel": 1},
        "gemma": {"model": str(gemma_270m), "ctx": CTX, "parallel": 1, "aliases": ["gemma3"]},
        "spare": {"model": str(spare), "ctx": CTX, "parallel": 1}})
    port = free_port()
    s = Serve("--config", cfg, "--port", str(port), "--ram", "20GiB", "--threads", "2")
    try:
        assert s.wait_line("models loaded", stall=300), s.output
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", serve=s, spare=spare)
    finally:
        assert s.stop() == 0, s.output[-3000:]


def test_several_models_are_listed_resident_and_each_answers_for_its_name(three):
    url = three.url
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["models"] == {"coder": "loaded", "gemma": "loaded", "spare": "loaded"}
    assert health["slots_total"] == 3
    listed = httpx.get(f"{url}/v1/models").json()["data"]
    assert {m["id"]: m["status"]["value"] for m in listed} == {"coder": "loaded", "gemma": "loaded", "gemma3": "loaded",
                                                               "spare": "loaded"}
    assert [m["name"] for m in httpx.get(f"{url}/api/tags").json()["models"]] == ["coder", "gemma", "spare"]
    assert loaded(url) == {"coder", "gemma", "spare"}
    assert httpx.get(f"{url}/props", params={"model": "gemma"}).json()["model_alias"] == "gemma"
    # each name reaches its own model: the same text is different tokens in Qwen's and Gemma's vocabularies
    ids = {name: httpx.post(f"{url}/tokenize", json={"model": name, "content": "specdeck serves several"}).json()["tokens"]
           for name in ("coder", "gemma", "gemma3")}
    assert ids["gemma"] == ids["gemma3"] != ids["coder"]
    for name in ("coder", "gemma"):
        r = ask(url, name)
        assert r.status_code == 200 and r.json()["model"] == name, r.text
    metrics = httpx.get(f"{url}/metrics").text
    assert 'specdeck_slots{model="coder"} 1.0' in metrics and 'specdeck_slots{model="gemma"} 1.0' in metrics


def test_a_model_without_a_chat_template_chats_through_chatml_on_every_api(three):
    """Gemma 3 270M's GGUF has no chat template: it is served with ChatML (as llama-server does),
    said once in the log and in /v1/models, with the generic JSON tool format."""
    from app.chat.fallback import FALLBACK, NOTE

    url, hi = three.url, [{"role": "user", "content": "Say hello."}]
    assert three.serve.output.count(f"gemma: {NOTE}") == 1 and f"coder: {NOTE}" not in three.serve.output
    meta = {m["id"]: m["meta"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert meta["gemma"]["chat_template"] == FALLBACK and meta["gemma"]["note"] == NOTE
    assert meta["coder"]["chat_template"] == "model" and "note" not in meta["coder"]
    prompt = httpx.post(f"{url}/apply-template", json={"model": "gemma", "messages": hi}).json()["prompt"]
    assert prompt == "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
    props = httpx.get(f"{url}/props", params={"model": "gemma"}).json()
    assert props["chat_format"] == "generic" and props["chat_template_caps"]["supports_tools"] is True
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "gemma", "messages": hi, "max_tokens": 48, "temperature": 0},
                   timeout=300)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text
    assert "<|im_end|>" not in r.json()["choices"][0]["message"]["content"]  # the fallback's end of turn ends the answer
    assert r.json()["usage"]["prompt_tokens"] == len(httpx.post(f"{url}/tokenize", json={"model": "gemma", "content": prompt,
                                                                                         "add_special": True}).json()["tokens"])
    r = httpx.post(f"{url}/v1/messages", json={"model": "gemma", "messages": hi, "max_tokens": 8, "temperature": 0}, timeout=300)
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    r = httpx.post(f"{url}/api/chat", json={"model": "gemma", "messages": hi, "stream": False,
                                            "options": {"num_predict": 8, "temperature": 0}}, timeout=300)
    assert r.status_code == 200 and r.json()["message"]["role"] == "assistant" and r.json()["done"], r.text
    tool = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo"]}},
                                                            "required": ["city"]}}}
    n = [httpx.post(f"{url}/v1/chat/completions/input_tokens", json={"model": "gemma", "messages": hi, **more}).json()["input_tokens"]
         for more in ({}, {"tools": [tool]})]
    assert n[1] > n[0] + 20  # the tools written into the system message, in the generic format's words
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "gemma", "messages": hi, "max_tokens": 64, "temperature": 0,
                                                      "tools": [tool], "tool_choice": "required"}, timeout=300)
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]  # forced: the generic format's call grammar
    assert r.status_code == 200 and call["name"] == "get_weather" and isinstance(json.loads(call["arguments"]), dict), r.text


def test_an_unknown_model_is_404_naming_the_served_ones_in_each_apis_shape(three):
    url = three.url
    r = ask(url, "gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert "coder, gemma, spare" in r.json()["error"]["message"] and r.json()["error"]["models"] == ["coder", "gemma", "spare"]
    r = httpx.post(f"{url}/v1/messages", json={"model": "claude-x", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    r = httpx.post(f"{url}/api/chat", json={"model": "llama3", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "coder, gemma, spare" in r.json()["error"], r.text


def test_keep_alive_zero_unloads_an_empty_prompt_loads_and_a_damaged_file_fails_alone(three):
    url = three.url
    r = httpx.post(f"{url}/api/generate", json={"model": "spare", "prompt": "Hi", "stream": False, "keep_alive": 0,
                                                "options": {"num_predict": 3}}, timeout=120)
    assert r.status_code == 200 and r.json()["done"], r.text
    assert wait_for(lambda: "spare" not in loaded(url), 60), loaded(url)
    r = httpx.post(f"{url}/api/generate", json={"model": "spare", "keep_alive": "5m"}, timeout=120)
    assert r.json()["done_reason"] == "load" and "spare" in loaded(url)
    ps = {m["name"]: m for m in httpx.get(f"{url}/api/ps").json()["models"]}
    assert ps["spare"]["expires_at"] < ps["coder"]["expires_at"]  # 5 minutes, against never
    r = httpx.post(f"{url}/api/generate", json={"model": "spare", "keep_alive": 0}, timeout=120)
    assert r.json()["done_reason"] == "unload"
    assert wait_for(lambda: "spare" not in loaded(url), 60)
    r = httpx.post(f"{url}/api/generate", json={"model": "spare", "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    # the file is damaged while it is not loaded: its load fails, the others go on serving
    with open(three.spare, "r+b") as f:
        f.truncate(three.spare.stat().st_size // 2)
    r = ask(url, "spare")
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed", r.text
    assert "model spare failed to load" in r.json()["error"]["message"]
    assert ask(url, "coder").status_code == 200 and ask(url, "gemma").status_code == 200
    assert loaded(url) == {"coder", "gemma"}
    assert "model spare failed to load" in three.serve.output


def budget_for_one(real_pair, gemma_270m) -> int:
    """A --ram that holds the Qwen pair or Gemma 3 270M, not both (as `serve` plans them)."""
    from app.gguf.info import read_model_info
    from app.plan.hardware import detect
    from app.plan.planner import PlanError, PlanRequest, make_plan
    from app.server.fleet import footprint, shared_bytes

    hw = detect()
    target, draft, gemma = (read_model_info(p) for p in (real_pair.target, real_pair.draft, gemma_270m))
    ram = GiB
    while True:
        req = PlanRequest(ctx=CTX, ctx_is_user_choice=True, parallel=1, ram=ram)
        try:
            starts = [ModelStart("coder", make_plan(target, draft, req, hw, None), target, draft),
                      ModelStart("gemma", make_plan(gemma, None, req, hw, None), gemma, None)]
        except PlanError:  # not even one fits yet
            ram += 32 * 2**20
            continue
        shared, sizes = max(shared_bytes(m) for m in starts), [footprint(m) for m in starts]
        if shared + max(sizes) <= ram:
            assert shared + sum(sizes) > ram, "no budget holds one but not both"
            return ram
        ram += 32 * 2**20


def test_a_budget_that_holds_one_switches_on_demand_with_requests_to_both_in_flight(real_pair, gemma_270m, tmp_path):
    ram = budget_for_one(real_pair, gemma_270m)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    s = Serve("--model", f"coder={real_pair.target}", "--model", f"gemma={gemma_270m}",
              "--config", config(tmp_path / "c.toml", {"coder": {"draft": str(real_pair.draft)}}),
              "--ctx", str(CTX), "--parallel", "1", "--ram", str(ram), "--threads", "2", "--keep-alive", "0.05",
              "--port", str(port))
    try:
        assert s.wait_line("models loaded", stall=300), s.output
        assert loaded(url) == {"coder"}  # the first named; gemma does not fit beside it
        # a stream to the model not loaded gets its headers and keep-alives while it loads
        with httpx.stream("POST", f"{url}/v1/completions", timeout=300, json={
                "model": "gemma", "stream": True, "max_tokens": 4, "prompt": "Once upon a time"}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines[0] == ": keep-alive" and lines[-1] == "data: [DONE]", lines
        assert loaded(url) == {"gemma"}
        results: list = []
        seen: set[frozenset] = set()

        def one(model: str) -> None:
            r = ask(url, model, max_tokens=4)
            results.append((model, r.status_code, r.json().get("model")))

        threads = [threading.Thread(target=one, args=(m,)) for m in ["coder", "gemma"] * 3]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            seen.add(frozenset(loaded(url)))
            time.sleep(0.05)
        assert sorted(results) == sorted([(m, 200, m) for m in ["coder", "gemma"] * 3]), results
        assert all(len(x) <= 1 for x in seen), seen  # never both at once
        assert s.output.count("model gemma loaded") >= 1 and "model coder unloaded" in s.output
    finally:
        assert s.stop() == 0, s.output[-3000:]
    # the revision records the set (a rollback starts it again as a set)
    history = json.loads(run_cli("config", "history", "--json").stdout)
    rev = history["revisions"][-1]
    assert rev["status"] == "good" and rev["preset"] == "coder+gemma", rev
    assert {"coder:target", "coder:draft", "gemma:target"} <= set(rev["models"]), rev["models"]
    assert [m["name"] for m in rev["args"]["models"]] == ["coder", "gemma"]
    import subprocess

    from support.live import ROOT, SPECDECK

    r = subprocess.Popen([*SPECDECK, "rollback", str(rev["number"])], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:  # the set starts again: both served, the first loaded, on the recorded port
        assert wait_for(lambda: r.poll() is not None or healthy(url), 300), "rollback never served"
        assert r.poll() is None, r.communicate()
        assert [m["name"] for m in httpx.get(f"{url}/api/tags").json()["models"]] == ["coder", "gemma"]
        assert loaded(url) == {"coder"} and ask(url, "gemma").json()["model"] == "gemma"
        r.terminate()
        assert r.wait(60) == 0
    finally:
        r.kill()


def test_bad_model_flags_and_sections_are_one_line_each(tiny, tmp_path):
    def said(*args: str) -> str:
        r = run_cli(*args)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        return r.stderr.strip().splitlines()[0]

    t = str(tiny.target)
    assert said("serve", "--model", "justaname") == "error: --model justaname: expected NAME=PRESET|FILE"
    assert said("serve", "--model", f"a={t}", "--model", f"a={t}") == "error: --model a is named twice"
    assert said("serve", "coder-1.5b", "--model", f"a={t}") == "error: models are named both by --model and by the preset name"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[models.a]\nmodel = "{t}"\ncontext = 4096\n')
    assert said("serve", "--config", str(cfg)) == "error: [models.a]: unknown key context"
    cfg.write_text("[models.a]\nctx = 4096\n")
    assert said("serve", "--config", str(cfg)).startswith("error: [models.a]: no model")
    cfg.write_text(f'[models.a]\nmodel = "{t}"\nunload_after = "soon"\n')
    assert said("serve", "--config", str(cfg)) == "error: [models.a]: 'soon' is not a duration"
    cfg.write_text(f'[models.a]\nmodel = "{t}"\nparallel = 0\n')
    assert said("serve", "--config", str(cfg)).startswith("error: [models.a]: bad setting parallel")
    assert said("serve", "--model", f"a={t}", "--model", f"b={t}", "--default-model", "c", "--port", str(free_port())) \
        == "error: --default-model c is not one of the models served (a, b)"
    assert said("serve", "--unload-after", "1x") .startswith("error: '1x' is not a duration")


def test_doctor_checks_each_model_and_whether_they_fit_together(tiny, tmp_path):
    r = run_cli("doctor", "--model", f"a={tiny.target}", "--model", f"b={tiny.target}", "--ctx", "512", "--json",
                "--port", str(free_port()))
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert {"models (a)", "pair (a)", "plan (a)", "models (b)", "plan (b)", "together"} <= set(checks), sorted(checks)
    assert checks["together"]["status"] == "ok" and checks["together"]["summary"].startswith("all 2 fit together")
    plan = checks["plan (a)"]["data"]  # a budget that holds one of them: the shared rows and 1.5 footprints
    reserve = plan["shared"] - max(256 * 2**20, plan["budget"] // 50)
    ram = reserve + 256 * 2**20 + int(1.5 * (plan["used"] - plan["shared"]))
    r = run_cli("doctor", "--model", f"a={tiny.target}", "--model", f"b={tiny.target}", "--ctx", "512", "--json",
                "--ram", str(ram), "--port", str(free_port()))
    together = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["together"]
    assert together["status"] == "warn" and "loaded in turns" in together["summary"], together


def test_up_serves_several_models_and_logs_each_ones_state(tiny):
    from support.live import up_until_sigterm

    def each_answers(url: str) -> None:
        for name in ("a", "b"):
            r = ask(url, name, "a b c")
            assert r.status_code == 200 and r.json()["model"] == name, r.text

    p = up_until_sigterm("--model", f"a={tiny.target}", "--model", f"b={tiny.draft}", "--ctx", "256",
                         "--log-interval", "0.5", port=free_port(), during=each_answers)
    out, err = p.stdout, p.stderr
    assert p.returncode == 0, err
    assert "a: target target.gguf" in err and "b: target draft.gguf" in err, err  # each pulled and verified
    lines = [line for line in out.splitlines() if line.startswith("specdeck: tok/s")]
    assert lines and "models a:loaded,b:loaded" in lines[-1], out[-2000:]
    assert "smoke: a 8 tokens, b 8 tokens" in err and "stopped cleanly" in err and "Traceback" not in err
