#!/usr/bin/env python3
"""What evaluating a prompt in chunks of n_ubatch (so a stop or a cancel waits at most one chunk)
costs against the chunks of n_batch it was evaluated in before, on this machine, side by side.

    python scripts/prefill_chunks.py [--preset coder-1.5b] [--tokens 4096] [--rounds 3] [--threads N] [--json]

One context (the plan's target parameters, n_batch 2048, n_ubatch 512) evaluates the same prompt of
`--tokens` tokens from an empty cache, once in n_ubatch chunks (`kv.evaluate`, what the engine does)
and once in n_batch chunks (one `llama_decode` per 2,048 tokens, which llama.cpp splits into the same
ubatches), the order flipping every round (ABBA). The ratio ubatch / batch is taken per round:
median (min-max), with the largest wait a stop could meet (one chunk's time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.engine import kv  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402


def by_batch(ctx: Context, tokens: list[int]) -> None:
    """The way before: one decode per n_batch tokens."""
    b, step = ctx.batch, ctx.params.n_batch
    for c0 in range(0, len(tokens), step):
        b.clear()
        for pos in range(c0, min(len(tokens), c0 + step)):
            b.add(tokens[pos], pos, 0, pos == len(tokens) - 1)
        ctx.decode(b)


def timed(ctx: Context, tokens: list[int], how) -> float:
    ctx.seq_rm(0, 0, -1)
    t = time.perf_counter()
    how(ctx, tokens)
    ctx.synchronize()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    ns = argparse.Namespace(name=args.preset, target=None, draft=None, models=None)
    sel = make_selection(ns, catalog_from_args(ns))
    info = read_model_info(local_path(make_fetcher(offline=True), sel.target))
    hw = detect()
    plan = make_plan(info, None, PlanRequest(ctx=args.tokens + 256, ctx_is_user_choice=True, parallel=1), hw, args.tokens + 256)
    ctx = Context(Model(Path(info.path)), plan.target, args.threads or hw.cpu_count)
    tokens = [5 + (i * 7919) % 20000 for i in range(args.tokens)]
    ubatch = lambda c, t: kv.evaluate(c, 0, t, 0, logits_last=True)  # noqa: E731
    timed(ctx, tokens[:512], ubatch)  # warm
    rows = []
    for r in range(args.rounds):
        order = [("ubatch", ubatch), ("batch", by_batch)]
        if r % 2:
            order.reverse()
        got = {name: timed(ctx, tokens, how) for name, how in order}
        rows.append(got)
    ratios = [row["ubatch"] / row["batch"] for row in rows]
    per_chunk = statistics.median(row["ubatch"] for row in rows) / -(-args.tokens // plan.target.n_ubatch)
    result = {"tokens": args.tokens, "n_batch": plan.target.n_batch, "n_ubatch": plan.target.n_ubatch,
              "seconds": rows, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
              "ratio_max": max(ratios), "chunk_seconds": per_chunk}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.tokens} tokens, n_batch {plan.target.n_batch}, n_ubatch {plan.target.n_ubatch}, {args.rounds} rounds (ABBA)")
        for row in rows:
            print(f"  ubatch chunks {row['ubatch']:.2f} s   batch chunks {row['batch']:.2f} s")
        print(f"ubatch / batch: {result['ratio_median']:.3f} ({result['ratio_min']:.3f}-{result['ratio_max']:.3f}); "
              f"a stop waits at most one chunk: {per_chunk:.2f} s here")
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
