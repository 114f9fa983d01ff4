#!/usr/bin/env python3
"""A short request's time to first token while a long prompt is being evaluated, against the same
request alone, for `specdeck serve` and llama-server built from the same llama.cpp sources.

    python scripts/prefill_fairness.py [--preset coder-1.5b] [--long 20000] [--short 371] [--json]

Each server (`specdeck serve --parallel 4`, `llama-server -np 4 -kvu`: four slots over one unified
KV pool, the same context and threads, flash attention off) is started alone, measured, and
stopped: never two llama.cpp processes at once. A round measures, on `/completion` with token-id
prompts, each prompt new (no cache helps): the short prompt alone (its TTFT: seconds to the first
streamed token), then a long prompt streamed with `return_progress` and, once its first progress
chunk shows it is being evaluated, another short prompt (its TTFT while the long one is evaluated);
then the long stream is closed. Rounds go specdeck, llama-server, llama-server, specdeck (ABBA);
each server's figure is the median of its rounds, and the ratio llama-server / specdeck is taken per
adjacent pair, median with min-max. Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import find_llama_server, free_port  # noqa: E402
from app.commands.ratios import paired  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.fetch import Fetcher  # noqa: E402
from app.ops.client import wait_until_ready  # noqa: E402
from app.settings import hub_settings, paths  # noqa: E402

WORDS = ("def", "return", "value", "index", "request", "handler", "items", "limit", "config", "result", "parse",
         "token", "buffer", "stream", "client", "server", "cache", "slot", "prompt", "chunk")


def ids(url: str, n: int, seed: int) -> list[int]:
    """A new prompt of exactly n tokens (its own words: no cache holds any of it)."""
    rng = random.Random(seed)
    text = f"# file {seed}\n" + " ".join(f"{rng.choice(WORDS)}_{rng.randrange(10_000)}" for _ in range(n))
    got = httpx.post(url + "/tokenize", json={"content": text}, timeout=120).json()["tokens"]
    if len(got) < n:
        raise SystemExit(f"{url}: tokenized {len(got)} tokens, fewer than {n}")
    return got[:n]


def ttft(url: str, prompt: list[int]) -> float:
    """Seconds from sending the prompt to its first streamed token."""
    t = time.perf_counter()
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "stream": True, "cache_prompt": True}
    with httpx.stream("POST", url + "/completion", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise SystemExit(f"{url}: the short prompt was refused: {r.status_code} {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("content"):
                return time.perf_counter() - t
    raise SystemExit(f"{url}: the short prompt streamed no token")


class LongPrompt:
    """A long prompt streamed in a thread with return_progress; `evaluating` is set at its first
    progress chunk; `close()` drops the stream (both servers then stop evaluating it)."""

    def __init__(self, url: str, prompt: list[int]) -> None:
        self.evaluating, self.progress = threading.Event(), []
        self.client = httpx.Client(timeout=1800)
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, args=(url, prompt), daemon=True)
        self.thread.start()

    def _run(self, url: str, prompt: list[int]) -> None:
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "stream": True, "return_progress": True}
        try:
            with self.client.stream("POST", url + "/completion", json=body) as r:
                if r.status_code != 200:
                    self.error = f"{r.status_code} {r.read().decode()[:300]}"
                for line in r.iter_lines():
                    if "prompt_progress" in line:
                        self.progress.append(json.loads(line[6:])["prompt_progress"])
                        self.evaluating.set()
        except httpx.HTTPError:
            pass  # closed by close()
        finally:
            self.evaluating.set()

    def close(self) -> None:
        self.client.close()
        self.thread.join(60)


def measure(url: str, seed: int, long_n: int, short_n: int) -> dict:
    alone = ttft(url, ids(url, short_n, seed))
    long_prompt, short = ids(url, long_n, seed + 1), ids(url, short_n, seed + 2)
    lp = LongPrompt(url, long_prompt)
    lp.evaluating.wait(1800)
    if lp.error or not lp.progress:
        raise SystemExit(f"{url}: the long prompt was refused or sent no progress: {lp.error}")
    during = ttft(url, short)
    at = lp.progress[-1]
    lp.close()
    return {"alone_s": alone, "during_s": during, "long_processed_when_short_answered": at["processed"],
            "long_total": at["total"]}


def start(command: list[str]) -> tuple[str, subprocess.Popen]:
    port = free_port()
    proc = subprocess.Popen(command + ["--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, timeout=600)
    except BaseException:
        proc.terminate()
        raise
    return url, proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--long", type=int, default=20_000, help="tokens of the long prompt (default 20,000)")
    ap.add_argument("--short", type=int, default=371, help="tokens of the short prompt (default 371)")
    ap.add_argument("--ctx", type=int, default=24576)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 0 < args.short < args.long < args.ctx - 64:
        ap.error("need 0 < --short < --long < --ctx - 64")
    catalog = load_catalog()
    preset = catalog.preset(args.preset)
    fetcher = Fetcher(paths(), hub_settings(), __import__("rich.console").console.Console(quiet=True))
    target = fetcher.existing(catalog.model(preset.target)).path
    server = find_llama_server()
    if server is None:
        raise SystemExit("llama-server was not found: build it with scripts/build_llama_server.sh")
    commands = {
        "specdeck": [sys.executable, "-m", "app.cli", "serve", args.preset, "--parallel", "4", "--ctx", str(args.ctx),
                     "--threads", str(args.threads), "--flash-attn", "off"],
        "llama_server_np4": [str(server), "-m", str(target), "--host", "127.0.0.1", "-np", "4", "-kvu",
                             "-c", str(args.ctx), "-t", str(args.threads), "-tb", str(args.threads), "-fa", "off"],
    }
    rounds: dict[str, list[dict]] = {name: [] for name in commands}
    for i, name in enumerate(["specdeck", "llama_server_np4", "llama_server_np4", "specdeck"]):
        url, proc = start(commands[name])
        try:
            rounds[name].append(measure(url, 1000 * (i + 1), args.long, args.short))
        finally:
            stop(proc)
        r = rounds[name][-1]
        print(f"round {i + 1} {name}: alone {r['alone_s']:.1f} s, while the long prompt is evaluated "
              f"{r['during_s']:.1f} s", file=sys.stderr)
    out = {"long_tokens": args.long, "short_tokens": args.short, "rounds": rounds}
    for name, rs in rounds.items():
        out[name] = {k: statistics.median(r[k] for r in rs) for k in ("alone_s", "during_s")}
        out[name]["during_over_alone"] = paired([r["during_s"] for r in rs], [r["alone_s"] for r in rs])
    # adjacent pairs: rounds 1-2 and 3-4
    s, ls = rounds["specdeck"], rounds["llama_server_np4"]
    out["llama_server_over_specdeck_during"] = paired([ls[0]["during_s"], ls[1]["during_s"]],
                                                      [s[0]["during_s"], s[1]["during_s"]])
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"short prompt {args.short} tokens; long prompt {args.long} tokens (TTFT, seconds: median of 2 rounds)")
    print(f"{'server':<20}{'alone':>10}{'during long':>14}{'during/alone':>22}")
    for name in commands:
        m, lo, hi = out[name]["during_over_alone"]
        print(f"{name:<20}{out[name]['alone_s']:>10.1f}{out[name]['during_s']:>14.1f}"
              f"{f'{m:.1f}x ({lo:.1f}-{hi:.1f})':>22}")
    m, lo, hi = out["llama_server_over_specdeck_during"]
    print(f"llama-server / specdeck, TTFT during the long prompt: {m:.1f}x ({lo:.1f}-{hi:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
