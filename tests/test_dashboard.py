"""The dashboard is a pure render of a snapshot: checked on a snapshot recorded from a real
`specdeck up coder-1.5b` (two requests generating), on a GPU-shaped one, and on the live figures
(LiveStats) that feed /v1/status."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

from rich.console import Console

from app.commands.dashboard import (
    build_snapshot,
    loading_snapshot,
    log_line,
    metric_totals,
    render,
    sparkline,
)
from app.engine.records import RequestRecord, StepRecord
from app.server.stats import LiveStats

DATA = Path(__file__).parent / "data"


def recorded() -> dict:
    """/v1/status and /metrics saved from a real `specdeck up coder-1.5b --ctx 4096 --parallel 2`."""
    return build_snapshot(json.loads((DATA / "status_busy.json").read_text()), (DATA / "metrics_busy.txt").read_text(),
                          "http://127.0.0.1:18431")


def screen(snap: dict, width: int = 80) -> list[str]:
    console = Console(record=True, width=width, height=24, color_system=None, file=io.StringIO())
    console.print(render(snap))
    return console.export_text().rstrip("\n").split("\n")


def test_recorded_snapshot_shows_its_figures_in_80x24():
    snap = recorded()
    lines = screen(snap)
    text = "\n".join(lines)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m" in text and "qwen2.5-coder-0.5b-instruct-q4_k_m" in text
    assert "ctx 4,096" in text and "KV f16/f16" in text and "2 slot(s)" in text and "draft ≤8" in text
    plan = snap["plan"]
    assert f"RAM {plan['used'] / 2**30:.1f}/{plan['budget'] / 2**30:.1f} GiB" in text
    assert f"{snap['recent_tokens_per_second']:.1f} tok/s now" in text
    assert f"TTFT {snap['last_request']['ttft_s']:.2f} s last" in text
    assert f"prompt {snap['last_request']['prompt_tokens_per_second']:.0f} tok/s" in text
    assert "2 active · 0 queued · 1 done · 0 errors" in text
    assert f"{int(snap['totals']['completion_tokens'])} tokens out" in text
    assert "#0 generating 26 tok" in text and "#1 generating 26 tok" in text
    assert "none (CPU)" in text and "CPU 100%" in text
    assert sparkline(snap["history"]["tokens_per_second"], 48) in text
    assert "up 0:00:38" in text


def gpu_snapshot() -> dict:
    """The recorded snapshot as a GPU server would show it: a card, drafting, an error, 6 slots."""
    snap = copy.deepcopy(recorded())
    snap["gpu"] = [{"name": "NVIDIA GeForce RTX 4090", "total": 24 * 2**30, "free": 2 * 2**30, "utilization": 87}]
    snap["plan"]["device"] = "cuda"
    snap.update(recent_acceptance=0.8125, acceptance=0.7734, recent_tokens_per_step=4.25, recent_draft_length=5.5,
                events=["12:00:01 specdeck: something went wrong"])
    snap["totals"]["errors"] = 3.0
    snap["slots"] = [{"id": i, "state": "generating" if i < 3 else "idle", "cached_tokens": 1000 * i, "generated": 10 * i,
                      "k": 6, "drafter": "draft", "drafted": 6, "accepted": 5} for i in range(6)]
    snap["slots"][2].update(drafter="mtp", k=3, drafted=3, recent_tokens_per_decode=2.4375, recent_head_acceptance=0.717,
                            recent_head_drafted=120)
    return snap


def test_gpu_figures_acceptance_errors_and_many_slots_still_fit():
    lines = screen(gpu_snapshot())
    text = "\n".join(lines)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert "NVIDIA GeForce RTX 4090 · util 87% · VRAM 22.0/24.0 GiB" in text
    assert "0.81 last 30s · 0.77 all · tokens/step 4.25 · drafted/step 5.5" in text
    assert "3 errors" in text and "something went wrong" in text
    assert "VRAM " in text.split("plan", 1)[1].split("\n", 1)[0]  # the plan's budget is VRAM on a GPU
    assert "#1 generating 10 tok · draft 6/6 · cache 1,000" in text  # the last step's drafter, drafted / asked
    # over the last 30 s: tokens per target decode, and the MTP head's acceptance
    assert "#2 generating 20 tok · mtp 3/3 · cache 2,000 · 2.44/dec · head 72%" in text
    assert "+2 more (0 generating)" in text and "#4" not in text


def test_not_serving_and_log_line():
    text = "\n".join(screen(loading_snapshot("http://h:1", "loading models")))
    assert "loading models" in text and "http://h:1" in text
    line = log_line(recorded())
    assert line.startswith("specdeck: tok/s 7.2 ") and "active 2" in line and "done 1" in line and "errors 0" in line
    assert "tokens_out 60" in line and "\n" not in line
    assert log_line(loading_snapshot("u", "unreachable: refused")) == "specdeck u: unreachable: refused"


def test_metric_totals_and_sparkline():
    t = metric_totals((DATA / "metrics_busy.txt").read_text())
    assert t["completion_tokens"] == 60 and t["prompt_tokens"] == 34 and t["errors"] == 0
    assert t["requests"] >= 1 and abs(t["ttft_mean_s"] - 0.6014) < 0.01
    assert sparkline([0, 1, 2, 4, 8], 10) == "▁▂▃▅█"
    assert sparkline([1, 2, 3], 2) == "▆█"
    assert sparkline([0, 0], 5) == "▁▁" and sparkline([], 5) == ""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def step(slot: int, tokens: int, drafted: int, accepted: int, k: int) -> StepRecord:
    return StepRecord(slot=slot, tokens=list(range(tokens)), drafted=drafted, accepted=accepted, k=k,
                      drafter="draft" if k else "none", t_draft=0.0, t_verify=0.0, t_sample=0.0)


def test_live_stats_windows_and_history():
    clock = Clock()
    stats = LiveStats(window=30, bucket=5, history=60, clock=clock)
    assert stats.snapshot()["recent_acceptance"] is None
    for _ in range(10):  # 10 s at 1 step/s: 4 drafted, 3 kept, 4 tokens out each
        stats.step(step(0, 4, 4, 3, 4))
        clock.t += 1
    stats.step(step(1, 1, 0, 0, 0))
    snap = stats.snapshot()
    assert snap["recent_acceptance"] == 30 / 40
    assert snap["recent_tokens_per_step"] == 41 / 11
    assert snap["recent_draft_length"] == 40 / 11 and snap["recent_draft_cap"] == 4
    assert snap["history"]["tokens_per_second"] == [4.0, 4.0]  # two whole 5 s buckets; the third still filling
    assert stats.slot(0) == {"k": 4, "drafter": "draft", "drafted": 4, "accepted": 3, "recent_tokens_per_decode": 4.0,
                             "recent_head_acceptance": None, "recent_head_drafted": 0}
    assert stats.slot(7) == {"recent_tokens_per_decode": None, "recent_head_acceptance": None, "recent_head_drafted": 0}
    for tokens, drafted, accepted, drafter in ((3, 3, 2, "mtp"), (1, 3, 0, "mtp"), (9, 8, 8, "lookup")):
        stats.step(StepRecord(slot=2, tokens=list(range(tokens)), drafted=drafted, accepted=accepted, k=drafted,
                              drafter=drafter, t_draft=0.0, t_verify=0.0, t_sample=0.0))
    two = stats.slot(2)  # the head's acceptance from its own drafts only; tokens per decode from every step
    assert (two["recent_head_acceptance"], two["recent_head_drafted"], two["recent_tokens_per_decode"]) == (2 / 6, 6, 13 / 3)
    clock.t += 31  # the 30 s window empties; history keeps the minute
    snap = stats.snapshot()
    assert snap["recent_acceptance"] is None and snap["recent_tokens_per_step"] is None
    assert snap["history"]["tokens_per_second"][:2] == [4.0, 4.0] and len(snap["history"]["tokens_per_second"]) == 8
    clock.t += 120
    assert stats.snapshot()["history"]["tokens_per_second"] == [0.0] * 12
    rec = RequestRecord(prompt_tokens=100, completion=[1] * 50, drafted=40, accepted=30, target_decodes=20,
                        t_prompt=0.5, t_generate=2.0, ttft=0.5, finish_reason="stop")
    stats.done(rec)
    snap = stats.snapshot()
    assert snap["requests_done"] == 1 and snap["ttft_s_mean"] == 0.5
    assert snap["last_request"]["tokens_per_second"] == 25.0 and snap["last_request"]["prompt_tokens_per_second"] == 200.0
    assert snap["last_request"]["tokens_per_step"] == 2.5
