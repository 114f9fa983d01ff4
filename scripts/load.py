#!/usr/bin/env python3
"""A load run: C concurrent clients send a fixed number of greedy requests to `specdeck serve` on the
CPU pair (127.0.0.1 only), and every answer is checked against the same request run alone.

    python scripts/load.py [--preset coder-1.5b] [--clients 4] [--requests 24] [--max-tokens 48] [--json]

The server runs with --parallel 2 and a queue of --max-queue, so some requests are turned away with
429 on purpose; a client waits for Retry-After and sends the request again. Passes with zero errors
other than those 429s, and every answer equal to its solo run or first differing at a near-tie (the
target's top-two logit gap there within `specdeck verify`'s tolerance: batching with other sequences
shifts llama.cpp's numerics). Reports p50/p95 latency of the completed requests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import free_port
from app.ops.client import wait_until_ready

PROMPTS = [
    "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n",
    "# Read a CSV file and print the sum of the second column\nimport csv\n\n",
    "class Stack:\n    \"\"\"A LIFO stack backed by a list.\"\"\"\n\n    def __init__(self):\n",
    "def is_palindrome(s: str) -> bool:\n",
    "// JavaScript: debounce a function\nfunction debounce(fn, ms) {\n",
    "SELECT name, COUNT(*) FROM orders\n",
]


def start_server(preset: str, max_queue: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    f = open(log, "w")  # noqa: SIM115 - the server owns it
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", preset, "--port", str(port), "--ctx", "4096",
                             "--parallel", "2", "--max-queue", str(max_queue)], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, proc, timeout=300)
    return proc, url


def request(url: str, prompt: str, max_tokens: int) -> dict:
    """One request, sent again after a 429 (counted); returns text, latency and what happened."""
    rejected, t0 = 0, time.perf_counter()
    while True:
        t = time.perf_counter()
        try:
            r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                           timeout=600)
        except httpx.HTTPError as e:
            return {"error": repr(e), "rejected": rejected}
        if r.status_code == 429:
            rejected += 1
            time.sleep(float(r.headers.get("retry-after", "1")))
            continue
        if r.status_code != 200:
            return {"error": f"{r.status_code} {r.text[:200]}", "rejected": rejected}
        body = r.json()
        return {"text": body["choices"][0]["text"], "latency": time.perf_counter() - t, "total": time.perf_counter() - t0,
                "rejected": rejected, "tokens": body["usage"]["completion_tokens"]}


def near_tie_check(preset: str, pairs: list[tuple[str, str, str]]) -> list[dict]:
    """For answers that differ from their solo run: where, and the target's top-two gap there."""
    from rich.console import Console

    from app.commands.equivalence import GAP_TOLERANCE, text_divergence
    from app.engine.text import Tokenizer
    from app.gguf.info import read_model_info
    from app.llama.context import Context, Model
    from app.models.catalog import load_catalog
    from app.models.fetch import Fetcher
    from app.plan.hardware import detect
    from app.plan.planner import PlanRequest, make_plan
    from app.settings import hub_settings, paths

    cat = load_catalog()
    spec = cat.model(cat.preset(preset).target)
    got = Fetcher(paths(), hub_settings(), Console(stderr=True, quiet=True), offline=True).existing(spec)
    info = read_model_info(got.path)
    plan = make_plan(info, None, PlanRequest(ctx=4096, ctx_is_user_choice=True, parallel=1), detect(), 4096)
    model = Model(got.path)
    tok, ctx = Tokenizer(model, info.vocab.chat_template), Context(model, plan.target, os.cpu_count() or 1)
    out = []
    try:
        for prompt, solo, other in pairs:
            i, gap = text_divergence(ctx, tok, tok.encode(prompt), solo, other)
            out.append({"prompt": prompt[:40], "token": i, "gap": gap, "near_tie": gap <= GAP_TOLERANCE})
    finally:
        ctx.close()
        model.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-queue", type=int, default=1, help="the server's queue beyond its 2 slots (default 1: some 429s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"specdeck-load-{os.getpid()}.log"
    proc, url = start_server(args.preset, args.max_queue, log)
    try:
        solo = {p: request(url, p, args.max_tokens) for p in PROMPTS}
        work = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(lambda p: (p, request(url, p, args.max_tokens)), work))
        wall = time.time() - t0
        healthy = httpx.get(url + "/health").json() == {"status": "ok"}
    finally:
        proc.terminate()
        rc = proc.wait(60)
    errors = [r["error"] for _, r in results if "error" in r] + [r["error"] for r in solo.values() if "error" in r]
    done = [(p, r) for p, r in results if "text" in r]
    differ = [(p, solo[p]["text"], r["text"]) for p, r in done if r["text"] != solo[p]["text"]]
    ties = near_tie_check(args.preset, differ) if differ else []
    lat = sorted(r["latency"] for _, r in done)
    summary = {
        "preset": args.preset, "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
        "completed": len(done), "errors": len(errors), "error_samples": errors[:5],
        "deliberate_429": sum(r["rejected"] for _, r in results),
        "identical_to_solo": len(done) - len(differ), "differing": len(differ),
        "differing_at_near_tie": sum(t["near_tie"] for t in ties), "divergences": ties,
        "latency_p50_s": round(statistics.median(lat), 2) if lat else None,
        "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2) if lat else None,
        "tokens_per_second": round(sum(r["tokens"] for _, r in done) / wall, 1), "wall_s": round(wall, 1),
        "healthy_after": healthy, "server_exit": rc, "log": str(log),
    }
    ok = (not errors and len(done) == args.requests and all(t["near_tie"] for t in ties) and healthy)
    summary["ok"] = ok
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['completed']}/{args.requests} requests from {args.clients} clients in {summary['wall_s']} s; "
              f"errors {summary['errors']}; deliberate 429s {summary['deliberate_429']} (retried); "
              f"identical to solo {summary['identical_to_solo']}, differing {summary['differing']} "
              f"(at a near-tie: {summary['differing_at_near_tie']}); latency p50 {summary['latency_p50_s']} s, "
              f"p95 {summary['latency_p95_s']} s; {summary['tokens_per_second']} tok/s; ok: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
