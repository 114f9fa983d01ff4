"""The chat page's server side on the tiny models: the page for browsers and not for programs, the
conversation API (kept in SQLite, per key), turns written by the server as they stream, stop,
export and import, bad input. The page in a real browser is tests/test_ui_browser.py."""

from __future__ import annotations

import json
import ssl
import time

import httpx
import pytest
from support.live import LiveServer, free_port, wait_for
from support.tinymodels import write_tiny_model

from app.server.settings import ServeSettings
from app.ui.store import Message, Store

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HTML = {"accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("ui-pair")
    return (write_tiny_model(d / "target.gguf", seed=0, chat_template=TEMPLATE),
            write_tiny_model(d / "draft.gguf", seed=1, n_layers=1, chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDECK_HOME", str(tmp_path_factory.mktemp("ui-home")))
    s = LiveServer(*pair, ServeSettings(port=free_port(), max_body_bytes=1 << 20), parallel=2, ctx=1024)
    yield s
    s.close()
    mp.undo()


@pytest.fixture(scope="module")
def keyed(pair, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("ui-keyed")
    mp.setenv("SPECDECK_HOME", str(home))
    keys = home / "keys"
    keys.write_text("alice sk-alice-1\nbob sk-bob-2\n")
    keys.chmod(0o600)
    s = LiveServer(*pair, ServeSettings(port=free_port(), api_key_file=keys), parallel=1, ctx=512)
    yield s
    s.close()
    mp.undo()


def api(s, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, s.url + path, headers=headers, timeout=60, **kw)


def settled(s, cid: str, key: str | None = None, timeout: float = 60) -> dict:
    """The conversation once no answer in it is being written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conv = api(s, "GET", f"/ui/api/conversations/{cid}", key).json()
        if all(m["state"] != "streaming" for m in conv["messages"]):
            return conv
        time.sleep(0.1)
    raise AssertionError(f"still streaming after {timeout} s: {conv}")


def new(s, key: str | None = None, **body) -> str:
    r = api(s, "POST", "/ui/api/conversations", key, json=body)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_a_browser_gets_the_page_and_programs_keep_their_answers(server):
    page = httpx.get(server.url + "/", headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html") and "specdeck" in page.text
    csp = page.headers["content-security-policy"]
    script = next(d for d in csp.split(";") if d.strip().startswith("script-src"))
    assert "'self'" in script and "unsafe-inline" not in script and "unsafe-eval" not in script
    assert httpx.get(server.url + "/").text == "specdeck is running"  # curl, probes
    head = httpx.head(server.url + "/")  # Claude Code's reachability probe
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/plain")
    for path in ("/ui", "/ui/static/app.js", "/ui/static/app.css", "/ui/static/vendor/marked/marked.umd.js",
                 "/ui/static/vendor/dompurify/purify.min.js", "/ui/static/vendor/highlight.js/highlight.min.js"):
        assert httpx.get(server.url + path).status_code == 200, path
    # everything the page loads is the server's own: no address elsewhere in the page
    assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text


def test_no_ui_turns_the_page_off(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    s = LiveServer(*pair, ServeSettings(port=free_port(), ui=False), parallel=1, ctx=256)
    try:
        assert httpx.get(s.url + "/", headers=HTML).text == "specdeck is running"
        assert httpx.get(s.url + "/ui").status_code == 404
        assert httpx.get(s.url + "/ui/api/conversations").status_code == 404
        assert not (tmp_path / "state" / "conversations.sqlite3").exists()
    finally:
        s.close()


def test_conversations_list_rename_search_delete(server):
    a = new(server, title="Sorting in Python", model="tiny", system="Be brief.", settings={"temperature": 0})
    b = new(server, messages=[{"role": "user", "content": "what is a monad?"}])
    listed = {c["id"]: c for c in api(server, "GET", "/ui/api/conversations").json()["conversations"]}
    assert listed[a]["title"] == "Sorting in Python" and listed[a]["settings"] == {"temperature": 0}
    assert listed[b]["title"] == "New chat" and listed[b]["messages"] == 1
    r = api(server, "PUT", f"/ui/api/conversations/{b}", json={"title": "Monads"})
    assert r.status_code == 200 and r.json()["title"] == "Monads" and r.json()["messages"][0]["content"] == "what is a monad?"
    found = [c["id"] for c in api(server, "GET", "/ui/api/conversations", params={"q": "MONAD"}).json()["conversations"]]
    assert found == [b]  # by title and by message text, case-insensitive
    assert [c["id"] for c in api(server, "GET", "/ui/api/conversations", params={"q": "100%_"}).json()["conversations"]] == []
    assert api(server, "DELETE", f"/ui/api/conversations/{b}").status_code == 200
    r = api(server, "GET", f"/ui/api/conversations/{b}")
    assert r.status_code == 404 and r.json()["error"]["message"] == f"no conversation {b}"
    assert api(server, "DELETE", f"/ui/api/conversations/{b}").status_code == 404


def test_a_turn_is_written_by_the_server_with_the_apis_own_figures(server):
    cid = new(server, settings={"temperature": 0, "max_tokens": 12})
    r = api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"content": "a b c the def"})
    assert r.status_code == 200, r.text
    mid = r.json()["message"]
    with httpx.stream("GET", f"{server.url}/ui/api/messages/{mid}/events", timeout=60) as events:
        snaps = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")]
    assert snaps[-1]["state"] == "done" and all(s["state"] == "streaming" for s in snaps[:-1])
    conv = settled(server, cid)
    user, answer = conv["messages"]
    assert user["role"] == "user" and answer["role"] == "assistant" and answer["content"] == snaps[-1]["content"]
    assert conv["title"] == "a b c the def"  # a new chat is named by its first message
    st = answer["stats"]
    assert st["usage"]["completion_tokens"] == st["predicted_n"] == 12 and st["finish_reason"] == "length"
    assert st["draft_n"] >= st["draft_n_accepted"] >= 0 and st["tokens_per_step"] >= 1 and st["speculative"] is True
    # the same request through the API gives the same text: the page's turn is an API request
    direct = httpx.post(server.url + "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "a b c the def"}],
                                                                   "temperature": 0, "max_tokens": 12}, timeout=60).json()
    assert direct["choices"][0]["message"]["content"] == answer["content"]
    # regenerate with speculation off, and compare: the other run's figures beside the first's
    r = api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"at": 1, "speculative": False})
    again = settled(server, cid)["messages"]
    assert len(again) == 2 and again[1]["content"] == answer["content"] and again[1]["stats"]["draft_n"] == 0
    # edit and resend: the user message replaced, the answer after it made again
    api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"at": 0, "content": "x y z"})
    edited = settled(server, cid)["messages"]
    assert [m["content"] for m in edited][0] == "x y z" and len(edited) == 2 and edited[1]["state"] == "done"
    api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"at": 0, "content": "a b c the def"})
    settled(server, cid)
    api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"at": 1, "compare": True})
    compared = settled(server, cid)["messages"][1]["stats"]
    assert compared["compare"]["draft_n"] == 0 and compared["compare"]["same_text"] is True  # the tiny model: greedy both ways
    assert compared["predicted_per_second"] > 0 and compared["compare"]["predicted_per_second"] > 0


def test_an_answer_goes_on_without_its_page_and_stop_frees_the_slot(real_pair, tmp_path, monkeypatch):
    """On the Qwen pair (the tiny model answers faster than a stop can reach it)."""
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    s = LiveServer(real_pair.target, real_pair.draft, ServeSettings(port=free_port()), parallel=1, ctx=2048)
    try:
        cid = new(s, settings={"temperature": 0, "max_tokens": 1500})
        mid = api(s, "POST", f"/ui/api/conversations/{cid}/turns",
                  json={"content": "Write the numbers from 1 to 1000 in words, one per line."}).json()["message"]
        # nobody follows it: the server writes it all the same, saved as it grows
        grew = wait_for(lambda: (m := api(s, "GET", f"/ui/api/conversations/{cid}").json()["messages"][1])["content"] and m,
                        timeout=120)
        assert grew and grew["state"] == "streaming", grew
        r = api(s, "POST", f"/ui/api/conversations/{cid}/turns", json={"content": "again"})
        assert r.status_code == 409  # one answer at a time in a conversation
        assert api(s, "POST", f"/ui/api/messages/{mid}/stop").json() == {"stopped": True}
        answer = settled(s, cid)["messages"][1]
        assert answer["state"] == "stopped" and 0 < answer["stats"]["predicted_n"] < 1500
        assert answer["content"].startswith(grew["content"])  # kept as far as it came
        # the engine ends the request at its next step (a step of the pair with its draft: a fraction of a second)
        freed = wait_for(lambda: (st := httpx.get(s.url + "/v1/status").json())["busy_slots"] == 0 and st, timeout=10, every=0.05)
        assert freed and {x["state"] for x in freed["slots"]} == {"idle"}, httpx.get(s.url + "/v1/status").json()["slots"]
    finally:
        s.close()


def test_export_then_import_gives_equal_conversations(server):
    cid = new(server, title="Round trip", system="sys", settings={"top_k": 5},
              messages=[{"role": "user", "content": "hi <b>there</b>", "images": ["data:image/png;base64,iVBORw0KGgo="]},
                        {"role": "assistant", "content": "hello", "reasoning": "think", "stats": {"predicted_n": 1},
                         "tool_calls": [{"name": "f", "arguments": "{}"}], "state": "stopped"}])
    before = api(server, "GET", "/ui/api/conversations").json()["conversations"]
    exported = api(server, "GET", "/ui/api/export")
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    lines = exported.text.splitlines()
    assert len(lines) == len(before)
    r = api(server, "POST", "/ui/api/import", content=exported.text)
    assert r.status_code == 200 and r.json()["imported"] == len(before)
    mine = [json.loads(line) for line in lines if json.loads(line)["title"] == "Round trip"]
    copies = [c for c in api(server, "GET", "/ui/api/conversations").json()["conversations"] if c["title"] == "Round trip"]
    assert len(copies) == 2 and cid in {c["id"] for c in copies}
    for c in copies:
        got = api(server, "GET", f"/ui/api/conversations/{c['id']}").json()
        assert {k: v for k, v in got.items() if k != "id"} | {"messages": [{k: v for k, v in m.items() if k != "id"}
                                                                        for m in got["messages"]]} == mine[0]
    # a line needs only a title and messages with role and content
    r = api(server, "POST", "/ui/api/import", content='{"title": "bare", "messages": [{"role": "user", "content": "x"}]}\n')
    assert r.status_code == 200 and r.json()["imported"] == 1


@pytest.mark.parametrize("body,says", [
    ('{"title": "ok", "messages": []}\n{"title": "broken", ', "line 2: not JSON"),
    ('{"messages": []}', "line 1.title: must be a non-empty string"),
    ('{"title": "x", "messages": [{"role": "wizard", "content": "x"}]}', "line 1.messages[0].role: must be one of"),
    ('{"title": "x", "messages": [{"role": "user"}]}', "line 1.messages[0].content: must be a string"),
    ('{"title": "x", "messages": [{"role": "user", "content": "x", "images": ["http://evil/x.png"]}]}', "images: each must be a data:image"),
    ('[1, 2]', "line 1: must be a JSON object"),
    ("\n\n", "nothing to import"),
])
def test_a_bad_import_is_a_clear_400_and_stores_nothing(server, body, says):
    n = len(api(server, "GET", "/ui/api/conversations").json()["conversations"])
    r = api(server, "POST", "/ui/api/import", content=body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    assert len(api(server, "GET", "/ui/api/conversations").json()["conversations"]) == n


def test_other_bad_input_is_a_clear_4xx(server):
    r = api(server, "POST", "/ui/api/import", content=b"\xff\xfe not utf-8")
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    r = api(server, "POST", "/ui/api/import", content=b"x" * (2 << 20))
    assert r.status_code == 413
    r = api(server, "PUT", "/ui/api/conversations/has%20space", json={"title": "x"})
    assert r.status_code == 400 and "conversation id" in r.json()["error"]["message"]
    r = api(server, "POST", "/ui/api/conversations", json={"messages": [{"role": "user", "content": 5}]})
    assert r.status_code == 400 and "messages[0].content" in r.json()["error"]["message"]
    assert api(server, "GET", "/ui/api/messages/nope/events").status_code == 404
    assert api(server, "POST", "/ui/api/conversations/nope/turns", json={"content": "x"}).status_code == 404
    cid = new(server)
    r = api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={})
    assert r.status_code == 400 and "does not end with a user message" in r.json()["error"]["message"]
    r = api(server, "POST", f"/ui/api/conversations/{cid}/turns", json={"content": "x", "settings": {"temperature": 9}})
    assert r.status_code == 200
    answer = settled(server, cid)["messages"][1]  # the route's own refusal, kept in the message
    assert answer["state"] == "error" and "temperature" in answer["stats"]["error"]


def test_each_key_sees_only_its_own_conversations(keyed):
    page = httpx.get(keyed.url + "/", headers=HTML)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]  # the page asks for the key itself
    assert httpx.get(keyed.url + "/ui/static/app.js").status_code == 200
    assert api(keyed, "GET", "/ui/api/conversations").status_code == 401
    assert api(keyed, "GET", "/ui/api/conversations", "sk-wrong").status_code == 401
    mine = new(keyed, "sk-alice-1", title="alice's")
    assert api(keyed, "GET", "/ui/api/conversations", "sk-bob-2").json()["conversations"] == []
    for method, path, kw in (("GET", f"/ui/api/conversations/{mine}", {}), ("DELETE", f"/ui/api/conversations/{mine}", {}),
                             ("PUT", f"/ui/api/conversations/{mine}", {"json": {"title": "bob's now"}}),
                             ("POST", f"/ui/api/conversations/{mine}/turns", {"json": {"content": "x"}})):
        assert api(keyed, method, path, "sk-bob-2", **kw).status_code == 404, (method, path)
    assert api(keyed, "GET", f"/ui/api/conversations/{mine}", "sk-alice-1").json()["title"] == "alice's"
    assert api(keyed, "GET", "/ui/api/export", "sk-bob-2").text == ""
    api(keyed, "POST", f"/ui/api/conversations/{mine}/turns", "sk-alice-1", json={"content": "a b", "settings": {"max_tokens": 4}})
    assert settled(keyed, mine, "sk-alice-1")["messages"][1]["state"] == "done"


def test_the_store_survives_a_restart_and_marks_what_was_being_written(tmp_path):
    db = tmp_path / "c.sqlite3"
    s = Store(db)
    cid = s.create("", "kept", messages=[Message("user", "q")])
    mid = s.append("", cid, Message("assistant", state="streaming"))
    s.write(mid, content="half an ans")
    again = Store(db)  # the server started again: what it was writing is kept as far as it came
    m = again.get("", cid)["messages"][1]
    assert m["content"] == "half an ans" and m["state"] == "interrupted"
    assert again.list("other") == [] and again.list("")[0]["title"] == "kept"


def test_the_vendored_libraries_are_the_pinned_tarballs_files_with_their_licences():
    """Each copied file is the one scripts/vendor_ui.py took from the pinned, integrity-checked npm
    tarball (its SHA-256 recorded then), and each library carries its licence."""
    import hashlib
    from pathlib import Path

    vendor = Path(__file__).resolve().parent.parent / "app" / "ui" / "static" / "vendor"
    lock = json.loads((vendor / "vendor.json").read_text())
    for lib in lock["libraries"]:
        assert lib["integrity"].startswith("sha512-") and lib["version"] and lib["why"]
        assert "LICENSE" in lib["files"].values()
        assert set(lib["sha256"]) == set(lib["files"].values())
        for name, digest in lib["sha256"].items():
            assert hashlib.sha256((vendor / lib["name"] / name).read_bytes()).hexdigest() == digest, (lib["name"], name)
    on_disk = {str(p.relative_to(vendor)) for p in vendor.rglob("*") if p.is_file()} - {"vendor.json"}
    assert on_disk == {f"{lib['name']}/{n}" for lib in lock["libraries"] for n in lib["files"].values()}


def test_the_page_and_its_turns_over_tls(pair, certificate, tmp_path):
    """`serve --tls-cert`: the page, its API and a turn written through the server's own route."""
    from support.live import Serve

    cert, key = certificate
    port = free_port()
    s = Serve("--target", str(pair[0]), "--port", str(port), "--ctx", "256", "--tls-cert", str(cert), "--tls-key", str(key),
              env={"SPECDECK_HOME": str(tmp_path)})
    try:
        assert s.wait_line("models loaded", stall=120), s.output
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=str(cert)), timeout=60) as c:
            page = c.get("/", headers=HTML)
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            cid = c.post("/ui/api/conversations", json={"settings": {"max_tokens": 4}}).json()["id"]
            assert c.post(f"/ui/api/conversations/{cid}/turns", json={"content": "a b"}).status_code == 200
            for _ in range(200):
                m = c.get(f"/ui/api/conversations/{cid}").json()["messages"][1]
                if m["state"] != "streaming":
                    break
                time.sleep(0.1)
            assert m["state"] == "done" and m["stats"]["predicted_n"] == 4, m
    finally:
        s.stop()


def test_stores_opened_at_once_on_one_folder_all_open(tmp_path):
    """Instances started together on one state folder (behind nginx) each open the store."""
    import threading

    errors, start = [], threading.Barrier(6)

    def one() -> None:
        start.wait()
        try:
            Store(tmp_path / "c.sqlite3").create("", "x")
        except Exception as e:  # noqa: BLE001 - what the test counts
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(Store(tmp_path / "c.sqlite3").list("")) == 6
