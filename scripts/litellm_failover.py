"""LiteLLM's proxy in front of two specdeck servers on loopback (its config from `specdeck kube
--litellm`): requests through the proxy reach both; when one server is stopped mid-load every
request is still answered (retried on the other) and none is answered twice (the servers' access
logs count exactly one 200 per request). Runs inside a network namespace with only loopback.

    LITELLM=/path/to/venv/bin/litellm .venv/bin/python scripts/litellm_failover.py [--requests 24]

Needs LiteLLM's proxy in a venv of its own (`python3 -m venv V && V/bin/pip install 'litellm[proxy]'`;
its pins clash with specdeck's) and Gemma 3 270M pulled here (`specdeck pull gemma3-270m-q4_k_m`): both
servers serve it, one thread each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-failover-test"  # specdeck's key for the proxy
MASTER = "sk-litellm-master-failover-test-0123456789"  # the proxy's own (it refuses to start without one)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, timeout: float, headers: dict | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=3).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def gemma() -> Path:
    sys.path.insert(0, str(ROOT))
    from app.commands.common import catalog_of, local_path, make_fetcher
    from app.models.refs import resolve_ref

    ref = resolve_ref("gemma3-270m-q4_k_m", catalog_of(None))
    return local_path(make_fetcher(offline=True), ref)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--stop-after", type=int, default=6, help="stop one server once this many were answered")
    args = ap.parse_args()
    litellm = os.environ.get("LITELLM") or shutil.which("litellm")
    if not litellm:
        sys.exit("litellm_failover.py: set LITELLM to the proxy's `litellm` command (a venv of its own)")
    if os.environ.get("SPECDECK_IN_NETNS") != "1":  # again, inside a namespace with only loopback
        inner = f"ip link set lo up && SPECDECK_IN_NETNS=1 exec {sys.executable} {' '.join(map(str, sys.argv))}"
        return subprocess.call(["unshare", "-n", "bash", "-c", inner], env={**os.environ, "LITELLM": litellm})
    work = Path(tempfile.mkdtemp(prefix="specdeck-failover-"))
    keys = work / "keys"
    keys.write_text(f"litellm {KEY}\n")
    keys.chmod(0o600)
    model = gemma()
    procs: list[subprocess.Popen] = []
    servers = []
    try:
        for i in range(2):
            port = free_port()
            log = work / f"access-{i}.jsonl"
            p = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--target", str(model), "--port", str(port),
                                  "--ctx", "1024", "--parallel", "2", "--threads", "1", "--api-key-file", str(keys),
                                  "--access-log", str(log), "--no-ui"], cwd=ROOT,
                                 env={**os.environ, "SPECDECK_HOME": str(work / f"home-{i}")},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            servers.append((p, f"http://127.0.0.1:{port}", log))
        for _, url, _ in servers:
            assert wait_ok(url + "/health/ready", 300), f"{url} never became ready"
        config = subprocess.run([sys.executable, "-m", "app.cli", "kube", "--litellm", *[u for _, u, _ in servers]],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
        (work / "litellm.yaml").write_text(config)
        port = free_port()
        proxy = subprocess.Popen([os.environ["LITELLM"], "--config", str(work / "litellm.yaml"), "--port", str(port),
                                  "--host", "127.0.0.1"],
                                 env={**os.environ, "SPECDECK_API_KEY": KEY, "LITELLM_MASTER_KEY": MASTER,
                                      "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                      "LITELLM_TELEMETRY": "False"},
                                 stdout=open(work / "proxy.log", "w"), stderr=subprocess.STDOUT)
        procs.append(proxy)
        proxy_url = f"http://127.0.0.1:{port}"
        assert wait_ok(proxy_url + "/health/liveliness", 180), (work / "proxy.log").read_text()[-2000:]
        answered: list[tuple[int, int, str]] = []
        stopped_at = [None]

        def ask(i: int) -> tuple[int, int, str]:
            body = {"model": "specdeck", "max_tokens": 48, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Request {i}: count from one to ten."}]}
            r = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=300,
                           headers={"Authorization": f"Bearer {MASTER}"})
            return i, r.status_code, r.text[:120]

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            futures = [pool.submit(ask, i) for i in range(args.requests)]
            for f in concurrent.futures.as_completed(futures):
                answered.append(f.result())
                if len(answered) == args.stop_after and stopped_at[0] is None:
                    servers[0][0].send_signal(signal.SIGTERM)  # one server stopped mid-load
                    stopped_at[0] = time.monotonic() - t0
        servers[0][0].wait(120)
        ok = [a for a in answered if a[1] == 200]
        per_server = []
        for _, _, log in servers:
            lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
            per_server.append(sum(1 for x in lines if x.get("route") == "/v1/chat/completions" and x.get("status") == 200))
        print(f"requests through LiteLLM: {len(ok)} of {len(answered)} answered 200 "
              f"(server A stopped with SIGTERM after {args.stop_after} answers, at {stopped_at[0]:.1f} s; it exited "
              f"{servers[0][0].returncode})")
        print(f"200 answers in the servers' access logs: A {per_server[0]}, B {per_server[1]}; together {sum(per_server)} "
              f"for {len(answered)} requests")
        failed = [a for a in answered if a[1] != 200]
        for a in failed:
            print("  not answered:", a)
        good = not failed and sum(per_server) == len(answered) and min(per_server) > 0
        print("PASS" if good else "FAIL")
        return 0 if good else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
