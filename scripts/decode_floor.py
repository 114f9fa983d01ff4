#!/usr/bin/env python3
"""Is specdeck's decode as fast as llama-server's? One 1-token-at-a-time greedy generation through a
bare ctypes loop on a context created the way `specdeck serve --parallel 4` creates it (unified
16K pool, 4 sequences), next to llama-server's own per-token time for the same length, alternating.

    python scripts/decode_floor.py [--preset coder-1.5b] [--tokens 128] [--pairs 6]

Prints llama-server's ms/token over the loop's, per pair and the median. Needs the llama-server
built by scripts/build_llama_server.sh. Loopback only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from serve_bench import start  # noqa: E402

from app.commands.anchors import find_llama_server  # noqa: E402
from app.engine import kv  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.fetch import Fetcher  # noqa: E402
from app.settings import hub_settings, paths  # noqa: E402

PROMPT = "# file 0\n# a small utility, number 0\ndef helper_0(values):\n"


def loop_ms_per_token(ctx: Context, prompt: list[int], n: int) -> float:
    """Greedy, one token per llama_decode, as the engine's plain step does."""
    ctx.clear()
    last = kv.evaluate(ctx, 0, prompt, 0, logits_last=True)
    tok, pos = int(ctx.logits(last).argmax()), len(prompt)
    b = ctx.batch
    t = time.perf_counter()
    for _ in range(n):
        b.clear()
        b.add(tok, pos, 0, True)
        ctx.decode(b)
        tok, pos = int(ctx.logits(0).argmax()), pos + 1
    return (time.perf_counter() - t) / n * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    server = find_llama_server()
    if server is None:
        print("error: no llama-server (run scripts/build_llama_server.sh)", file=sys.stderr)
        return 1
    catalog = load_catalog()
    target = Fetcher(paths(), hub_settings(), Console(quiet=True)).existing(catalog.model(catalog.preset(args.preset).target)).path
    model = Model(Path(target))
    ctx = Context(model, ModelParams(16384, 2048, 512, 4, True, "f16", "f16", True, False, 0, 0), args.threads)
    url, proc = start(lambda port: [str(server), "-m", str(target), "--port", str(port), "--host", "127.0.0.1", "-np", "4",
                                    "-c", "16384", "-t", str(args.threads), "-tb", str(args.threads), "--no-warmup"])
    body = {"prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True}
    try:
        tokens = httpx.post(url + "/tokenize", json={"content": PROMPT}, timeout=60).json()["tokens"]
        httpx.post(url + "/v1/completions", json=body, timeout=600)  # its prompt cache, as the loop has none to pay
        ratios = []
        for i in range(args.pairs):
            server_ms = httpx.post(url + "/v1/completions", json=body, timeout=600).json()["timings"]["predicted_per_token_ms"]
            ours = loop_ms_per_token(ctx, tokens, args.tokens)
            ratios.append(server_ms / ours)
            print(f"pair {i}: llama-server {server_ms:.2f} ms/token, loop {ours:.2f} ms/token, ratio {ratios[-1]:.3f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        ctx.close()
        model.close()
    print(f"llama-server / loop: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
