"""The `specdeck` command as a user runs it: exit codes, and one clear line on every error."""

import json

import pytest
from conftest import REAL_CACHE, run_cli
from support.fakehub import FakeHub


def assert_clean_error(p, *needles):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr + p.stdout
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def test_check_tiny_pair_json(tiny):
    p = run_cli("check", "--target", str(tiny.target), "--draft", str(tiny.draft), "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["compatible"] and j["target"]["vocab_size"] == 320 and j["draft"]["layers"] == 1


def test_check_mismatch_exits_nonzero_naming_token(tiny):
    p = run_cli("check", "--target", str(tiny.target), "--draft", str(tiny.mismatch))
    assert p.returncode == 2
    assert "token-text" in p.stdout and "token 300" in p.stdout and "▁changed" in p.stdout


@pytest.mark.parametrize(
    "args, needles",
    [
        (["pull", "no-such-preset"], ["no-such-preset"]),
        (["check", "no-such-preset"], ["unknown preset"]),
        (["check", "--target", "/nonexistent/x.gguf"], ["/nonexistent/x.gguf"]),
        (["check", "--draft", "x.gguf"], ["--draft needs --target"]),
        (["frobnicate"], ["invalid choice"]),
        (["pull", "hf://only-owner/x.gguf"], ["bad hub reference"]),
    ],
)
def test_bad_input_is_one_clear_line(args, needles):
    assert_clean_error(run_cli(*args), *needles)


def test_non_gguf_file(tmp_path):
    f = tmp_path / "notes.gguf"
    f.write_text("not a model")
    assert_clean_error(run_cli("check", "--target", str(f)), "not a GGUF file")


def test_truncated_gguf(tmp_path, tiny):
    f = tmp_path / "cut.gguf"
    f.write_bytes(tiny.target.read_bytes()[:5000])
    assert_clean_error(run_cli("check", "--target", str(f), "--draft", str(tiny.draft)), "truncated")


@pytest.mark.parametrize("args, needle", [
    (["plan", "--parallel", "0"], "bad setting parallel"),
    (["serve", "--parallel", "0"], "bad setting parallel"),  # read into the typed start request first
    (["verify", "--draft-max", "99"], "bad setting draft_max"),
    (["serve", "--tbt-budget", "0.8"], "tbt_budget is a multiple of the answers' time alone"),
    (["plan", "--vram", "abc"], "'abc' is not a size"),
])
def test_a_setting_out_of_bounds_is_one_clear_line(tiny, args, needle):
    assert_clean_error(run_cli(*args, "--target", str(tiny.target), "--draft", str(tiny.draft)), needle)


def test_bad_catalogue(tmp_path):
    f = tmp_path / "models.toml"
    f.write_text("[models.x\nrepo=1")
    assert_clean_error(run_cli("--models", str(f), "models"), "not valid TOML", str(f))
    assert_clean_error(run_cli("models", env={"SPECDECK_MODELS_FILE": str(tmp_path / "none.toml")}), "not found")


def test_models_lists_presets():
    p = run_cli("models")
    assert p.returncode == 0 and "coder-1.5b" in p.stdout and "qwen3.6-27b" in p.stdout


def test_pull_local_files_hashes_and_records(tiny):
    import hashlib

    p = run_cli("pull", "--target", str(tiny.target), "--draft", str(tiny.draft))
    assert p.returncode == 0, p.stderr
    assert hashlib.sha256(tiny.target.read_bytes()).hexdigest() in p.stdout
    again = run_cli("pull", "--target", str(tiny.target))
    assert "verified earlier" in again.stdout


def test_pull_hf_uri_from_local_hub(tiny):
    hub = FakeHub()
    url = hub.start()
    try:
        hub.add("acme/t-GGUF", "t.gguf", tiny.target.read_bytes())
        p = run_cli("pull", "hf://acme/t-GGUF/t.gguf", env={"HF_ENDPOINT": url})
        assert p.returncode == 0, p.stderr
        assert "(hub, hashed now)" in p.stdout
        hub.gated.add("acme/t-GGUF")
        p = run_cli("pull", "hf://acme/t-GGUF/other.gguf", env={"HF_ENDPOINT": url})
        assert_clean_error(p, "gated", "HF_TOKEN")
    finally:
        hub.stop()


def test_default_preset_on_this_machine_is_the_cpu_pair(real_pair):
    p = run_cli("check", env={"SPECDECK_HOME": str(REAL_CACHE)})
    assert p.returncode == 0, p.stderr
    assert "preset coder-1.5b" in p.stderr and "compatible" in p.stdout


def test_check_preset_not_pulled_says_pull_first():
    assert_clean_error(run_cli("check", "coder-1.5b", "--no-probe"), "not on disk", "specdeck pull")
