#!/usr/bin/env python3
"""What a unified KV pool costs 4 streams decoding side by side, against a stream per sequence (as
`llama-server -np 4` has), and with cells held by parked caches below them: 4 sequences of
`--prompt` tokens each, one token each per step, steps timed, the three contexts in alternating order.
Then what keeping a cache out of the pool costs instead: a `--copy`-token cache saved to host memory
and loaded back (the engine's saved prompt caches), against evaluating it.

    python scripts/pool_cost.py [--preset coder-1.5b] [--prompt 800] [--parked 12000] [--rounds 6] [--copy 2600]

Prints each context's ms per step (median, min-max) and its ratio to the per-sequence streams, per
round. In a unified pool every sequence's attention spans the cells up to the highest one in use,
masked: other sequences' and parked caches' cells too.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402


def make(model: Model, unified: bool, n_seq: int, n_ctx: int, threads: int) -> Context:
    return Context(model, ModelParams(n_ctx, 512, 512, n_seq, unified, "f16", "f16", True, False, 0, 0), threads)


def fill(ctx: Context, prompts: list[tuple[int, list[int]]]) -> None:
    for seq, p in prompts:
        for i in range(0, len(p), 512):
            ctx.batch.clear()
            for j, t in enumerate(p[i:i + 512]):
                ctx.batch.add(t, i + j, seq, False)
            ctx.decode(ctx.batch)


def ms_per_step(ctx: Context, lengths: list[int], steps: int) -> float:
    t0 = time.perf_counter()
    for s in range(steps):
        ctx.batch.clear()
        for seq, n in enumerate(lengths):
            ctx.batch.add(100 + s, n + s, seq, True)
        ctx.decode(ctx.batch)
    for seq, n in enumerate(lengths):
        ctx.seq_rm(seq, n, -1)
    return (time.perf_counter() - t0) / steps * 1e3


def copy_cost(model: Model, n: int, rounds: int, threads: int) -> None:
    """Evaluate n tokens on sequence 0, save them to host memory, load them onto sequence 1."""
    ctx = make(model, True, 2, max(4096, 2 * n + 512), threads)
    tokens = [random.Random(1).randrange(1000, 20000) for _ in range(n)]
    t = {"evaluate": [], "save": [], "load": []}
    size = 0
    for _ in range(rounds):
        ctx.clear()
        t0 = time.perf_counter()
        fill(ctx, [(0, tokens)])
        t1 = time.perf_counter()
        data = ctx.save_seq(0)
        t2 = time.perf_counter()
        assert ctx.load_seq(1, data) and ctx.pos_max(1) == n - 1
        t3 = time.perf_counter()
        size = len(data)
        for k, v in zip(t, (t1 - t0, t2 - t1, t3 - t2)):
            t[k].append(v * 1e3)
    print(f"a {n:,}-token cache ({size / 2**20:.0f} MiB): " + ", ".join(
        f"{k} {statistics.median(v):.1f} ms ({min(v):.1f}-{max(v):.1f})" for k, v in t.items())
        + f"; save + load / evaluate {statistics.median(t['save']) + statistics.median(t['load']):.1f}"
        f" / {statistics.median(t['evaluate']):.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--prompt", type=int, default=800, help="tokens each of the 4 sequences holds")
    ap.add_argument("--parked", type=int, default=12000, help="cells parked caches hold in the third context")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copy", type=int, default=2600, help="tokens of the cache saved to host memory and loaded back")
    args = ap.parse_args()
    sel_args = argparse.Namespace(name=args.preset, target=None, draft=None, models=None)
    sel = make_selection(sel_args, catalog_from_args(sel_args))
    model = Model(local_path(make_fetcher(offline=True), sel.target))
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 20000) for _ in range(args.prompt)] for _ in range(4)]
    n_ctx = 4 * 4096
    ctxs = {"unified": make(model, True, 4, n_ctx, args.threads), "streams": make(model, False, 4, n_ctx, args.threads)}
    fill(ctxs["unified"], list(enumerate(prompts)))
    fill(ctxs["streams"], list(enumerate(prompts)))
    if args.parked:
        parked = make(model, True, 8, n_ctx, args.threads)
        fill(parked, [(4 + i, [rng.randrange(1000, 20000) for _ in range(args.parked // 4)]) for i in range(4)])
        fill(parked, list(enumerate(prompts)))
        ctxs["unified+parked"] = parked
    names = list(ctxs)
    res: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            res[k].append(ms_per_step(ctxs[k], [args.prompt] * 4, args.steps))
    for k in names:
        v = res[k]
        ratio = [a / b for a, b in zip(v, res["streams"])]
        print(f"{k:16} {statistics.median(v):6.1f} ms a step ({min(v):.1f}-{max(v):.1f}); / streams "
              f"{statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})")
    for c in ctxs.values():
        c.close()
    if args.copy:
        copy_cost(model, args.copy, max(3, args.rounds // 2), args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
