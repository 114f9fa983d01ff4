"""Claude Code and Codex CLI themselves, installed from npm, run headless against `specdeck serve`
inside a network namespace that has only loopback (`unshare -n`, `ip link set lo up`), so they can
reach nothing but the server started in it. Each answers one prompt; the test checks it printed
the model's answer (the text the server logged). The target is Qwen2.5-Coder 0.5B (the pair's draft, served alone): the CLIs'
requests are thousands of tokens, which the 1.5B target evaluates for minutes on two cores.

Then each makes one tool round trip (write a file, then answer) against the CPU pair served with the
flagship's chat format (`--chat-template-file` Qwen3.5: XML tool calls, <think>), with thinking off
and greedy sampling by default (`--reasoning-budget 0 --temp 0`): a small Qwen2.5 was never taught
to think, and Codex sends no temperature. Whether the small model calls the tool is the model's
business: the prompts are ones it was seen to answer with a call, and a CLI is run again (its
prompt cached) where it answered with text instead.

The CLIs' versions are pinned; they are installed once into ~/.cache/specdeck/npm."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.live import free_port
from support.templates import templates_dir

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
NPM_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdeck" / "npm"
CLIS = {"claude": "@anthropic-ai/claude-code@2.1.197", "codex": "@openai/codex@0.171.0"}
# The CLIs sample at their own temperature (1.0) with a fresh seed: a question with a one-token answer
# (the tests check the CLI printed what the model answered, right or not: 2 + 2 once came back 5).
PROMPT = "What is 2 + 2? Answer with one number."
ATTEMPTS = 4  # runs of a CLI for one tool round trip (see _tries)


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


def _in_netns(tmp: Path, real_pair, cli_lines: str, port: int, serve: str | None = None) -> subprocess.CompletedProcess:
    """Start the server inside a fresh loopback-only network namespace, wait for it, run the CLI."""
    serve = serve or f'--target "{real_pair.draft}" --ctx 24576'
    script = f"""
set -u
ip link set lo up
"{ROOT}/.venv/bin/specdeck" serve {serve} --parallel 1 --port {port} --log-prompts \
    > "{tmp}/serve.log" 2>&1 &
for i in $(seq 1 300); do curl -sf http://127.0.0.1:{port}/health > /dev/null && break; sleep 1; done
{cli_lines}
rc=$?
kill %1
exit $rc
"""
    return subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=1500)


def _codex_env(tmp_path: Path, port: int) -> str:
    """Codex's home with the server as its Responses provider; the environment to run it with. Its
    instructions are a short file of ours (`model_instructions_file`) and the tools it needs not are
    off (`view_image`, `update_plan`): its own instructions and tools are ~6K tokens, which the 1.5B
    reads for ~90 s on two cores; this prompt is ~2.5K, and what the server is tested on (the
    Responses API, tool definitions, the XML call parsed, its output sent back) is the same."""
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    instructions = codex_home / "instructions.md"
    instructions.write_text("You are a coding agent in a terminal. Use the tools to act. Be brief.\n")
    (codex_home / "config.toml").write_text(
        f'model = "gpt-5-codex"\nmodel_provider = "specdeck"\nmodel_instructions_file = "{instructions}"\n\n'
        '[features]\nview_image = false\n\n[tools.update_plan]\nenabled = false\n\n'
        '[model_providers.specdeck]\nname = "specdeck"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nenv_key = "SPECDECK_API_KEY"\nwire_api = "responses"\n')
    return f'HOME="{tmp_path}" CODEX_HOME="{codex_home}" SPECDECK_API_KEY=sk-local'


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
    _printed_the_answer(run.stdout, log)
    assert '"route": "/v1/messages", "status": 200' in log


def _printed_the_answer(stdout: str, log: str) -> None:
    """The CLI printed the model's answer, as the server logged it (--log-prompts). Whether the 0.5B
    model gets 2 + 2 right at the CLI's temperature 1.0 is the model's business: it once said 5."""
    answers = [a["completion"].strip() for a in _answers(log)[1:]]  # after the start-up smoke request
    assert any(a and a in stdout for a in answers), (answers, stdout[-1000:])


def _flagship(real_pair, temp: float) -> str:
    """The CPU pair with Qwen3.6's chat format (the Qwen3.5 template), thinking off."""
    template = templates_dir() / "Qwen3.5-4B.jinja"
    return (f'--target "{real_pair.target}" --draft "{real_pair.draft}" --ctx 16384 --chat-template-file "{template}" '
            f"--reasoning-budget 0 --temp {temp} --max-tokens 384")


@pytest.fixture
def work():
    """A short working folder, the same name on every run: the small model copies its path into its
    calls, and a random name made the same greedy run answer differently from run to run (one name
    derailed it into 384 tokens of broken XML, another wrote the call cleanly)."""
    path = Path("/tmp/specdeck-cli-work")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _answers(log: str) -> list[dict]:
    """The server's per-request lines (with --log-prompts: prompt and completion text)."""
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"request"')]


def _tries(cli: str, done: Path, n: int = ATTEMPTS) -> str:
    """The CLI run until `done` exists, at most n times: the 1.5B stand-in was never taught this format
    and, sampling, does not always call the tool; the prompt stays cached, so a retry costs seconds."""
    return f'for i in $(seq 1 {n}); do {cli}; [ -f "{done}" ] && break; done'


def _round_trip(log: str, tool: str) -> None:
    """A call of `tool` in the model's XML format, and after it (its result in the prompt) an answer."""
    turns = _answers(log)[1:]  # the first is the start-up smoke request
    called = [i for i, t in enumerate(turns) if f"<function={tool}>" in t["completion"]]
    assert called, [t["completion"][:300] for t in turns]
    after = [t for t in turns[called[0] + 1:] if "<tool_response>" in t["prompt"]]
    assert after, [t["completion"][:300] for t in turns]
    assert "chat format qwen3-coder" in log


def test_claude_code_writes_a_file_through_xml_tool_calls(clis, real_pair, tmp_path, work):
    home = tmp_path / "home"
    home.mkdir()
    target = work / "hello.txt"
    port = free_port()
    env = (f'HOME="{home}" ANTHROPIC_BASE_URL=http://127.0.0.1:{port} ANTHROPIC_API_KEY=sk-local '
           "DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 MAX_THINKING_TOKENS=0")
    ask = f"Use the Write tool to create the file {target} containing the word hi. Then reply: done."
    # two model turns at most (the call, then the answer after its result): the small model sometimes
    # calls Write again and again after its result (in CI it wrote "hi", "hi", then "hello")
    cli = (f'{env} timeout 600 "{clis}/claude" -p "{ask}" --model claude-sonnet-4-5 --tools Write --max-turns 2 '
           '--permission-mode acceptEdits --system-prompt "You are a concise assistant."')
    run = _in_netns(tmp_path, real_pair, f'cd "{work}" && {_tries(cli, target)}', port, _flagship(real_pair, 0))
    log = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], log[-3000:])
    written = _written(log, "content")
    assert written and target.read_text().strip() in [w.strip() for w in written], (written, log[-3000:])
    _round_trip(log, "Write")


def _written(log: str, parameter: str) -> list[str]:
    """What the model's XML calls carried in `parameter`, in order: the file holds what one of them
    wrote (Claude Code's prompt carries today's date, so the same greedy run differs day by day)."""
    pattern = re.compile(rf"<parameter={parameter}>\n(.*?)\n?</parameter>", re.S)
    return [m for t in _answers(log)[1:] for m in pattern.findall(t["completion"])]


def test_codex_runs_a_command_through_xml_tool_calls(clis, real_pair, tmp_path, work):
    port = free_port()
    env = _codex_env(tmp_path, port)
    ask = "Call exec_command once, then reply: done. The command: echo hi > hello.txt"
    cli = f'{env} timeout 600 "{clis}/codex" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "{ask}"'
    # greedy (Codex sends no temperature): the pair calls the tool on its first answer (measured here,
    # AMD EPYC: 2 requests, 74 s in all); a second run reads the prompt from the cache, should another
    # CPU's numerics make the first answer text
    run = _in_netns(tmp_path, real_pair, f'cd "{work}" && {_tries(cli, work / "hello.txt", 2)}', port,
                    _flagship(real_pair, 0))
    log = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], log[-3000:])
    assert (work / "hello.txt").read_text().strip() == "hi", (run.stdout[-2000:], log[-3000:])
    _round_trip(log, "exec_command")
    assert '"route": "/v1/responses", "status": 200' in log  # Codex speaks the Responses API
