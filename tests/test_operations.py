"""Operating it as a service: alerts (raised and cleared from injected figures, and on a real
server through bad requests and load), configuration revisions with last-known-good fallback
(a corrupted draft, an impossible context, a busy port), rollback, and pruning that spares what a
good revision uses. Real `specdeck serve` processes on the tiny models."""

from __future__ import annotations

import json
import re
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, run_cli
from support.live import Serve, free_port, wait_for

from app.commands.dashboard import alert_lines, log_line, render
from app.ops.alerts import NAMES, AlertBook, AlertSettings, Observation
from app.server.metrics import Metrics
from app.server.watch import AlertWatcher

SPECDECK = [sys.executable, "-m", "app.cli"]
GIB = 2**30




def drawn(snap: dict) -> str:
    """The dashboard as it appears on an 80-column terminal."""
    from rich.console import Console

    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(render(snap))
    return console.export_text()


# -- alerts from injected figures ----------------------------------------------------------------

def book(**settings) -> AlertBook:
    return AlertBook(AlertSettings(**settings), wall=lambda: 1000.0)


def feed(b: AlertBook, *observations: Observation) -> list[set[str]]:
    """The active alert names after each observation."""
    out = []
    for o in observations:
        b.update(o)
        out.append({s.name for s in b.active()})
    return out


def test_acceptance_low_raised_below_the_floor_and_the_baseline_and_cleared():
    b = book(window=60, acceptance_min=0.3, acceptance_margin=0.15, acceptance_min_drafted=50)
    states = feed(b, Observation(t=0, drafted=0, accepted=0),
                  Observation(t=10, drafted=40, accepted=0),  # too few drafted to judge
                  Observation(t=20, drafted=100, accepted=20),  # 0.20 < 0.30
                  Observation(t=100, drafted=300, accepted=200))  # window: (300-100)/.. = 180/200 = 0.90
    assert ["acceptance_low" in s for s in states] == [False, False, True, False]
    # the baseline raises the floor: 0.55 is fine alone, but 0.80 - 0.15 = 0.65 > 0.55
    b = book(window=60, acceptance_min_drafted=50)
    s = feed(b, Observation(t=0, baseline_acceptance=0.8), Observation(t=5, drafted=100, accepted=55, baseline_acceptance=0.8))
    assert "acceptance_low" in s[-1]
    assert b.states["acceptance_low"].threshold == pytest.approx(0.65) and b.states["acceptance_low"].since == 1000.0


def test_vram_high_against_the_watermark_and_the_plan():
    b = book(vram_watermark=0.95, vram_plan_margin=0.10)
    s = feed(b, Observation(t=0, vram_used=int(20 * GIB), vram_total=24 * GIB),
             Observation(t=1, vram_used=int(23.5 * GIB), vram_total=24 * GIB),
             Observation(t=2, vram_used=int(18 * GIB), vram_total=24 * GIB, vram_planned=16 * GIB),  # > 16 x 1.1
             Observation(t=3, vram_used=int(17 * GIB), vram_total=24 * GIB, vram_planned=16 * GIB))
    assert ["vram_high" in x for x in s] == [False, True, True, False]
    assert "GiB" in b.states["vram_high"].message


def test_error_rate_and_queue_saturation_over_the_window():
    b = book(window=10, error_rate=0.25, error_min_requests=8)
    s = feed(b, Observation(t=0, requests=0, failed=0),
             Observation(t=1, requests=5, failed=5),  # 5 requests: too few to judge
             Observation(t=2, requests=10, failed=6),  # 60 %
             Observation(t=20, requests=40, failed=6),  # the window moved on: 0 of 30 in it
             Observation(t=21, requests=41, failed=6, rejected=1),  # a 429
             Observation(t=22, requests=41, failed=6, rejected=1, queue_depth=4, queue_limit=4),
             Observation(t=40, requests=41, failed=6, rejected=1, queue_depth=1, queue_limit=4))
    assert ["error_rate_high" in x for x in s] == [False, False, True, False, False, False, False]
    assert ["queue_saturated" in x for x in s] == [False, False, False, False, True, True, False]


def test_gpu_temperature_power_and_rss_growth():
    b = book(gpu_temperature_margin=5, gpu_power=0.98, rss_growth=0.25, rss_window=600)
    s = feed(b, Observation(t=0, gpu_temperature=70, gpu_slowdown=90, gpu_power=200, gpu_power_limit=350, rss=1000),
             Observation(t=60, gpu_temperature=86, gpu_slowdown=90, gpu_power=345, gpu_power_limit=350, rss=1200),
             Observation(t=605, gpu_temperature=80, gpu_slowdown=None, gpu_power=100, gpu_power_limit=350, rss=1300),
             Observation(t=700, gpu_temperature=60, gpu_slowdown=90, gpu_power=100, gpu_power_limit=350, rss=1310))
    assert ["gpu_temperature_high" in x for x in s] == [False, True, True, False]  # no slowdown reading: 83 - 5
    assert ["gpu_power_high" in x for x in s] == [False, True, False, False]
    # +20 % in the first minute is not judged (no whole window yet); +30 % against the reading 600 s
    # before; then against the reading at t=60 (1200 -> 1310: +9 %)
    assert ["rss_growth" in x for x in s] == [False, False, True, False]
    assert "grew 30% in 605 s" in b.states["rss_growth"].message


def test_rss_growth_waits_for_a_whole_window():
    """A server whose memory doubles in its first seconds (the KV cache faulted in by its first
    requests) raises nothing until it has run a whole RSS window, then judges against the reading one
    window back, as `offset 10m` does in the Prometheus rule."""
    b = book(rss_growth=0.25, rss_window=600, interval=5)
    readings = [Observation(t=t, rss=1000 if t == 0 else 2000 + t // 10) for t in range(0, 1200, 5)]
    s = feed(b, *readings)
    assert not any("rss_growth" in x for x in s[:120])  # t < 600: not a whole window yet
    assert "rss_growth" in s[120]  # t = 600, against t = 0: 1000 -> 2060
    assert not any("rss_growth" in x for x in s[121:])  # then against t - 600: +3 % at most
    assert b.states["rss_growth"].value == pytest.approx((2000 + 119) / (2000 + 59) - 1)


def test_rss_growth_leaves_out_what_the_bounded_caches_hold():
    """Under an agent's requests the host-memory prompt cache fills towards its bound: designed
    growth, not a leak. Only growth beyond the caches' accounted bytes raises the alert."""
    b = book(rss_growth=0.25, rss_window=600, interval=5)
    mib = 2**20
    s = feed(b, Observation(t=0, rss=4600 * mib, cached=100 * mib),
             Observation(t=600, rss=5800 * mib, cached=1250 * mib),  # +1,200 MiB, 1,150 of them cached
             Observation(t=1200, rss=7500 * mib, cached=1300 * mib))  # +1,700 MiB, 50 of them cached
    assert ["rss_growth" in x for x in s] == [False, False, True]
    assert "the caches 1,250 -> 1,300 MiB, not counted" in b.states["rss_growth"].message


def test_watcher_sets_gauges_and_logs_each_transition_once(caplog):
    metrics = Metrics()
    w = AlertWatcher(None, metrics, AlertSettings(window=10, error_min_requests=4))
    with caplog.at_level(logging.INFO, logger="specdeck.server"):
        for t, requests, failed in ((0, 0, 0), (1, 4, 4), (2, 8, 8), (3, 12, 12), (30, 100, 12), (31, 100, 12)):
            w.check(Observation(t=t, requests=requests, failed=failed))
    gauge = lambda name: metrics.registry.get_sample_value("specdeck_alert", {"name": name})  # noqa: E731
    assert gauge("error_rate_high") == 0 and all(gauge(n) == 0 for n in NAMES)
    raised = [r for r in caplog.records if "alert error_rate_high:" in r.getMessage()]
    cleared = [r for r in caplog.records if "alert error_rate_high cleared" in r.getMessage()]
    assert len(raised) == 1 and len(cleared) == 1
    w.check(Observation(t=40, requests=100, failed=12, rejected=3))
    assert gauge("queue_saturated") == 1
    snap = {"alerts": w.to_json(), "plan": {}, "model_id": "x"}
    assert alert_lines(snap) and alert_lines(snap)[0].startswith("queue_saturated since ")
    assert "ALERTS queue_saturated" in log_line(snap)
    screen = drawn(snap)
    assert "ALERT" in screen and "queue_saturated since" in screen


def test_bad_thresholds_are_one_clear_line(tiny, tmp_path):
    r = run_cli("serve", "--target", str(tiny.target), "--alert-error-rate", "lots")
    assert r.returncode != 0 and "--alert-error-rate" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("serve", "--target", str(tiny.target), env={"SPECDECK_ALERT_WINDOW": "soon"})
    assert r.returncode == 1 and "bad setting alerts.window" in r.stderr and "Traceback" not in r.stderr
    config = tmp_path / "c.toml"
    config.write_text("[alerts]\nvram_watermark = 1.5\n")
    r = run_cli("serve", "--target", str(tiny.target), "--config", str(config))
    assert r.returncode == 1 and "bad setting alerts.vram_watermark" in r.stderr
    config.write_text("[alerts]\nno_such_threshold = 1\n")
    r = run_cli("serve", "--target", str(tiny.target), "--config", str(config))
    assert r.returncode == 1 and "no_such_threshold" in r.stderr
    assert not (Path(os.environ["SPECDECK_HOME"]) / "state" / "revisions").exists()  # nothing recorded


# -- a real server -------------------------------------------------------------------------------

def answers(port: int) -> bool:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "a b", "max_tokens": 4, "ignore_eos": True},
                   timeout=60)
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_alerts_on_the_real_server_error_rate_and_queue_saturation(tiny):
    port = free_port()
    s = Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--port", str(port), "--ctx", "2048",
              "--parallel", "1", "--max-queue", "1",
              env={"SPECDECK_ALERT_INTERVAL": "0.2", "SPECDECK_ALERT_WINDOW": "3", "SPECDECK_ALERT_ERROR_MIN_REQUESTS": "5",
                   "SPECDECK_ALERT_ACCEPTANCE_MIN": "0"})  # the random-weight draft's acceptance is ~0: not this test's alert
    url = f"http://127.0.0.1:{port}"
    try:
        assert s.wait_line("models loaded"), s.output
        status = lambda: httpx.get(f"{url}/v1/status").json()  # noqa: E731
        active = lambda: {a["name"] for a in status()["alerts"] if a["active"]}  # noqa: E731
        assert {a["name"] for a in status()["alerts"]} == set(NAMES) and not active()
        for _ in range(8):  # bad requests: each a 400
            assert httpx.post(f"{url}/v1/chat/completions", content=b"{not json").status_code == 400
        assert wait_for(lambda: "error_rate_high" in active(), 10), status()["alerts"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'specdeck_alert{model="custom",name="error_rate_high"} 1.0' in metrics
        assert 'specdeck_queue_limit{model="custom"} 1.0' in metrics
        assert wait_for(lambda: "error_rate_high" not in active(), 15)  # the window moved past them

        def long_request(_):
            return httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 1500, "ignore_eos": True},
                              timeout=120).status_code

        with __import__("concurrent.futures").futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(long_request, range(6)))
            raised = wait_for(lambda: "queue_saturated" in active(), 10)
        assert 429 in codes and 200 in codes, codes
        assert raised or "alert queue_saturated:" in s.output, status()["alerts"]
        assert wait_for(lambda: "queue_saturated" not in active(), 15)
        out = s.output
        assert out.count("alert error_rate_high:") == 1 and out.count("alert error_rate_high cleared") == 1
        assert out.count("alert queue_saturated:") == 1 and out.count("alert queue_saturated cleared") == 1
        snap = {**status(), "totals": {}, "source": url}
        assert "ALERT" not in drawn(snap) and "requests" in drawn(snap)
    finally:
        assert s.stop() == 0, s.output


def history() -> dict:
    r = run_cli("config", "history", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def corrupt_copy(src: Path, dst: Path) -> Path:
    data = bytearray(src.read_bytes())
    dst.write_bytes(bytes(data[: len(data) // 2]))  # tensor data cut short
    return dst


def test_failed_starts_exit_and_with_fallback_start_the_last_good_revision_of_the_same_port(tiny, tmp_path):
    port = free_port()
    base = ["--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512", "--port", str(port)]
    first = Serve(*base)
    assert first.wait_line("models loaded"), first.output
    assert first.stop() == 0
    h = history()
    assert [(r["number"], r["status"]) for r in h["revisions"]] == [(1, "good")] and h["current"]["revision"] == 1
    rev1 = h["revisions"][0]
    assert len(rev1["models"]["draft"]["sha256"]) == 64 and rev1["plan"]["ctx"] == 512 and rev1["settings"]["serve"]["port"] == port

    bad_draft = corrupt_copy(tiny.draft, tmp_path / "broken-draft.gguf")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    cases = {
        "corrupted draft": ["--target", str(tiny.target), "--draft", str(bad_draft), "--ctx", "512", "--port", str(port)],
        "impossible context": ["--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "100000000", "--port", str(port)],
        "port taken": ["--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512", "--port", str(taken)],
    }
    try:
        # what the user named fails: it says why and exits; nothing else is started in its place
        r = run_cli("serve", *cases["corrupted draft"])
        assert r.returncode == 1 and "broken-draft.gguf" in r.stderr and "now serving" not in r.stdout + r.stderr
        assert "Traceback" not in r.stderr and not _health(port)
        for n, what in ((2, "corrupted draft"), (3, "impossible context")):
            s = Serve(*cases[what], "--fallback")
            try:
                assert s.wait_line("models loaded"), f"{what}:\n{s.output}"
                assert f"revision {n} failed (" in s.output and "now serving revision 1" in s.output, s.output
                assert answers(port), what  # the good revision answers, on the same port
                status = httpx.get(f"http://127.0.0.1:{port}/v1/status").json()
                assert status["revision"] == 1 and status["fallback"]["from"] == n, status
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                assert re.search(r'specdeck_fallback_active\{model="[^"]+"\} 1\.0', metrics), metrics
            finally:
                assert s.stop() == 0, s.output
            assert "Traceback" not in s.output
        # a fallback never moves a client: revision 1 listens on another port, so none is started
        r = run_cli("serve", *cases["port taken"], "--fallback")
        assert r.returncode == 1 and f"{taken}" in r.stderr and "now serving" not in r.stdout + r.stderr, r.stderr
        assert f"no earlier revision on 127.0.0.1:{taken} was good" in r.stderr, r.stderr
    finally:
        busy.close()
    h = history()
    assert [(r["number"], r["status"]) for r in h["revisions"]] == [(1, "good"), (2, "failed"), (3, "failed"), (4, "failed")]
    fails = {r["number"]: r["failure"] for r in h["revisions"]}
    assert "broken-draft.gguf" in fails[2] and "100,000,000" in fails[3] and f"{taken}" in fails[4]
    assert h["current"]["revision"] == 1 and h["current"]["fallback"]["from"] == 3
    assert bad_draft.exists() and tiny.draft.exists() and tiny.target.exists()  # nothing deleted

    table = run_cli("config", "history")
    assert table.returncode == 0 and "failed" in table.stdout and "fallback from revision 3" in table.stdout

    # the same configuration again is the same revision; --no-fallback (the default) exits
    r = run_cli("serve", *cases["corrupted draft"], "--no-fallback")
    assert r.returncode == 1 and "broken-draft.gguf" in r.stderr and "Traceback" not in r.stderr
    assert len(history()["revisions"]) == 4 and history()["revisions"][1]["starts"] == 3

    # rollback: a chosen revision starts again; one that does not exist is one clear line
    r = run_cli("rollback", "9")
    assert r.returncode == 1 and "there is no revision 9" in r.stderr
    r = run_cli("rollback", "2", "--no-such-flag")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    p = subprocess.Popen([*SPECDECK, "rollback", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: _health(port), 60)
        assert answers(port)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    assert history()["revisions"][0]["starts"] == 4  # its own start, two fallbacks, the rollback


def _health(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_failed_start_with_no_good_revision_says_so(tiny, tmp_path):
    bad = corrupt_copy(tiny.draft, tmp_path / "bad.gguf")
    r = run_cli("serve", "--target", str(tiny.target), "--draft", str(bad), "--port", str(free_port()), "--fallback")
    assert r.returncode == 1 and "bad.gguf" in r.stderr and "no earlier revision on" in r.stderr and "was good" in r.stderr
    assert [x["status"] for x in history()["revisions"]] == ["failed"]
    r = run_cli("rollback")
    assert r.returncode == 1 and "no good revision to roll back to" in r.stderr


def test_prune_removes_only_what_no_good_revision_uses(tiny, tmp_path):
    from app.ops.revisions import RevisionStore
    from app.settings import paths

    store = paths().store
    used, unused = store / ("a" * 64) / "used.gguf", store / ("b" * 64) / "unused.gguf"
    for f in (used, unused):
        f.parent.mkdir(parents=True)
        f.write_bytes(tiny.draft.read_bytes())
    st = RevisionStore(paths().state)
    good = st.record("serve", {"target": str(used)}, {}, {"target": {"ref": str(used), "path": str(used), "sha256": "x"}})
    st.mark_good(good)
    failed = st.record("serve", {"target": str(unused)}, {}, {"target": {"ref": str(unused), "path": str(unused), "sha256": "y"}})
    st.mark_failed(failed, "it broke")
    r = run_cli("models", "--prune", "--dry-run")
    assert r.returncode == 0 and "would remove" in r.stdout and unused.exists() and used.exists()
    r = run_cli("models", "--prune")
    assert r.returncode == 0, r.stderr
    assert used.exists() and not unused.exists() and not unused.parent.exists()
    assert "removed" in r.stdout and "1 file(s) removed" in r.stdout


def test_under_systemd_the_fallback_is_on_the_status_line(tiny, tmp_path):
    """The notify protocol (as systemd sees it): a failed start's fallback reaches READY=1 and says
    on its STATUS= line which revision serves and why."""
    import tempfile

    port = free_port()
    good = Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512", "--port", str(port))
    assert good.wait_line("models loaded"), good.output
    assert good.stop() == 0
    sock_path = Path(tempfile.mkdtemp(prefix="sdn")) / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(60)
    bad = corrupt_copy(tiny.draft, tmp_path / "cut.gguf")
    s = Serve("--target", str(tiny.target), "--draft", str(bad), "--ctx", "512", "--port", str(port), "--fallback",
              env={"NOTIFY_SOCKET": str(sock_path)})
    try:
        got: list[str] = []
        while not any("READY=1" in m for m in got):
            got.append(listener.recv(4096).decode())
        ready = next(m for m in got if "READY=1" in m)
        assert "revision 1" in ready and "fallback from revision 2" in ready and "cut.gguf" in ready, got
        assert any(m.startswith("STATUS=revision 2 failed") for m in got), got
        assert answers(port)
    finally:
        assert s.stop() == 0, s.output
        listener.close()


def test_fingerprint_and_ollama_digest_follow_the_model_file(tiny, tmp_path):
    """system_fingerprint changes when the model file changes; Ollama's /api/tags and /api/show give
    the file's SHA-256."""
    import hashlib
    import shutil

    model = tmp_path / "model.gguf"
    seen = []
    for source in (tiny.target, tiny.draft):  # the same path, other bytes
        shutil.copy(source, model)
        port = free_port()
        s = Serve("--target", str(model), "--ctx", "512", "--port", str(port), "--no-speculative")
        try:
            assert s.wait_line("models loaded"), s.output
            url = f"http://127.0.0.1:{port}"
            fp = httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}).json()["system_fingerprint"]
            tags = httpx.get(url + "/api/tags").json()["models"][0]["digest"]
            show = httpx.post(url + "/api/show", json={"model": "custom"}).json()["digest"]
        finally:
            assert s.stop() == 0, s.output
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        assert tags == show == sha, (tags, show, sha)
        seen.append(fp)
    assert seen[0] != seen[1] and all(f.startswith("fp_") for f in seen)


def test_a_revision_recorded_before_typed_records_still_loads_and_rolls_back(tiny):
    """tests/data/revision-before-typed-records.json is a revision as specdeck wrote it before the
    typed record (its `args` are argparse's names; captured from a real `serve --ctx 512 --parallel 2
    --threads 1`): `config history` lists it, `rollback` starts it with its settings, and the same
    start today records the typed, versioned form."""
    import hashlib

    from app.settings import paths

    port = free_port()
    text = (ROOT / "tests" / "data" / "revision-before-typed-records.json").read_text()
    for key, path in (("TARGET", tiny.target), ("DRAFT", tiny.draft)):
        text = text.replace(f"@{key}_SHA256@", hashlib.sha256(path.read_bytes()).hexdigest()).replace(f"@{key}@", str(path))
    text = text.replace('"@PORT@"', str(port))
    revisions = paths().state / "revisions"
    revisions.mkdir(parents=True)
    (revisions / "0001.json").write_text(text)
    h = history()
    assert [(r["number"], r["status"]) for r in h["revisions"]] == [(1, "good")]
    table = run_cli("config", "history")
    assert table.returncode == 0 and "good" in table.stdout and "Traceback" not in table.stderr

    p = subprocess.Popen([*SPECDECK, "rollback", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: _health(port), 120), "revision 1 did not start"
        status = httpx.get(f"http://127.0.0.1:{port}/v1/status").json()
        assert status["revision"] == 1 and status["plan"]["ctx"] == 512 and status["plan"]["parallel"] == 2
        assert answers(port)
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "Traceback" not in out, out

    s = Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512", "--parallel", "2",
              "--threads", "1", "--port", str(port))
    try:
        assert s.wait_line("models loaded"), s.output
    finally:
        assert s.stop() == 0, s.output
    now = history()["revisions"][-1]
    assert now["args"]["version"] == 2 and now["args"]["chosen"]["target"] == str(tiny.target)
    assert now["args"]["plan"] == {"ctx": 512, "parallel": 2} and now["settings"]["serve"]["threads"] == 1
    p = subprocess.Popen([*SPECDECK, "rollback", str(now["number"])], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: _health(port), 120), "the typed revision did not start"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/status").json()["plan"]["ctx"] == 512 and answers(port)
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "Traceback" not in out, out


def test_a_revision_records_the_start_typed_and_starts_it_again_as_named(tmp_path):
    """The flags become one typed start request at the command's edge; a revision records it (the
    projector choice included) and starts the same request again, with no argparse in between."""
    from app.cli import build_parser
    from app.commands.revision import StartRecord
    from app.commands.start_request import StartRequest
    from app.server.settings import ServeSettings

    args = build_parser().parse_args(["serve", "coder-1.5b", "--mmproj", "v.gguf", "--ctx", "4096", "--parallel", "2"])
    req = StartRequest.of(args, ServeSettings())
    assert (req.chosen.name, req.chosen.mmproj, req.plan) == ("coder-1.5b", "v.gguf", {"ctx": 4096, "parallel": 2})
    again = StartRecord.load(StartRecord.of(req, "serve").model_dump(mode="json"), "serve").request(ServeSettings(), None)
    assert again.chosen == req.chosen and again.plan == req.plan
    planned = again.plan_request()
    assert (planned.ctx, planned.parallel, planned.ctx_is_user_choice) == (4096, 2, True)
    off = StartRequest.of(build_parser().parse_args(["up", "--no-mmproj", "--interval", "2"]), ServeSettings())
    assert off.chosen.no_mmproj and off.up.interval == 2.0


def test_the_configs_pins_refuse_a_model_file_that_differs_naming_it(tiny, tmp_path):
    """A config pins the model files by SHA-256: the right file starts, another refuses, naming it;
    a pin that is not a SHA-256 is one clear line."""
    import hashlib

    sha = hashlib.sha256(tiny.target.read_bytes()).hexdigest()
    config = tmp_path / "c.toml"
    config.write_text(f'[serve]\nmax_queue = 4\n\n[pins]\n"{tiny.target.name}" = "{"0" * 64}"\n')  # beside [serve] too
    r = run_cli("serve", "--target", str(tiny.target), "--config", str(config), "--port", str(free_port()))
    assert r.returncode != 0 and f"target {tiny.target.name}: SHA-256 {sha} is not the one the config pins" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    config.write_text('[pins]\n"x.gguf" = "abc"\n')
    r = run_cli("serve", "--target", str(tiny.target), "--config", str(config))
    assert r.returncode != 0 and "the pin of x.gguf is not a SHA-256" in r.stderr and "Traceback" not in r.stderr


def test_in_a_container_doctor_names_the_image_and_a_revision_records_it(tmp_path, monkeypatch):
    """podman's /run/.containerenv and the image's own label file: doctor says it runs in a
    container and which image; a revision's record carries it (what a rollback must run)."""
    import json as _json

    from app.commands import revision
    from app.commands.doctor import check_container
    from app.ops.container import container_facts
    from app.server.settings import ServeSettings

    assert container_facts(tmp_path) is None and "on the host" in check_container(None).summary
    (tmp_path / "run").mkdir()
    (tmp_path / "run/.containerenv").write_text('engine="podman-4.3.1"\nname="specdeck"\n'
                                                'image="localhost/specdeck:cpu"\nimageid="' + "ab" * 32 + '"\n')
    (tmp_path / "usr/share/specdeck").mkdir(parents=True)
    labels = {"org.opencontainers.image.version": "0.1.0", "org.opencontainers.image.revision": "abc1234",
              "io.specdeck.flavour": "cpu", "io.specdeck.llama-cpp.commit": "deadbee"}
    (tmp_path / "usr/share/specdeck/image.json").write_text(_json.dumps(labels))
    facts = container_facts(tmp_path)
    assert facts == {"engine": "podman-4.3.1", "image": "localhost/specdeck:cpu", "image_id": "ab" * 32, "labels": labels}
    line = check_container(facts).summary
    assert line.startswith("in a podman-4.3.1 container: localhost/specdeck:cpu (abababab") and "flavour cpu" in line
    assert "specdeck 0.1.0" in line and "commit abc1234" in line and "llama.cpp deadbee" in line
    monkeypatch.setattr(revision, "container_facts", lambda: facts)
    assert revision.settings_json(ServeSettings(), None)["image"]["image_id"] == "ab" * 32
    # podman without --privileged writes an empty file: SPECDECK_IMAGE (container.sh run sets it) names the image
    (tmp_path / "run/.containerenv").write_text("")
    assert container_facts(tmp_path, {})["image"] is None
    assert "image not stated (set SPECDECK_IMAGE" in check_container(container_facts(tmp_path, {})).summary
    named = container_facts(tmp_path, {"SPECDECK_IMAGE": "localhost/specdeck@sha256:" + "cd" * 32})
    assert named["image"] == "localhost/specdeck" and named["image_id"] == "sha256:" + "cd" * 32 and named["engine"] == "podman"
    # --read-only's tmpfs on /run hides .containerenv: podman's container=podman variable still says it
    (tmp_path / "run/.containerenv").unlink()
    assert container_facts(tmp_path, {}) is None
    hidden = container_facts(tmp_path, {"container": "podman", "SPECDECK_IMAGE": "localhost/specdeck@sha256:" + "cd" * 32})
    assert hidden["engine"] == "podman" and hidden["image"] == "localhost/specdeck" and hidden["labels"] == labels
    from app.ops.container import image_ref  # what a rollback tells podman to run
    assert image_ref(hidden) == "localhost/specdeck@sha256:" + "cd" * 32 and image_ref(None) is None
