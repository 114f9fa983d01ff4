"""The chat page in a real browser: Debian's Chromium driven by Playwright for Python, against
`specdeck serve` on the real Qwen pair (with a vision projector stand-in) beside a tiny model. A
message is sent and streams with its figures; stop frees the slot; an image is answered; the picker
switches models; an answer goes on while its page is elsewhere; a conversation survives a reload and
a server restart; export then import round-trips; a hostile conversation runs no script; with keys
the page asks for one and says when it is wrong. The monitor (/ui/monitor) on the same server: a
page opened after a burst shows it from the history; a generation's points arrive live and add up
to /metrics' counters; the picker switches the model's plots, not the machine's; no GPU is said,
not drawn; a restart is a gap in the lines, not an error; with keys it asks for one. Nothing the
page loads leaves the server, and the console shows no error. Screenshots go to SPECDECK_SCREENSHOTS (default: the test's folder).

Without Chromium the tests skip in one line, except under CI=true, where they fail."""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from support.live import Serve, free_port, wait_for
from support.tinymodels import write_tiny_model

from app.gguf.info import read_model_info
from app.gguf.synthetic_projector import write_mmproj

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH = ["--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--no-first-run"]
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CTX = 2048

if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        pytest.fail("no chromium: install.sh --test installs Debian's chromium (as root)", pytrace=False)
    pytest.skip("no chromium here: the browser tests need Debian's chromium (bash scripts/chromium.sh)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def site(real_pair, tmp_path_factory):
    """`specdeck serve` with two models (coder: the Qwen pair and a projector stand-in; tiny), its
    conversations in a state folder of the module's own; `restart(*flags)` starts it again there."""
    d = tmp_path_factory.mktemp("ui-browser")
    tiny = write_tiny_model(d / "tiny.gguf", seed=0, chat_template=TEMPLATE)
    mmproj = write_mmproj(d / "mmproj.gguf", read_model_info(real_pair.target).n_embd)
    cfg = d / "config.toml"
    cfg.write_text(f'[models.coder]\nmodel = "{real_pair.target}"\ndraft = "{real_pair.draft}"\nmmproj = "{mmproj}"\n'
                   f'ctx = {CTX}\nparallel = 1\n[models.tiny]\nmodel = "{tiny}"\nctx = 512\nparallel = 1\n')
    port = free_port()
    env = {"SPECDECK_HOME": str(d / "home"), "XDG_CONFIG_HOME": str(d / "config")}
    shots = Path(os.environ.get("SPECDECK_SCREENSHOTS") or d / "shots")
    shots.mkdir(parents=True, exist_ok=True)

    class Site:
        url = f"http://127.0.0.1:{port}"
        folder, screenshots = d, shots
        serve = None

        def start(self, *flags: str) -> None:
            self.serve = Serve("--config", str(cfg), "--port", str(port), "--ram", "20GiB", "--threads", "2", *flags, env=env)
            assert self.serve.wait_line("models loaded", stall=300), self.serve.output

        def stop(self) -> None:
            if self.serve is not None:
                self.serve.stop()
                self.serve = None

    s = Site()
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH)
        yield b
        b.close()


class Page:
    """A page with what it logged: console errors, uncaught errors, dialogs, requests that left loopback."""

    def __init__(self, browser, site) -> None:
        self.context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 860})
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.dialogs: list[str] = []
        self.context.route("**/*", self._only_loopback)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("dialog", self._dialog)
        self.site = site
        self.page.goto(site.url + "/")

    def _only_loopback(self, route) -> None:
        url = route.request.url
        if url.startswith(("http://127.0.0.1:", "data:", "blob:")):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def _dialog(self, d) -> None:
        self.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def tab(browser, site):
    t = Page(browser, site)
    yield t
    t.close()
    assert t.outside == [], f"the page asked for addresses past the server: {t.outside}"


def answers(page) -> list:
    return page.locator('[data-testid="message-assistant"]').all()


def last_answer(page):
    return page.locator('[data-testid="message-assistant"]').last


def wait_state(page, state: str, timeout: float = 120_000) -> None:
    page.wait_for_function(
        "s => { const a = document.querySelectorAll('[data-testid=message-assistant]'); "
        "return a.length && a[a.length - 1].dataset.state === s; }", arg=state, timeout=timeout)


def settings(page, **values) -> None:
    page.click("#settings > summary")
    for k, v in values.items():
        page.fill(f"#{k}", str(v))
    page.click("#settings > summary")


def new_chat(page) -> None:
    page.click('[data-testid="new-chat"]')
    page.wait_for_selector("#messages .empty")


def send(page, text: str, answered: bool = True) -> None:
    """Type and send with Enter; `answered`: wait until the answer to it is on the page."""
    n = len(answers(page))
    page.fill('[data-testid="input"]', text)
    page.press('[data-testid="input"]', "Enter")
    if answered:
        page.wait_for_function("n => document.querySelectorAll('[data-testid=message-assistant]').length > n", arg=n)


def test_a_message_streams_with_its_figures(tab, site):
    page = tab.page
    page.wait_for_selector('[data-testid="model"] option[value="coder"]', state="attached")
    new_chat(page)
    settings(page, temperature=0, max_tokens=96)
    page.fill('[data-testid="input"]', "Write a Python function that reverses a list.")
    page.press('[data-testid="input"]', "Shift+Enter")  # a new line, not a send
    assert page.input_value('[data-testid="input"]').endswith("\n") and answers(page) == []
    page.keyboard.type("Then show one example.")
    page.press('[data-testid="input"]', "Enter")
    page.wait_for_selector('[data-testid="message-assistant"][data-state="streaming"]')
    live = page.wait_for_selector('[data-stat="tps"]', timeout=120_000).inner_text()
    wait_state(page, "done")
    answer = last_answer(page)
    assert "tokens/s (live)" in live or "tokens/s" in live
    stats = {k: answer.locator(f'[data-stat="{k}"] b').inner_text()
             for k in ("prompt", "ttft", "tps", "tokens", "per_decode", "drafts", "drafter", "context")}
    assert float(stats["tps"]) > 0 and int(stats["tokens"].replace(",", "")) > 0 and float(stats["per_decode"]) >= 1
    assert stats["context"].endswith(f"/ {CTX:,}") and "cached" in stats["prompt"]
    assert "/" in stats["drafts"] and stats["drafter"]
    assert answer.locator('[data-testid="content"]').inner_text().strip()
    page.screenshot(path=str(site.screenshots / "chat.png"), full_page=False)
    # the figures are the API's own record of that request
    conv = httpx.get(site.url + "/ui/api/conversations").json()["conversations"][0]
    stored = httpx.get(f"{site.url}/ui/api/conversations/{conv['id']}").json()["messages"][1]["stats"]
    assert int(stats["tokens"].replace(",", "")) == stored["predicted_n"] == stored["usage"]["completion_tokens"]
    assert tab.errors == [], tab.errors


def test_compare_shows_both_speeds(tab, site):
    page = tab.page
    last_answer(page).locator('[data-testid="compare-again"]').click()
    wait_state(page, "done", timeout=240_000)
    page.wait_for_function("() => { const c = document.querySelector('[data-testid=compare]'); "
                           "return c && c.textContent.includes('vs off'); }", timeout=240_000)
    text = last_answer(page).locator('[data-testid="compare"]').inner_text()
    assert "tok/s" in text and "×" in text
    page.screenshot(path=str(site.screenshots / "compare.png"))
    assert tab.errors == [], tab.errors


def test_stop_cancels_on_the_server_and_frees_the_slot(tab, site):
    page = tab.page
    settings(page, temperature=0, max_tokens=1500)
    send(page, "Write the numbers from 1 to 1000 in words, one per line.")
    page.wait_for_function("() => { const a = [...document.querySelectorAll('[data-testid=message-assistant]')].pop(); "
                           "return a && a.querySelector('[data-stat=tokens] b') && "
                           "parseInt(a.querySelector('[data-stat=tokens] b').textContent) >= 8; }", timeout=120_000)
    page.click('[data-testid="stop"]')
    wait_state(page, "stopped")
    assert "stopped" in last_answer(page).locator('[data-testid="badge"]').inner_text()
    status = wait_for(lambda: (s := httpx.get(site.url + "/v1/status", params={"model": "coder"}).json())["busy_slots"] == 0 and s,
                      timeout=10)
    assert status, "the slot was not freed"
    assert tab.errors == [], tab.errors


def test_an_image_is_answered_and_a_model_without_a_projector_says_so(tab, site):
    page = tab.page
    settings(page, temperature=0, max_tokens=24)
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 40)).save(buf, "PNG")
    png = site.folder / "red.png"
    png.write_bytes(buf.getvalue())
    page.set_input_files('[data-testid="attach"]', str(png))
    page.wait_for_selector('[data-testid="attachments"] img')
    send(page, "What colour is this picture?")
    wait_state(page, "done")
    user = page.locator('[data-testid="message-user"]').last
    assert user.locator("img").count() == 1 and last_answer(page).locator('[data-stat="tokens"]').count() == 1
    # the tiny model has no projector: the page says so before anything is sent
    page.select_option('[data-testid="model"]', "tiny")
    page.set_input_files('[data-testid="attach"]', str(png))
    page.wait_for_selector('[data-testid="notice"]:not(.hidden)')
    assert "no vision projector" in page.inner_text('[data-testid="notice"]')
    n = len(answers(page))
    send(page, "and this one?", answered=False)
    page.wait_for_timeout(500)
    assert len(answers(page)) == n
    page.locator('[data-testid="attachments"] button').click()
    assert tab.errors == [], tab.errors


def test_the_picker_switches_models(tab, site):
    page = tab.page
    new_chat(page)
    page.select_option('[data-testid="model"]', "tiny")
    settings(page, max_tokens=8)
    send(page, "a b c")
    wait_state(page, "done")
    assert last_answer(page).locator(".who span").first.inner_text() == "tiny"
    page.select_option('[data-testid="model"]', "coder")
    assert tab.errors == [], tab.errors


def test_an_answer_goes_on_while_its_page_is_elsewhere_and_survives_a_reload(tab, site):
    page = tab.page
    new_chat(page)
    settings(page, temperature=0, max_tokens=64)
    send(page, "Count from one to twenty in words.")
    page.wait_for_selector('[data-testid="message-assistant"][data-state="streaming"]')
    new_chat(page)  # leave it mid-answer
    page.wait_for_timeout(3000)
    page.locator('[data-testid="conversation"]', has_text="Count from one").click()
    wait_state(page, "done")
    whole = last_answer(page).locator('[data-testid="content"]').inner_text()
    assert whole.strip()
    page.reload()
    page.wait_for_selector('[data-testid="message-assistant"][data-state="done"]')
    assert last_answer(page).locator('[data-testid="content"]').inner_text() == whole
    assert tab.errors == [], tab.errors


def test_export_then_import_round_trips(tab, site):
    page = tab.page
    n = page.locator('[data-testid="conversation"]').count()
    with page.expect_download() as got:
        page.click('[data-testid="export"]')
    path = site.folder / "export.jsonl"
    got.value.save_as(path)
    lines = path.read_text().splitlines()
    assert len(lines) == n and all(json.loads(line)["messages"] for line in lines)
    page.set_input_files('[data-testid="import-file"]', str(path))
    page.wait_for_function("n => document.querySelectorAll('[data-testid=conversation]').length === 2 * n", arg=n)
    assert f"Imported {n}" in page.inner_text('[data-testid="banner"]')
    assert tab.errors == [], tab.errors


def test_a_hostile_conversation_runs_no_script(tab, site):
    page = tab.page
    hostile = ['<img src=x onerror="window.__pwned=1;alert(1)">', "<script>window.__pwned=2</script>",
               "[click me](javascript:window.__pwned=3)", '<a href="javascript:alert(4)">link</a>',
               '<svg onload="window.__pwned=5"></svg>', '<iframe src="javascript:alert(6)"></iframe>']
    line = json.dumps({"title": "hostile <img src=x onerror=alert(7)>", "messages": [
        {"role": "user", "content": hostile[0] + hostile[1]},
        {"role": "assistant", "content": "\n\n".join(hostile), "reasoning": hostile[0],
         "tool_calls": [{"name": "<script>alert(8)</script>", "arguments": hostile[0]}]}]})
    r = httpx.post(site.url + "/ui/api/import", content=line + "\n")
    assert r.status_code == 200, r.text
    page.reload()
    page.locator('[data-testid="conversation"]', has_text="hostile").first.click()
    page.wait_for_selector('[data-testid="message-assistant"]')
    page.locator('[data-testid="reasoning"] summary').click()
    page.click('[data-testid="content"] a >> nth=0') if page.locator('[data-testid="content"] a').count() else None
    page.wait_for_timeout(500)
    assert page.evaluate("window.__pwned") is None
    assert tab.dialogs == []
    assert page.evaluate("document.querySelectorAll('#messages script, #messages iframe, #messages [onerror], "
                         "#messages [onload], #messages a[href^=\"javascript\"]').length") == 0
    assert "onerror" in page.inner_text('[data-testid="message-user"]')  # shown as text, not run
    page.screenshot(path=str(site.screenshots / "hostile.png"))
    assert tab.errors == [], tab.errors  # not even a blocked attempt: raw HTML is text, never parsed as markup


def test_a_conversation_clicked_while_the_page_reopens_the_last_one_is_the_one_shown(tab, site):
    """At start the page reopens the last conversation; one clicked before that answer comes is the one
    shown (the later answer is dropped), not the one the page was reopening."""
    page = tab.page
    for title, words in (("race first", "the first one"), ("race second", "the second one")):
        line = json.dumps({"title": title, "messages": [{"role": "user", "content": words},
                                                        {"role": "assistant", "content": "ok " + words}]})
        assert httpx.post(site.url + "/ui/api/import", content=line + "\n").status_code == 200
    page.reload()
    page.locator('[data-testid="conversation"]', has_text="race first").first.click()
    page.wait_for_selector('[data-testid="message-user"]:has-text("the first one")')
    first = page.locator('[data-testid="conversation"]', has_text="race first").first.get_attribute("data-id")
    held = []

    def hold(route) -> None:  # the page's reopening waits here until released
        held.append(route)
    page.route(f"**/ui/api/conversations/{first}", hold)
    try:
        page.reload()
        page.wait_for_function("() => document.querySelectorAll('[data-testid=conversation]').length > 0")
        page.wait_for_timeout(200)
        assert len(held) == 1, "the page did not reopen the last conversation at start"
        page.locator('[data-testid="conversation"]', has_text="race second").first.click()
        page.wait_for_selector('[data-testid="message-user"]:has-text("the second one")')
        held[0].continue_()
        page.wait_for_timeout(500)
    finally:
        page.unroute(f"**/ui/api/conversations/{first}", hold)
    assert "the second one" in page.inner_text("#messages") and "the first one" not in page.inner_text("#messages")
    assert page.locator('[data-testid="conversation"].active').inner_text().startswith("race second")
    assert tab.errors == [], tab.errors


# -- the monitor (/ui/monitor): the same page, server and browser --------------------------------

def chart_data(page, chart: str) -> list[list]:
    """A chart's data as uPlot holds it: [t, series...]."""
    return page.evaluate("c => window.specdeckMonitor.charts.get(c).uplot.data.map(a => Array.from(a))", chart)


def chart_series(page, chart: str) -> list[str]:
    return page.evaluate("c => window.specdeckMonitor.charts.get(c).series.map(s => s.col)", chart)


def model_metric(site, name: str, model: str = "coder") -> float:
    """A metric of one model, from the server's /metrics."""
    return sum(smp.value for fam in text_string_to_metric_families(httpx.get(site.url + "/metrics").text)
               for smp in fam.samples if smp.name == name and smp.labels.get("model") == model)


def made(t: list, v: list) -> float:
    """Σ rate × seconds: the tokens a rate plot says were made."""
    return sum(v[i] * (t[i] - t[i - 1]) for i in range(1, len(t)) if v[i] is not None)


@pytest.fixture(scope="module")
def monitor(browser, site):
    """A monitor page, opened once the chat tests above have made their requests."""
    t = Page(browser, site)
    t.opened = time.time()
    t.page.goto(site.url + "/ui/monitor")
    t.page.wait_for_selector('[data-testid="chart-speed"]')
    yield t
    t.close()
    assert t.outside == [], f"the monitor asked for addresses past the server: {t.outside}"


def test_a_monitor_opened_after_a_burst_shows_it_from_the_history(monitor, site):
    """The chat tests above made the burst; this page opened after it."""
    page = monitor.page
    t, generated, _prompt = chart_data(page, "speed")
    before = [g for x, g in zip(t, generated, strict=True) if x < monitor.opened and g]
    assert before, "the chat tests' answers are not in the history"
    assert made(t, generated) == pytest.approx(model_metric(site, "specdeck_completion_tokens_total"), rel=0.01, abs=1)
    assert page.locator('[data-testid="no-gpu"]').is_visible()  # no NVML here: said, not empty axes
    assert page.locator('[data-testid^="chart-gpu"]').count() == 0
    for chart in ("ttft", "acceptance", "accepted_length", "tokens_per_decode", "drafting", "requests", "context",
                  "host_memory", "host_cpu"):
        assert page.locator(f'[data-testid="chart-{chart}"]').is_visible(), chart
    assert "context_tokens:0" in chart_series(page, "context")
    assert any(c.startswith("acceptance_rate:") for c in chart_series(page, "acceptance"))  # per drafter
    page.wait_for_function("() => document.querySelectorAll('[data-testid=mon-plan] tr').length > 3")
    assert "monitor history" in page.inner_text('[data-testid="mon-plan"]')
    assert "coder: loaded" in page.inner_text('[data-testid="mon-models"]')
    assert monitor.errors == [], monitor.errors


def test_the_monitor_follows_a_generation_live(monitor, site):
    page = monitor.page
    body = {"model": "coder", "messages": [{"role": "user", "content": "Write a Python class for a binary search tree "
                                            "with insert, delete and an in-order walk."}],
            "max_tokens": 160, "temperature": 0, "stream": True}
    seen: dict = {}

    def ask() -> None:
        with httpx.stream("POST", site.url + "/v1/chat/completions", json=body, timeout=600) as r:
            seen["status"] = r.status_code
            for _ in r.iter_lines():
                pass

    worker = threading.Thread(target=ask)
    worker.start()
    try:
        page.wait_for_function("() => { const M = window.specdeckMonitor, r = M.cols.requests_running, g = M.cols.generated_tokens_per_second;"
                               " return r[r.length - 1] === 1 && g[g.length - 1] > 0; }", timeout=120_000)
        busy = model_metric(site, "specdeck_busy_slots")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(site.screenshots / "monitor.png"))
        assert busy == 1 and chart_data(page, "requests")[1][-1] in (0, 1)
        assert "generated" in page.inner_text('[data-testid="now-speed"]')
    finally:
        worker.join(600)
    assert seen["status"] == 200
    page.wait_for_timeout(2500)  # the last tokens' row
    t, generated, _ = chart_data(page, "speed")
    assert t == sorted(set(t)), "a point came twice"
    assert made(t, generated) == pytest.approx(model_metric(site, "specdeck_completion_tokens_total"), rel=0.01, abs=1)
    _, drafted, accepted = chart_data(page, "drafting")
    assert made(t, accepted) == pytest.approx(model_metric(site, "specdeck_draft_accepted_total"), rel=0.01, abs=1)
    assert made(t, drafted) == pytest.approx(model_metric(site, "specdeck_draft_tokens_total"), rel=0.01, abs=1)
    # the page's points are the server's
    cols = httpx.get(site.url + "/ui/api/series", params={"model": "coder", "since": t[-10] - 0.01}).json()["columns"]
    n = min(len(cols["t"]), 8)
    assert t[-10:][:n] == cols["t"][:n] and generated[-10:][:n] == cols["generated_tokens_per_second"][:n]
    assert monitor.errors == [], monitor.errors


def test_the_monitor_follows_the_model_picked(monitor, site):
    page = monitor.page
    host_coder = chart_data(page, "host_memory")
    page.select_option('[data-testid="mon-model"]', "tiny")
    page.wait_for_function("() => window.specdeckMonitor.shown === 'tiny'")
    t, generated, _ = chart_data(page, "speed")
    assert made(t, generated) == pytest.approx(model_metric(site, "specdeck_completion_tokens_total", "tiny"), rel=0.01, abs=1)
    # the machine's plots are the machine's, whichever model is picked
    host_tiny = chart_data(page, "host_memory")
    common = set(host_coder[0]) & set(host_tiny[0])
    assert common and all(host_coder[1][host_coder[0].index(x)] == host_tiny[1][host_tiny[0].index(x)] for x in common)
    page.select_option('[data-testid="mon-model"]', "coder")
    page.wait_for_function("() => window.specdeckMonitor.shown === 'coder'")
    assert monitor.errors == [], monitor.errors


def test_a_conversation_survives_a_server_restart_and_the_monitor_shows_a_gap(tab, monitor, site):
    page = tab.page
    titles = page.locator('[data-testid="conversation"] .title').all_inner_texts()
    site.stop()
    page.wait_for_function("() => document.getElementById('conn').textContent.includes('unreachable')", timeout=30_000)
    monitor.page.wait_for_function("() => document.getElementById('mon-conn').textContent.includes('reconnecting')",
                                   timeout=30_000)
    page.screenshot(path=str(site.screenshots / "server-down.png"))
    restarted = time.time()
    site.start()
    page.wait_for_function("() => !document.getElementById('conn').textContent", timeout=60_000)
    page.reload()
    page.wait_for_selector('[data-testid="conversation"]')
    assert page.locator('[data-testid="conversation"] .title').all_inner_texts() == titles
    page.locator('[data-testid="conversation"]', has_text="Count from one").first.click()
    page.wait_for_selector('[data-testid="message-assistant"][data-state="done"]')
    # the monitor open through it: a break in its lines, then the new server's points; no error
    mon = monitor.page
    mon.wait_for_function("() => !document.getElementById('mon-conn').textContent", timeout=60_000)
    mon.wait_for_function("s => { const t = window.specdeckMonitor.cols.t; return t[t.length - 1] > s + 3; }",
                          arg=restarted, timeout=60_000)
    t, generated, prompt = chart_data(mon, "speed")
    gaps = [k for k in range(1, len(t) - 1) if generated[k] is None and prompt[k] is None and t[k + 1] - t[k] > 1.5]
    assert gaps, "no break in the line where the server was down"
    assert t == sorted(set(t)) and mon.locator('[data-testid="banner"]').is_hidden()
    # the browser logs each request the stopped server did not answer (refused, or a stream cut off)
    assert [e for e in monitor.errors if not e.startswith("Failed to load resource: net::")] == [], monitor.errors


def test_with_keys_the_page_asks_for_one_and_refuses_a_wrong_one(browser, site):
    keys = site.folder / "keys"
    keys.write_text("alice sk-alice-1\n")
    keys.chmod(0o600)
    site.stop()
    site.start("--api-key-file", str(keys))
    t = Page(browser, site)
    try:
        page = t.page
        page.wait_for_selector('[data-testid="key-dialog"][open]')
        page.fill('[data-testid="key"]', "sk-wrong")
        page.click('[data-testid="key-submit"]')
        page.wait_for_selector('[data-testid="key-error"]:not(.hidden)')
        assert "refused" in page.inner_text('[data-testid="key-error"]')
        page.screenshot(path=str(site.screenshots / "key.png"))
        page.fill('[data-testid="key"]', "sk-alice-1")
        page.click('[data-testid="key-submit"]')
        page.wait_for_selector('[data-testid="model"] option[value="coder"]', state="attached")
        assert page.locator('[data-testid="conversation"]').count() == 0  # alice's own conversations: none yet
        assert page.evaluate("sessionStorage.getItem('specdeck.key')") == "sk-alice-1"
        assert page.evaluate("localStorage.getItem('specdeck.key')") is None  # kept only for the session
        assert [e for e in t.errors if "401" not in e] == [], t.errors
        assert t.outside == []
    finally:
        t.close()
    m = Page(browser, site)  # the monitor asks too
    try:
        m.page.goto(site.url + "/ui/monitor")
        m.page.wait_for_selector('[data-testid="key-dialog"][open]')
        assert m.page.locator('[data-testid="chart-speed"]').count() == 0
        m.page.fill('[data-testid="key"]', "sk-alice-1")
        m.page.click('[data-testid="key-submit"]')
        m.page.wait_for_selector('[data-testid="chart-speed"]')
        assert httpx.get(site.url + "/ui/api/series").status_code == 401
    finally:
        m.close()
