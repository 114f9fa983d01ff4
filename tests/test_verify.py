"""`specdeck verify` as a user runs it."""

import json

from conftest import REAL_CACHE, run_cli


def test_verify_tiny_pair_json(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b c the def", "kind": "words"}\n\n{"prompt": "x y = x + y"}\n')
    p = run_cli("verify", "--target", str(tiny.target), "--draft", str(tiny.draft), "--prompts", str(prompts),
                "--max-tokens", "40", "--ctx", "512", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["ok"] and [r["kind"] for r in j["prompts"]] == ["words", "custom"]
    for r in j["prompts"]:
        assert r["invariant_violations"] == 0 and r["spec_tokens"] == 40
        assert r["identical"] or r["gap_at_divergence"] <= 2 * r["numerics_delta"]


def test_verify_real_pair_builtin_prompts():
    p = run_cli("verify", "coder-1.5b", "--max-tokens", "24", "--json", env={"SPECDECK_HOME": str(REAL_CACHE)})
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert {r["kind"] for r in j["prompts"]} == {"code-completion", "code-edit", "code-question", "prose"}
    assert all(r["invariant_violations"] == 0 for r in j["prompts"])
    assert any(r["acceptance"] and r["acceptance"] > 0.5 for r in j["prompts"])
    for r in j["prompts"]:  # every divergence sits at a near-tie, measured at that very position
        if not r["identical"]:
            assert r["numerics_delta"] is not None and r["gap_at_divergence"] <= 2 * r["numerics_delta"]


def test_verify_bad_prompts_file(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    p = run_cli("verify", "--target", str(tiny.target), "--draft", str(tiny.draft), "--prompts", str(bad))
    assert p.returncode != 0 and "bad.jsonl:2: not JSON" in p.stderr and "Traceback" not in p.stderr
    bad.write_text('{"text": "no"}\n')
    p = run_cli("verify", "--target", str(tiny.target), "--draft", str(tiny.draft), "--prompts", str(bad))
    assert p.returncode != 0 and '"prompt"' in p.stderr
    p = run_cli("verify", "--target", str(tiny.target))
    assert p.returncode != 0 and "needs a draft" in p.stderr
