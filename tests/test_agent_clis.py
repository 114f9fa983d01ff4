"""Claude Code and Codex CLI themselves, installed from npm, run headless against `specdeck serve`
inside a network namespace that has only loopback (`unshare -n`, `ip link set lo up`), so they can
reach nothing but the server started in it. Each answers one prompt; the test checks it printed
the model's answer. The target is Qwen2.5-Coder 0.5B (the pair's draft, served alone): the CLIs'
requests are thousands of tokens, which the 1.5B target evaluates for minutes on two cores.

The CLIs' versions are pinned; they are installed once into ~/.cache/specdeck/npm."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.live import free_port

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
NPM_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdeck" / "npm"
CLIS = {"claude": "@anthropic-ai/claude-code@2.1.197", "codex": "@openai/codex@0.171.0"}
# The CLIs sample at their own temperature (1.0) with a fresh seed: the question must be one the 0.5B
# model answers right nearly always ("the capital of France" once came back "Berlin").
PROMPT = "What is 2 + 2? Answer with one number."


def _can_unshare() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-n", "true"]).returncode == 0


@pytest.fixture(scope="module")
def clis() -> Path:
    if not _can_unshare():
        pytest.fail("this test needs `unshare -n` (root or user namespaces) to keep the CLIs off the network")
    bin_dir = NPM_DIR / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in CLIS):
        npm = shutil.which("npm")
        assert npm, "npm is needed to install Claude Code and Codex CLI (install Node.js 18+)"
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(NPM_DIR), *CLIS.values()],
                       check=True, timeout=900)
    return bin_dir


def _in_netns(tmp: Path, real_pair, cli_lines: str, port: int) -> subprocess.CompletedProcess:
    """Start the server inside a fresh loopback-only network namespace, wait for it, run the CLI."""
    script = f"""
set -u
ip link set lo up
"{ROOT}/.venv/bin/specdeck" serve --target "{real_pair.draft}" --ctx 24576 --parallel 1 --port {port} \
    > "{tmp}/serve.log" 2>&1 &
for i in $(seq 1 300); do curl -sf http://127.0.0.1:{port}/health > /dev/null && break; sleep 1; done
{cli_lines}
rc=$?
kill %1
exit $rc
"""
    return subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=1500)


def test_claude_code_answers_through_the_messages_api(clis, real_pair, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = (f'HOME="{home}" ANTHROPIC_BASE_URL=http://127.0.0.1:{{port}} ANTHROPIC_API_KEY=sk-local '
           "DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
    port = free_port()
    run = _in_netns(tmp_path, real_pair, f'{env.format(port=port)} timeout 900 "{clis}/claude" -p "{PROMPT}" '
                    '--model claude-sonnet-4-5 --tools Read --system-prompt "You are a concise assistant."', port)
    log = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], log[-2000:])
    assert "4" in run.stdout, run.stdout
    assert '"route": "/v1/messages", "status": 200' in log


def test_codex_cli_answers_through_the_responses_api(clis, real_pair, tmp_path):
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    port = free_port()
    (codex_home / "config.toml").write_text(
        'model = "gpt-5-codex"\nmodel_provider = "specdeck"\n\n[model_providers.specdeck]\nname = "specdeck"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nenv_key = "SPECDECK_API_KEY"\nwire_api = "responses"\n')
    env = f'HOME="{tmp_path}" CODEX_HOME="{codex_home}" SPECDECK_API_KEY=sk-local'
    run = _in_netns(tmp_path, real_pair, f'cd "{tmp_path}" && {env} timeout 900 "{clis}/codex" exec '
                    f'--skip-git-repo-check "{PROMPT}"', port)
    log = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], log[-2000:])
    assert "4" in run.stdout, (run.stdout, run.stderr[-1000:])
    assert '"route": "/v1/responses", "status": 200' in log
