"""`specdeck validate` end to end on the CPU pair (Qwen2.5-Coder 1.5B + 0.5B): a baseline saved
in-process, a compare against an unchanged served instance that passes within the tolerances, a
compare against one with speculation off (in-process) that must flag the regression, and bad input (another
preset's baseline, another machine's, a missing file, a tolerance that does not parse) as one clear
line before any check runs. Short settings (context 512, 8-token generations) keep it to minutes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from support.live import free_port, wait_exit

SHORT = ["--decode-tokens", "8", "--repeats", "1", "--context-margin", "256", "--json"]



class Served:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")  # the server's output, shown if it does not stop
        self.p = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", *args, "--port", str(self.port)], cwd=ROOT,
                                  stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.p.send_signal(signal.SIGTERM)
        try:
            wait_exit(self.p)
        except AssertionError as e:
            self.log.seek(0)
            raise AssertionError(f"{e}\n{self.log.read()[-6000:]}") from None
        finally:
            self.p.kill()
            self.log.close()


def validate(*args: str) -> tuple[int, dict, str]:
    r = run_cli("validate", *args)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        data = {}
    return r.returncode, data, r.stderr


@pytest.mark.real
def test_validate_saves_a_baseline_then_compares_a_changed_setup(real_pair):
    models = ["--target", str(real_pair.target), "--draft", str(real_pair.draft), "--ctx", "512"]
    with Served(*models) as served:
        code, data, err = validate("--url", served.url, *SHORT, "--save-baseline")
        assert code == 0, err + json.dumps(data.get("checks"), indent=1)
        checks = {c["name"]: c for c in data["checks"]}
        assert [c["status"] for c in data["checks"] if c["status"] == "fail"] == []
        assert checks["smoke"]["figures"]["smoke_ok"] and checks["greedy equivalence"]["status"] == "ok"
        assert checks["soak"]["status"] == "skip" and checks["GPU temperature and power"]["status"] == "skip"  # no GPU here
        f = data["figures"]
        assert f["draft_model"] is True and f["drafted"] >= 0 and (f["acceptance"] is None) == (f["drafted"] == 0)
        for key in ("decode_tps_spec", "decode_tps_plain", "spec_ratio", "tokens_per_step", "ttft_cold_s",
                    "ttft_cached_s", "throughput_1", "throughput_parallel", "long_ctx_tokens", "long_ctx_ttft_s", "peak_memory"):
            assert f[key] is not None and f[key] > 0, key
        assert f["ttft_cached_s"] < f["ttft_cold_s"] and 200 < f["long_ctx_tokens"] <= 512 and f["errors"] == 0
        assert f["restarts"] == 0
        saved = Path(data["saved_baseline"])
        record = json.loads(saved.read_text())
        assert record["preset"] == "custom" and record["machine"]["cores"] >= 1 and record["machine"]["cpu"]
        assert len(record["digests"]["target"]) == 64 and record["plan"]["ctx"] == 512 and record["date"].startswith("20")
        assert record["figures"] == f and record["revision"] == 1

        # bad input: another preset's baseline, another machine's: one clear line from the preflight
        # (the server's status against the record), before any check runs
        for edit, words in ((lambda r: r.update(preset="coder-1.5b"), "is a baseline of preset 'coder-1.5b'"),
                            (lambda r: r["machine"].update(cpu="Another CPU"), "recorded on another machine")):
            other = saved.with_name("other.json")
            rec = json.loads(saved.read_text())
            edit(rec)
            other.write_text(json.dumps(rec))
            t = time.monotonic()
            code, _, err = validate("--url", served.url, "--compare", str(other))
            assert code == 1 and words in err and "Traceback" not in err, err
            assert time.monotonic() - t < 60  # refused before the checks

    # changed: the same pair served in-process with speculation off (the draft not loaded)
    code, data, err = validate(*models, "--no-speculative", *SHORT, "--compare")
    assert code == 1, [x["text"] for x in data.get("comparison") or []]
    assert "draft_model" in data["regressions"], data["regressions"]
    assert {c["name"]: c["status"] for c in data["checks"]}["health"] == "ok"

    # bad input: one clear line, nothing run
    code, _, err = validate(*models, "--compare", str(saved.with_name("missing.json")))
    assert code == 1 and "no baseline at" in err
    saved.with_name("junk.json").write_text("{not json")
    code, _, err = validate(*models, "--compare", str(saved.with_name("junk.json")))
    assert code == 1 and "not a readable baseline" in err
    code, _, err = validate(*models, "--compare", "--tolerance", "ttft=fast")
    assert code == 1 and "bad --tolerance 'ttft=fast'" in err
    code, _, err = validate(*models, "--tolerance", "speed=10%")
    assert code == 1 and "bad --tolerance" in err and "tokens_per_second" in err


def test_validate_url_that_does_not_answer_is_one_line():
    code, _, err = validate("--url", f"http://127.0.0.1:{free_port()}", "--json")
    assert code == 1 and "cannot reach" in err and "Traceback" not in err


def test_compare_rules_flag_what_the_issue_names():
    from app.ops.baseline import compare, parse_tolerances

    base = {"decode_tps_spec": 10.0, "decode_tps_plain": 8.0, "acceptance": 0.70, "ttft_cold_s": 1.0, "ttft_cached_s": 0.02,
            "peak_memory": 1000.0, "errors": 0, "throughput_1": 9.0}
    tol = parse_tolerances(None)
    same = {**base, "decode_tps_spec": 9.3, "acceptance": 0.62, "ttft_cold_s": 1.2, "ttft_cached_s": 0.06}
    assert not [f.figure for f in compare(base, same, tol) if f.regression]  # within -10 %, -0.10, +25 % / 50 ms
    worse = {**base, "decode_tps_spec": 8.9, "acceptance": 0.55, "ttft_cold_s": 1.3, "peak_memory": 1200.0, "errors": 1}
    assert {f.figure for f in compare(base, worse, tol) if f.regression} == {"decode_tps_spec", "acceptance", "ttft_cold_s",
                                                                             "peak_memory", "errors"}
    base.update(drafted=100, draft_model=True)
    gone = {**{k: v for k, v in base.items() if k != "acceptance"}, "draft_model": False, "drafted": 0}
    assert {f.figure for f in compare(base, gone, tol) if f.regression} == {"draft_model"}  # the draft is gone
    few = {**base, "acceptance": 0.1, "drafted": 5}  # too few drafted to judge acceptance
    assert not [f for f in compare(base, few, tol) if f.regression]
    assert [f.figure for f in compare(base, {**base, "acceptance": 0.1}, tol) if f.regression] == ["acceptance"]
    assert parse_tolerances(["tokens_per_second=20%"])["tokens_per_second"] == pytest.approx(0.2)
    assert parse_tolerances(["acceptance=0.05"])["acceptance"] == 0.05
    assert not [f for f in compare(base, {**base, "decode_tps_spec": 8.5}, parse_tolerances(["tokens_per_second=20%"]))
                if f.regression]


def test_health_waits_for_a_loading_server(tiny):
    """validate --url against a server still loading waits for it, then runs, soak included (the smoke
    check fails on random weights' text, but health is ok and the run is complete)."""
    with Served("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "1024") as s:
        code, data, err = validate("--url", s.url, *SHORT, "--soak", "0.1")
    checks = {c["name"]: c["status"] for c in data["checks"]}
    assert checks["health"] == "ok" and checks["decode speed"] in ("ok", "warn") and "errors" in checks, err
    f = data["figures"]  # a 6-second soak: requests and streams at `parallel` streams, none failed, no restart
    assert checks["soak"] == "ok" and f["soak_requests"] > 4 and f["soak_errors"] == 0 and f["soak_restarts"] == 0, err


class _Answers:
    """A server that answers /completion with given tokens: what is under test is check_smoke's verdict."""

    def __init__(self, whole: list[int], streamed: list[int], gap: float) -> None:
        self.whole, self.streamed, self.gap = whole, streamed, gap

    def post(self, path: str, body: dict) -> dict:
        if path == "/tokenize":
            return {"tokens": self.whole}
        probs = [{"top_logprobs": [{"logprob": -0.1}, {"logprob": -0.1 - self.gap}]} for _ in self.whole]
        return {"content": "x" * len(self.whole), "tokens": self.whole, "completion_probabilities": probs}

    def stream(self, path: str, body: dict):
        for t in self.streamed:
            yield None, {"content": "x", "tokens": [t]}
        yield None, {"stop": True, "content": ""}


@pytest.mark.parametrize("streamed,gap,status", [
    ([1, 2, 3, 4], 5.0, "ok"),      # equal
    ([1, 2, 9, 9], 0.2, "ok"),      # parted at a near-tie: said, not failed
    ([1, 2, 9, 9], 5.0, "fail"),    # parted where the whole answer was sure
    ([1, 2], 5.0, "fail"),          # cut short
])
def test_smoke_check_tells_a_near_tie_from_a_broken_stream(streamed, gap, status):
    from app.ops.validate import check_smoke
    c = check_smoke(_Answers([1, 2, 3, 4], streamed, gap), None, {})
    assert c.status == status, c.summary
    assert ("near-tie" in c.summary) == (streamed != [1, 2, 3, 4] and status == "ok")
