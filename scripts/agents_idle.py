#!/usr/bin/env python3
"""Claude Code and Codex CLI, headless, with their default idle timeouts, on prompts this machine
evaluates for longer than those timeouts: does each get its answer at the first attempt?

    python scripts/agents_idle.py [--preset coder-1.5b] [--agents-md-words 9000] [--json]

Both CLIs abort a response that sends nothing for 300 s (Claude Code's stream idle watchdog, Codex's
`stream_idle_timeout_ms`); on two CPU cores the CPU pair's 1.5B target reads Claude Code's prompt
(its full tool set, ~21K tokens) and Codex's (with an AGENTS.md of --agents-md-words words) for
longer than that. Each CLI runs once, inside a network namespace with only loopback (`unshare -n`,
`ip link set lo up`), against `specdeck serve` started in it (default flags but --log-prompts off);
the CLIs are those tests/test_agent_clis.py pins (installed into ~/.cache/specdeck/npm). Reported per
CLI: its exit code and answer, and from the server's log every request it sent: route, status,
prompt tokens, time to first token, whether its client went away. Needs root or user namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import free_port  # noqa: E402

NPM_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdeck" / "npm"
CLIS = {"claude": "@anthropic-ai/claude-code@2.1.197", "codex": "@openai/codex@0.171.0"}
ASK = "What is 2 + 2? Answer with one number."


def install() -> Path:
    bin_dir = NPM_DIR / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in CLIS):
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("npm is needed to install Claude Code and Codex CLI (Node.js 18+)")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(NPM_DIR), *CLIS.values()],
                       check=True, timeout=900)
    return bin_dir


def agents_md(words: int) -> str:
    """Project notes long enough to make Codex's prompt take longer than its idle timeout to read."""
    rules = []
    for i in range(words // 12):
        rules.append(f"- Rule {i}: functions in module_{i % 53}.py keep their handler_{i} names and document limit {i % 17}.")
    return "# Project notes\n\n" + "\n".join(rules) + "\n"


def run_in_netns(tmp: Path, serve: str, cli: str, port: int) -> tuple[subprocess.CompletedProcess, float]:
    script = f"""
set -u
ip link set lo up
"{ROOT}/.venv/bin/specdeck" serve {serve} --port {port} > "{tmp}/serve.log" 2>&1 &
for i in $(seq 1 600); do curl -sf http://127.0.0.1:{port}/health > /dev/null && break; sleep 1; done
start=$(date +%s.%N)
{cli}
rc=$?
echo "seconds $(echo "$(date +%s.%N) - $start" | bc)" >&2
kill %1
wait %1
exit $rc
"""
    t = time.monotonic()
    run = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=3600)
    return run, time.monotonic() - t


def requests(log: str) -> list[dict]:
    """The server's access lines for the CLI's requests."""
    out = []
    for line in log.splitlines():
        if line.startswith('{"time"'):
            a = json.loads(line)
            out.append({"route": a["route"], "status": a["status"], "prompt_tokens": a["prompt_tokens"],
                        "cached_tokens": a["cached_tokens"], "seconds": round(a["ms"] / 1e3, 1),
                        "client_gone": a.get("client_gone")})
    return out


def answers(log: str) -> list[dict]:
    """The server's per-request lines (after its start-up smoke request): prompt, TTFT, finish."""
    lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"request"')][1:]
    return [{"prompt_tokens": a["prompt_tokens"], "cached_tokens": a["cached_tokens"], "ttft_s": round(a["ttft_ms"] / 1e3, 1),
             "finish": a["finish"]} for a in lines]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--agents-md-words", type=int, default=9000)
    ap.add_argument("--only", choices=list(CLIS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        raise SystemExit("this script needs `unshare -n` (root or user namespaces) to keep the CLIs off the network")
    bin_dir = install()
    results = {}
    for name in [args.only] if args.only else list(CLIS):
        tmp = Path(tempfile.mkdtemp(prefix="sdidle"))
        home, work = tmp / "home", tmp / "work"
        home.mkdir()
        work.mkdir()
        port = free_port()
        if name == "claude":  # README's recipe, as a user runs it: every default, the full tool set
            env = (f'HOME="{home}" ANTHROPIC_BASE_URL=http://127.0.0.1:{port} ANTHROPIC_AUTH_TOKEN=local '
                   "DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
            cli = f'cd "{work}" && {env} "{bin_dir}/claude" -p "{ASK}" --model claude-sonnet-4-5'
        else:
            codex_home = home / ".codex"
            codex_home.mkdir()
            (codex_home / "config.toml").write_text(
                'model = "gpt-5-codex"\nmodel_provider = "specdeck"\n\n[model_providers.specdeck]\nname = "specdeck"\n'
                f'base_url = "http://127.0.0.1:{port}/v1"\nenv_key = "SPECDECK_API_KEY"\nwire_api = "responses"\n')
            (work / "AGENTS.md").write_text(agents_md(args.agents_md_words))
            cli = (f'cd "{work}" && HOME="{home}" CODEX_HOME="{codex_home}" SPECDECK_API_KEY=local '
                   f'"{bin_dir}/codex" exec --skip-git-repo-check "{ASK}"')
        run, seconds = run_in_netns(tmp, args.preset, cli, port)
        log = (tmp / "serve.log").read_text()
        results[name] = {"exit": run.returncode, "seconds": round(seconds, 1), "answer": run.stdout.strip()[-300:],
                         "requests": requests(log), "answers": answers(log), "stderr_tail": run.stderr[-600:]}
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"{name}: exit {run.returncode} after {seconds:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for name, r in results.items():
        print(f"\n{name}: exit {r['exit']}, {r['seconds']:.0f} s, answer: {r['answer'][-80:]!r}")
        print(f"  {'route':<24}{'status':>7}{'prompt':>8}{'cached':>8}{'seconds':>9}  client gone")
        for q in r["requests"]:
            print(f"  {q['route']:<24}{q['status']:>7}{q['prompt_tokens']:>8}{q['cached_tokens']:>8}"
                  f"{q['seconds']:>9.1f}  {q['client_gone'] or ''}")
        for a in r["answers"]:
            print(f"  answer: prompt {a['prompt_tokens']} ({a['cached_tokens']} cached), TTFT {a['ttft_s']:.1f} s, "
                  f"finish {a['finish']}")
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
