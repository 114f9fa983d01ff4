"""`specdeck up`, `dash`, `run` and the systemd side of `serve`, as a user runs them.

The real `specdeck up coder-1.5b` is driven in tmux (a real terminal, 80x24): the test waits for
the dashboard, sends a request with the `openai` client, sees the counters move on the screen,
presses Ctrl-C and checks a clean exit. The rest run on the tiny models or stop before loading.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import REAL_CACHE, ROOT, run_cli
from openai import OpenAI
from support.live import free_port, up_until_sigterm, wait_for

from app.models.catalog import load_catalog

SPECDECK = [sys.executable, "-m", "app.cli"]




class Tmux:
    """A private tmux server (its own socket) with one 80x24 window running a command."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.sock = f"specdeck-test-{os.getpid()}-{time.monotonic_ns()}"
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        self.tmux(["new-session", "-d", "-s", "t", "-x", "80", "-y", "24", f"cd {ROOT} && env {exports} {command}"])

    def tmux(self, args: list[str]) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=30, check=False).stdout

    def screen(self) -> str:
        return self.tmux(["capture-pane", "-p", "-t", "t"])

    def keys(self, *keys: str) -> None:
        self.tmux(["send-keys", "-t", "t", *keys])

    def close(self) -> None:
        self.tmux(["kill-server"])


@pytest.mark.real
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_up_real_pair_in_tmux_dashboard_request_ctrl_c(real_pair, tmp_path):
    port = free_port()
    done = tmp_path / "exit_code"
    env = {"SPECDECK_HOME": str(REAL_CACHE), "HF_HOME": str(tmp_path / "hf"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    cmd = (f"{sys.executable} -m app.cli up coder-1.5b --offline --port {port} --ctx 1024 --parallel 1 "
           f"--interval 0.5; echo $? > {done}; sleep 60")
    tmux = Tmux(cmd, env)
    try:
        screen = wait_for(lambda: (s := tmux.screen()) and "Ctrl-C quits" in s and "requests" in s and s, 300)
        assert screen, f"no dashboard:\n{tmux.screen()}"
        lines = screen.rstrip("\n").split("\n")
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert "qwen2.5-coder-1.5b-instruct-q4_k_m" in screen and "ctx 1,024" in screen
        assert "1 done" in screen and "8 tokens out" in screen  # the start-up smoke request (8 tokens)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="coder-1.5b", max_tokens=16, temperature=0,
                                           messages=[{"role": "user", "content": "Write a Python hello world."}],
                                           extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 16
        moved = wait_for(lambda: (s := tmux.screen()) and "2 done" in s and "24 tokens out" in s and s, 15)
        assert moved, f"counters did not move:\n{tmux.screen()}"
        assert "TTFT - s last" not in moved and "last request -" not in moved  # the request's figures are shown
        tmux.keys("C-c")
        code = wait_for(lambda: done.exists() and done.read_text().strip(), 30)
        final = tmux.screen()
        assert code == "0", final
        assert "stopped cleanly" in final and "Traceback" not in final
        for n, step in enumerate(("detect hardware", "pull and verify", "check the pair", "plan memory",
                                  "load models", "warm up", "serve"), 1):
            assert f"[{n}/7] {step}" in subprocess.run(["tmux", "-L", tmux.sock, "capture-pane", "-p", "-S", "-200", "-t", "t"],
                                                        capture_output=True, text=True, check=False).stdout
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # nothing listens any more
    finally:
        tmux.close()


@pytest.mark.real
def test_up_refuses_a_corrupted_cached_model_and_never_loads_it(real_pair, tmp_path):
    """A damaged draft in the cache: detected by its SHA-256, removed, and (offline) refused."""
    catalog = load_catalog()
    preset = catalog.preset("coder-1.5b")
    target, draft = catalog.model(preset.target), catalog.model(preset.draft)
    home = tmp_path / "specdeck"
    (home / "models" / target.sha256).mkdir(parents=True)
    (home / "models" / target.sha256 / target.file).symlink_to(real_pair.target)  # read only, never written
    bad = home / "models" / draft.sha256 / draft.file
    bad.parent.mkdir(parents=True)
    shutil.copyfile(real_pair.draft, bad)
    with bad.open("r+b") as f:  # same size, 4 KiB of different bytes in the middle
        f.seek(bad.stat().st_size // 2)
        f.write(os.urandom(4096))
    port = free_port()
    r = run_cli("up", "coder-1.5b", "--offline", "--port", str(port), "--ctx", "1024",
                env={"SPECDECK_HOME": str(home)})
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    assert "cached copy is damaged" in text and draft.sha256 in text
    assert f"error: {draft.name}: not on disk, and offline mode is on" in text
    assert "load models" not in text and "Traceback" not in text and "[3/7]" not in text
    assert not bad.exists() and real_pair.draft.stat().st_size == draft.size
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the port bound at the start was released


def test_up_on_a_busy_port_is_one_line_before_any_work(tiny):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t = time.monotonic()
        r = run_cli("up", "--target", str(tiny.target), "--draft", str(tiny.draft), "--port", str(port))
    assert r.returncode == 1 and time.monotonic() - t < 20
    assert f"error: cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    assert "[1/7]" not in r.stderr


def test_up_not_a_tty_logs_lines_and_sigterm_stops_it_cleanly(tiny, tmp_path):
    def ask(url: str) -> None:
        OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).completions.create(
            model="custom", prompt="a b c", max_tokens=5, temperature=0)

    p = up_until_sigterm("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "256", "--log-interval", "0.5",
                         port=free_port(), during=ask)
    out, err = p.stdout, p.stderr
    assert p.returncode == 0, err
    lines = [line for line in out.splitlines() if line.startswith("specdeck: tok/s")]
    assert lines and "done 2" in lines[-1] and "tokens_out 13" in lines[-1]  # the start-up smoke (8 tokens), then ours
    assert "[7/7] serve" in err and "stopped cleanly" in err and "Traceback" not in err
    revs = json.loads(run_cli("config", "history", "--json").stdout)["revisions"]
    assert [(r["command"], r["status"]) for r in revs] == [("up", "good")] and "smoke: 8 tokens, revision 1" in err


def _get(url: str, key: str | None = None) -> int | None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_serve_under_systemd_notify_and_watchdog_then_dash_url(tiny, tmp_path):
    """`serve` as the unit runs it: READY=1 after loading, WATCHDOG=1 while /health answers;
    then `dash --url` draws that server from /v1/status and /metrics with the API key."""
    sock_path = Path(tempfile.mkdtemp(prefix="sdn")) / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(60)
    port = free_port()
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000", "SPECDECK_API_KEY": "k3y"}
    p = subprocess.Popen([*SPECDECK, "serve", "--target", str(tiny.target), "--draft", str(tiny.draft), "--port", str(port),
                          "--ctx", "256"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        got: list[str] = []
        while not any("READY=1" in m for m in got) or sum("WATCHDOG=1" in m for m in got) < 2:
            got.append(listener.recv(4096).decode())
        assert any(m.startswith("STATUS=loading") for m in got)
        assert any("READY=1" in m and "revision 1" in m for m in got)  # systemctl status shows the revision
        assert _get(f"http://127.0.0.1:{port}/health") == 200
        OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0).completions.create(
            model="custom", prompt="a b c", max_tokens=7, temperature=0)
        no_key = run_cli("dash", "--url", f"http://127.0.0.1:{port}", "--once", env={"SPECDECK_API_KEY": ""})
        assert no_key.returncode == 1 and "wants an API key" in no_key.stderr and "Traceback" not in no_key.stderr
        r = run_cli("dash", "--url", f"http://127.0.0.1:{port}", "--once", env={"SPECDECK_API_KEY": "k3y", "COLUMNS": "80"})
        assert r.returncode == 0, r.stderr
        assert "target.gguf" not in r.stdout and "target " in r.stdout and "2 done" in r.stdout and "15 tokens out" in r.stdout
        assert all(len(line) <= 80 for line in r.stdout.splitlines())
        r = run_cli("dash", "--url", f"http://127.0.0.1:{port}", "--once", "--log", env={"SPECDECK_API_KEY": "k3y"})
        assert r.stdout.startswith("specdeck: tok/s") and "tokens_out 15" in r.stdout
        p.terminate()
        p.communicate(timeout=30)
        assert p.returncode == 0  # SIGTERM (systemctl stop): graceful shutdown, cleanup, exit 0
        down = run_cli("dash", "--url", f"http://127.0.0.1:{port}", "--once", "--log")
        assert down.returncode == 0 and "unreachable" in down.stdout
    finally:
        p.kill()
        listener.close()


def test_run_chat_streams_multiline_and_bye(tiny):
    script = 'hello there\n"""\nfirst line\nsecond line\n"""\n/nope\n/bye\nnever read\n'
    r = subprocess.run([*SPECDECK, "run", "--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512",
                        "--max-tokens", "12"], cwd=ROOT, input=script, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr
    stats = [line for line in r.stdout.splitlines() if " tok/s · acceptance " in line]
    assert len(stats) == 2 and all(line.startswith("12 tokens") for line in stats)
    assert "unknown command /nope" in r.stdout
    assert "[6/6] warm up" in r.stderr and "[7/7]" not in r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies_and_install_service_dry_run(tmp_path):
    unit = (ROOT / "systemd" / "specdeck.service").read_text()
    for line in ("Type=notify", "User=@USER@", "Restart=on-failure", "EnvironmentFile=/etc/specdeck/specdeck.env",
                 "WatchdogSec=", "NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/cache/specdeck",
                 "PrivateTmp=yes", "ProtectHome=yes", "CapabilityBoundingSet=\n"):
        assert line in unit, line

    def verify(venv: Path) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "specdeck.service"
        path.write_text(unit.replace("@VENV@", str(venv)).replace("@USER@", "daemon"))
        return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60, check=False)

    assert verify(Path(sys.executable).parent.parent).returncode == 0
    bad = verify(tmp_path / "no-venv")
    assert bad.returncode != 0 and "not executable" in bad.stderr  # the check can fail
    r = subprocess.run(["bash", str(ROOT / "install.sh"), "--service", "--dry-run", "--pull", "coder-1.5b",
                        "--venv", str(Path(sys.executable).parent.parent)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "systemd-analyze verify: ok" in r.stdout
    assert "would run: systemctl enable --now specdeck.service" in r.stdout
    assert "specdeck pull coder-1.5b" in r.stdout and "runuser -u specdeck" in r.stdout


@pytest.mark.real
def test_up_sigterm_while_loading_is_a_stop_and_under_a_stream_ends_it_with_a_reason(real_pair, tmp_path):
    """`up` stopped as a service would be: SIGTERM while the models load exits 0 ("stopped during:
    load models", the revision not failed); SIGTERM while an answer streams ends the stream with
    finish "abort" and [DONE], and exits 0."""
    base = [*SPECDECK, "up", "--target", str(real_pair.target), "--draft", str(real_pair.draft), "--ctx", "2048",
            "--log-interval", "60"]
    p = subprocess.Popen([*base, "--port", str(free_port())], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "SPECDECK_SHUTDOWN_GRACE": "0"})
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("load models" in x for x in err), 120, 0.01), "".join(err)
        p.terminate()
        assert p.wait(60) == 0, "".join(err)
    finally:
        p.kill()
        reader.join(5)
    assert "stopped during: load models" in "".join(err) and "Traceback" not in "".join(err), "".join(err)
    assert [r["status"] for r in json.loads(run_cli("config", "history", "--json").stdout)["revisions"]] == ["new"]

    port = free_port()
    p = subprocess.Popen([*base, "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "SPECDECK_SHUTDOWN_GRACE": "0"})
    err = []
    reader = threading.Thread(target=lambda: err.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    lines: list[str] = []
    try:
        assert wait_for(lambda: any("OpenAI-compatible API on" in x for x in err), 300), "".join(err)  # smoke passed

        def stream() -> None:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                              json={"prompt": "def fib(n):", "max_tokens": 1500, "stream": True}) as r:
                lines.extend(r.iter_lines())

        t = threading.Thread(target=stream)
        t.start()
        assert wait_for(lambda: len(lines) >= 10, 120, 0.02)
        p.terminate()
        p.wait(60)
        t.join(30)
    finally:
        p.kill()
        reader.join(5)
    err_text = "".join(err)
    assert p.returncode == 0 and "stopped cleanly" in err_text and "Traceback" not in err_text, err_text
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert [x for x in lines if x][-1] == "data: [DONE]" and data[-1]["choices"][0]["finish_reason"] == "abort"
