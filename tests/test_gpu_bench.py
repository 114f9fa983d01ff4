"""The GPU script's CPU dry run: the 27B presets' architectures at a small shape, planned and loaded."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("preset", ["qwen3.6-27b", "gemma3-27b", "qwen3.6-27b-mtp"])
def test_dry_run_memory_matches_plan_and_times_are_measured(preset, tmp_path):
    p = subprocess.run(
        [sys.executable, "scripts/gpu_bench.py", "--dry-run", "--preset", preset, "--reps", "2",
         "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path / "out" / "gpu_bench.json").read_text())
    assert r["plan"]["fits"] and r["plan"]["ctx"] == 8192
    terms = {(row["model"], row["term"]): row for row in r["memory"]}
    for (model, term), row in terms.items():
        tol = 0.10 if term == "compute buffer" else 0.03
        assert row["measured"] > 0, (model, term)
        assert abs(row["planned"] - row["measured"]) <= tol * row["measured"], (model, term, row)
    if preset == "qwen3.6-27b":
        assert ("target", "recurrent state") in terms and ("draft", "recurrent state") in terms
    if preset == "qwen3.6-27b-mtp":  # the head's own context, and one head token as the draft cost
        assert {("MTP head", "KV cache"), ("MTP head", "compute buffer")} <= set(terms) and r["drafter"] == "mtp"
    for phase in ("short_ctx", "long_ctx"):
        c = r[phase]
        assert c["c_draft_s"] > 0 and all(v > 0 for v in c["c_verify_s"].values()) and len(c["c_verify_s"]) == 16
        proj = c["projection"]
        assert proj["plain_tok_s"] > 0 and {f"alpha_{a}" for a in (0.6, 0.7, 0.8)} <= set(proj)
    assert r["long_ctx"]["position"] > 4000
    m = r["beside_a_prompt"]  # #63's case: a verify, a prompt's chunk and both in one decode, timed
    assert m["depth"] == 2048 and m["verify_s"] > 0 and set(m["mixed_s"]) == set(m["chunk_s"]) == {"16", "64", "128", "256", "512"}
    assert all(v > 0 for v in m["mixed_over_parts"].values()) and m["prompt_tok_s_decode_first"] > 0
