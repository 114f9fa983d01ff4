"""The chat page's figures: what it transfers and how long it takes to load on loopback (Debian's
Chromium through Playwright, a fresh browser context each time: a cold cache), and the server's
cost of one streamed answer through the page (a turn, followed over its event stream, as the page
does) against the same request sent straight to /v1/chat/completions (as curl would), in ABBA
order: the server process's CPU seconds and the wall time of each, medians with min-max.

    .venv/bin/python scripts/ui_bench.py [--preset coder-1.5b] [--pairs 4] [--loads 9] [--tokens 64]

It starts its own `specdeck serve` on a free loopback port (run nothing else beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that merges two sorted lists, with a docstring."
LAUNCH = ["--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def spread(xs: list[float], unit: str = "", digits: int = 3) -> str:
    return f"{statistics.median(xs):.{digits}f}{unit} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


@contextlib.contextmanager
def own_server(preset: str):
    """`specdeck serve PRESET` on a free loopback port, once healthy: (its URL, its process). Its home
    is a folder of its own (its conversations apart from yours) with the usual home's pulled models."""
    port = free_port()
    cache = Path(os.environ.get("SPECDECK_HOME") or Path.home() / ".cache" / "specdeck")
    home = tempfile.mkdtemp(prefix="specdeck-bench-")
    for name in ("models", "verified.json", "headers"):
        if (cache / name).exists():
            os.symlink(cache / name, Path(home) / name)
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", preset, "--port", str(port), "--ctx", "4096",
                               "--parallel", "1"], cwd=ROOT, env={**os.environ, "SPECDECK_HOME": home},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("the server did not become healthy")
        yield url, psutil.Process(server.pid)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(home, ignore_errors=True)


def page_loads(url: str, n: int) -> tuple[int, list[float], list[float], list[str]]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    sizes: dict[str, int] = {}
    seen: list = []
    loaded, ready = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH)
        for i in range(n):
            ctx = b.new_context()
            page = ctx.new_page()
            if i == 0:
                page.on("response", lambda r: seen.append(r))
            t0 = time.perf_counter()
            page.goto(url + "/", wait_until="load")
            loaded.append(time.perf_counter() - t0)
            page.wait_for_selector('[data-testid="model"] option', state="attached")
            ready.append(time.perf_counter() - t0)
            if i == 0:
                page.wait_for_load_state("networkidle")
                sizes.update({r.url: len(r.body()) for r in seen if r.ok})
            ctx.close()
        b.close()
    return sum(sizes.values()), loaded, ready, sorted(sizes)


def through_page(c: httpx.Client, tokens: int) -> None:
    cid = c.post("/ui/api/conversations", json={"settings": {"temperature": 0, "max_tokens": tokens}}).json()["id"]
    mid = c.post(f"/ui/api/conversations/{cid}/turns", json={"content": PROMPT}).json()["message"]
    last = None
    with c.stream("GET", f"/ui/api/messages/{mid}/events") as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
    assert last and last["state"] == "done", last


def straight(c: httpx.Client, tokens: int) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": tokens,
            "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return
    raise AssertionError("no [DONE]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--pairs", type=int, default=4, help="ABBA pairs of (page, straight)")
    ap.add_argument("--loads", type=int, default=9, help="cold page loads")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    with own_server(args.preset) as (url, proc):
        total, loaded, ready, urls = page_loads(url, args.loads)
        print(f"page: {total:,} bytes in {len(urls)} responses ({', '.join(u.replace(url, '') for u in urls)})")
        print(f"cold load to the load event: {spread(loaded, ' s')}; to the model list filled: {spread(ready, ' s')}")
        with httpx.Client(base_url=url, timeout=600) as c:
            straight(c, args.tokens)  # warm: the prompt cached for both ways alike
            costs: dict[str, list[float]] = {"page": [], "straight": []}
            walls: dict[str, list[float]] = {"page": [], "straight": []}
            for i in range(args.pairs):
                for way in (("page", "straight") if i % 2 == 0 else ("straight", "page")):
                    c0, t0 = cpu(proc), time.perf_counter()
                    (through_page if way == "page" else straight)(c, args.tokens)
                    walls[way].append(time.perf_counter() - t0)
                    costs[way].append(cpu(proc) - c0)
        ratio = [p / s for p, s in zip(costs["page"], costs["straight"], strict=True)]
        wall = [p / s for p, s in zip(walls["page"], walls["straight"], strict=True)]
        print(f"{args.tokens}-token streamed answer, server CPU seconds: page {spread(costs['page'])}, "
              f"straight {spread(costs['straight'])}; page / straight {spread(ratio, 'x', 3)}")
        print(f"wall seconds: page {spread(walls['page'])}, straight {spread(walls['straight'])}; "
              f"page / straight {spread(wall, 'x', 3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
