"""The monitor's server side: the ring (app/monitor/history.py), a status snapshot made into a row
(figures.py), the live counts behind them (LiveStats), and on a real server over the tiny pair:
/ui/api/series and /ui/api/live against /metrics, their bad input, keys, the plan's row. The page
in a real browser is in tests/test_ui_browser.py."""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.live import LiveServer, Serve, free_port, wait_for
from support.tinymodels import write_tiny_model

from app.engine.records import RequestRecord, StepRecord
from app.monitor.figures import machine_point, model_point, rates
from app.monitor.history import DRAFTER_KEYS, History, history_bytes, unit_of
from app.server.settings import ServeSettings
from app.server.stats import LiveStats, drafter_key, percentile

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# -- the ring ---------------------------------------------------------------------------------

def test_the_ring_keeps_the_last_rows_in_order_and_reads_after_a_time():
    h = History({"m": 1}, gpus=0, seconds=5)
    for i in range(8):
        h.add(100.0 + i, {"host_cpu_percent": float(i)}, {"m": {"loaded": 1.0, "requests_running": i if i % 2 else None}})
    cols = h.columns("m", -math.inf)
    assert cols["t"] == [103.0, 104.0, 105.0, 106.0, 107.0]
    assert cols["host_cpu_percent"] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert cols["requests_running"] == [3.0, None, 5.0, None, 7.0]  # a missing value is null
    assert h.columns("m", 105.0)["t"] == [106.0, 107.0]
    assert h.columns("m", 107.0)["t"] == []
    assert list(h.columns("m", 0, ["requests_running"])) == ["t", "requests_running"]
    assert h.last_t() == 107.0


def test_a_drafter_takes_its_columns_on_first_use_up_to_the_rooms_size():
    h = History({"m": 1}, gpus=0, seconds=3)
    h.add(1.0, {}, {"m": {"acceptance_rate:mtp": 0.8}})
    h.add(2.0, {}, {"m": {"acceptance_rate:draft": 0.5}})
    cols = h.columns("m", 0)
    assert cols["acceptance_rate:mtp"] == [0.8, None] and cols["acceptance_rate:draft"] == [None, 0.5]
    h.add(3.0, {}, {"m": {f"acceptance_rate:d{i}": 0.1 for i in range(3 * DRAFTER_KEYS)}})  # past its room: dropped
    assert len([f for f in h.fields("m") if ":" in f and f.startswith(("acceptance", "mean"))]) == 2 * DRAFTER_KEYS


def test_the_rings_size_is_what_the_plan_says_and_fixed():
    h = History({"m": 4}, gpus=1)
    assert h.nbytes == history_bytes(4, 1)
    before = h.nbytes
    for i in range(50):
        h.add(float(i), {"gpu_power_watts:0": 100.0}, {"m": {f"acceptance_rate:d{j}": 0.5 for j in range(DRAFTER_KEYS)}})
    assert h.nbytes == before
    assert 500_000 < history_bytes(1, 0) < 2_000_000  # an hour of one model on a CPU: about a megabyte


def test_units():
    assert unit_of("generated_tokens_per_second") == "tokens/s" and unit_of("gpu_temperature_celsius:0") == "°C"
    assert unit_of("acceptance_rate:mtp@4k") == "0-1" and unit_of("context_tokens:3") == "tokens"


# -- figures ----------------------------------------------------------------------------------

COUNTS = {"generated": 100, "decodes": 40, "drafted": 90, "accepted": 60, "prompt_evaluated": 500}


def test_rates_are_the_counts_differences_per_second():
    now = {"generated": 130, "decodes": 50, "drafted": 120, "accepted": 80, "prompt_evaluated": 1500}
    r = rates(now, COUNTS, 2.0)
    assert r == {"generated_tokens_per_second": 15.0, "prompt_tokens_per_second": 500.0, "drafted_tokens_per_second": 15.0,
                 "accepted_tokens_per_second": 10.0, "tokens_per_decode": 3.0}
    assert all(v is None for v in rates(now, None, 1.0).values())  # the first tick
    assert all(v is None for v in rates(COUNTS, now, 1.0).values())  # counts went back: a reload
    assert rates(COUNTS, COUNTS, 1.0)["tokens_per_decode"] is None  # nothing decoded this second


def test_a_status_snapshot_becomes_a_row():
    status = {"counts": COUNTS, "ttft_s_p50": 0.2, "ttft_s_p95": 0.9, "recent_acceptance": 0.7, "busy_slots": 1, "queue": 2,
              "slots_total": 2, "queue_limit": 16, "plan": {"ctx": 4096, "device": "cuda", "used": 20 << 30},
              "kv_cache": {"used_cells": 1024, "cells": 8192}, "slots": [{"id": 0, "cached_tokens": 700}, {"id": 1, "cached_tokens": 0}],
              "drafters": {"mtp@4k": {"acceptance": 0.6, "mean_accepted_length": 2.5}}}
    row = model_point(status, None, 0.0)
    assert row["loaded"] == 1.0 and row["requests_waiting"] == 2 and row["kv_cache_usage_ratio"] == 0.125
    assert row["context_tokens:0"] == 700 and row["acceptance_rate:mtp@4k"] == 0.6 and row["mean_accepted_length:mtp@4k"] == 2.5
    assert row["vram_planned_bytes"] == 20 << 30 and row["ttft_p95_seconds"] == 0.9
    machine = machine_point({"host": {"total": 100, "available": 40, "rss": 10, "cpu_percent": 50.0},
                             "gpu": [{"total": 24, "free": 4, "utilization": 97, "temperature_c": 70, "temperature_slowdown_c": 90,
                                      "power_w": 300.0, "power_limit_w": 350.0}]})
    assert machine["host_memory_used_bytes"] == 60 and machine["gpu_memory_used_bytes:0"] == 20
    assert machine["gpu_utilization_ratio:0"] == 0.97 and machine["gpu_temperature_slowdown_celsius:0"] == 90
    assert not any(k.startswith("gpu") for k in machine_point({"host": {}, "gpu": []}))  # no GPU: no GPU columns


# -- the live counts ---------------------------------------------------------------------------

def step(drafter: str, drafted: int, accepted: int, depth: int = 0) -> StepRecord:
    return StepRecord(slot=0, tokens=[1] * (accepted + 1), drafted=drafted, accepted=accepted, k=drafted, drafter=drafter,
                      t_draft=0, t_verify=0, t_sample=0, depth=depth)


def test_an_mtp_heads_steps_count_in_their_depth_band():
    assert drafter_key(step("mtp", 3, 2, depth=100)) == "mtp"
    assert drafter_key(step("mtp", 3, 2, depth=5000)) == "mtp@4k"
    assert drafter_key(step("draft", 3, 2, depth=50000)) == "draft"


def test_live_stats_count_per_drafter_and_ttft_percentiles():
    clock = [0.0]
    s = LiveStats(clock=lambda: clock[0])
    for rec in (step("draft", 4, 4), step("draft", 4, 0), step("suffix", 8, 6)):
        s.step(rec)
    s.prompt(300)
    for ttft in (0.1, 0.2, 0.3, 0.4, 2.0):
        s.done(RequestRecord(prompt_tokens=10, ttft=ttft))
    snap = s.snapshot()
    assert snap["counts"] == {"generated": 5 + 1 + 7, "decodes": 3, "drafted": 16, "accepted": 10, "prompt_evaluated": 300}
    assert snap["drafters"]["draft"] == {"steps": 2, "drafted": 8, "accepted": 4, "acceptance": 0.5, "mean_accepted_length": 3.0}
    assert snap["drafters"]["suffix"]["mean_accepted_length"] == 7.0
    assert snap["ttft_s_p50"] == 0.3 and snap["ttft_s_p95"] == 2.0
    clock[0] = 100.0  # past every window: the percentiles have nothing, the counts stay
    snap = s.snapshot()
    assert snap["ttft_s_p50"] is None and snap["drafters"] == {} and snap["counts"]["generated"] == 13
    assert percentile([], 0.5) is None and percentile([5.0], 0.95) == 5.0


# -- on a server -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("monitor-pair")
    return (write_tiny_model(d / "target.gguf", seed=0, chat_template=TEMPLATE),
            write_tiny_model(d / "draft.gguf", seed=1, n_layers=1, chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDECK_HOME", str(tmp_path_factory.mktemp("monitor-home")))
    s = LiveServer(*pair, ServeSettings(port=free_port()), parallel=2, ctx=1024)
    yield s
    s.close()
    mp.undo()


def metric(url: str, name: str, **labels) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for smp in fam.samples:
            if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                total += smp.value
    return total


def integral(cols: dict, name: str) -> float:
    """Σ rate × the seconds it covers: the tokens a rate column says were made."""
    t, v = cols["t"], cols[name]
    return sum(v[i] * (t[i] - t[i - 1]) for i in range(1, len(t)) if v[i] is not None)


def test_the_series_adds_up_to_the_servers_counters(server):
    # a row's rate covers the second before it: the sum is whole from the first row on
    assert wait_for(lambda: len(httpx.get(server.url + "/ui/api/series").json()["columns"]["t"]) >= 1, 5, 0.1)
    for i in range(3):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": f"count {i}:", "max_tokens": 40, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
    time.sleep(2.5)  # two more rows: the last request's tokens are in a row
    s = httpx.get(server.url + "/ui/api/series").json()
    cols = s["columns"]
    assert s["model"] == "tiny" and s["gpus"] == 0 and s["keep_s"] == 3600 and len(cols["t"]) >= 3
    assert all(b - a > 0.5 for a, b in zip(cols["t"], cols["t"][1:], strict=False))  # a row a second
    assert abs(cols["t"][-1] - time.time()) < 3
    url = server.url
    generated = metric(url, "specdeck_completion_tokens_total")
    assert generated > 0 and integral(cols, "generated_tokens_per_second") == pytest.approx(generated, rel=0.01, abs=1)
    assert integral(cols, "drafted_tokens_per_second") == pytest.approx(metric(url, "specdeck_draft_tokens_total"), rel=0.01, abs=1)
    assert integral(cols, "accepted_tokens_per_second") == pytest.approx(metric(url, "specdeck_draft_accepted_total"), rel=0.01, abs=1)
    evaluated = metric(url, "specdeck_prompt_tokens_total") - metric(url, "specdeck_prompt_cache_tokens_total")
    assert integral(cols, "prompt_tokens_per_second") == pytest.approx(evaluated, rel=0.01, abs=1)
    assert cols["slots"][-1] == 2 and cols["queue_limit"][-1] == metric(url, "specdeck_queue_limit")
    assert cols["requests_running"][-1] == 0 and cols["context_limit_tokens"][-1] == 1024
    assert {"context_tokens:0", "context_tokens:1", "host_memory_used_bytes", "host_cpu_percent"} <= set(cols)
    assert not any(k.startswith("gpu_") for k in cols)  # no GPU here: no GPU columns
    assert s["units"]["generated_tokens_per_second"] == "tokens/s"
    assert cols["ttft_p50_seconds"][-1] is not None and cols["ttft_p50_seconds"][-1] <= cols["ttft_p95_seconds"][-1]
    status = httpx.get(url + "/v1/status").json()
    assert status["counts"]["generated"] == generated and "drafters" in status
    # the time between an answer's steps: in the status, /metrics and the series alike
    assert 0 < status["tbt_s_p50"] <= status["tbt_s_p95"]
    assert metric(url, "specdeck_time_between_tokens_seconds", quantile="0.95") == status["tbt_s_p95"]
    assert cols["tbt_p50_seconds"][-1] is not None
    assert status["mixed_batch"] == {"mode": "auto", "pays": None}  # no prompt was read beside an answer here


def test_series_reads_a_field_a_model_and_a_time(server):
    url = server.url
    cols = httpx.get(url + "/ui/api/series", params={"fields": "generated_tokens_per_second,host_cpu_percent"}).json()["columns"]
    assert list(cols) == ["t", "generated_tokens_per_second", "host_cpu_percent"]
    last = cols["t"][-1]
    after = httpx.get(url + "/ui/api/series", params={"since": last, "model": "anything"}).json()  # one model: any name reaches it
    assert all(t > last for t in after["columns"]["t"])
    bad = httpx.get(url + "/ui/api/series", params={"fields": "speed"})
    assert bad.status_code == 400 and "unknown field(s) speed" in bad.json()["error"]["message"]
    assert "generated_tokens_per_second" in bad.json()["error"]["message"]
    assert httpx.get(url + "/ui/api/series", params={"since": "yesterday"}).status_code in (400, 422)


def test_live_sends_the_rows_after_since_once_then_each_new_one(server):
    cols = httpx.get(server.url + "/ui/api/series").json()["columns"]
    since = cols["t"][-3]
    ids: list[float] = []
    with httpx.stream("GET", server.url + "/ui/api/live", params={"since": since}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("id: "):
                ids.append(float(line[4:]))
            elif line.startswith("data: "):
                row = json.loads(line[6:])
                assert row["t"] == ids[-1] and "generated_tokens_per_second" in row
            if len(ids) >= 4:
                break
    assert ids[:2] == cols["t"][-2:]  # what it missed first, then new rows
    assert ids == sorted(set(ids)) and ids[-1] > cols["t"][-1]


def test_the_plan_states_the_rings_memory(server):
    plan = httpx.get(server.url + "/v1/status").json()["plan"]
    row = next(t for t in plan["terms"] if t["name"] == "monitor history")
    assert row["bytes"] == history_bytes(2, 0) == server.app.state.history.nbytes


def test_the_monitor_needs_a_key_where_the_server_has_keys(pair, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice sk-alice-1\n")
    keys.chmod(0o600)
    s = LiveServer(*pair, ServeSettings(port=free_port(), api_key_file=keys), parallel=1, ctx=512)
    try:
        page = httpx.get(s.url + "/ui/monitor", headers={"accept": "text/html"})
        assert page.status_code == 200 and "mon-model" in page.text  # the page itself asks for the key
        assert httpx.get(s.url + "/ui/api/series").status_code == 401
        assert httpx.get(s.url + "/ui/api/live").status_code == 401
        ok = wait_for(lambda: httpx.get(s.url + "/ui/api/series", headers={"authorization": "Bearer sk-alice-1"}).json()["columns"]["t"], 5)
        assert ok
    finally:
        s.close()


def test_a_stop_ends_an_open_monitor_stream_instead_of_waiting_out_its_grace(pair, tmp_path):
    """A monitor left open in a browser holds a live stream with no end of its own: on SIGTERM it ends,
    and the server exits without waiting for uvicorn's graceful timeout (before: a minute, then a
    CancelledError traceback in the log)."""
    from app.server.serve import GRACEFUL_LIMIT

    port = free_port()
    s = Serve("--target", str(pair[0]), "--draft", str(pair[1]), "--ctx", "512", "--parallel", "1",
              "--port", str(port), env={"SPECDECK_HOME": str(tmp_path / "home")})
    ended: dict = {}

    def watch() -> None:
        with httpx.stream("GET", f"http://127.0.0.1:{port}/ui/api/live", timeout=GRACEFUL_LIMIT * 2) as r:
            ended["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    ended["rows"] = ended.get("rows", 0) + 1
        ended["at"] = time.monotonic()

    try:
        assert s.wait_line("serving on", stall=120), s.output
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert wait_for(lambda: ended.get("rows", 0) >= 2, 30), ended
        asked = time.monotonic()
        assert s.stop() == 0, s.output[-3000:]
        stopped = time.monotonic() - asked
        watcher.join(5)
    finally:
        s.stop()
    assert ended["status"] == 200 and "at" in ended, ended
    assert stopped < GRACEFUL_LIMIT / 2, (stopped, s.output[-3000:])
    assert "Traceback" not in s.output and "graceful shutdown exceeded" not in s.output, s.output[-3000:]
