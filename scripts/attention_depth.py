#!/usr/bin/env python3
"""What flash attention costs on this machine: target decodes of n tokens at a given depth, and the
prompt evaluated to that depth, with llama.cpp's flash attention on and off, side by side.

    python scripts/attention_depth.py [--preset coder-1.5b] [--depths 64,2300,8000] [--sizes 1,4,12,16]
                                      [--rounds 3] [--prefill 8192] [--beside 8192] [--threads N] [--json]

Two contexts over the same weights (the plan's target parameters, flash attention its only
difference) each hold `depth` tokens; then each round times one decode of n tokens (logits for all,
as a verify step) in each, dropped again after, the order of the two flipping every round (ABBA). The
ratio off / on is taken per round: median (min-max). `--prefill`: seconds to evaluate that many
tokens in n_ubatch chunks, on then off then on then off. `--beside`: a decode of n tokens of a short
sequence (300 tokens deep) while another sequence holds that many cells, and with it empty (its cells
saved and loaded back between rounds, ABBA): in one unified cache each decode's attention spans the
cells in use, masked where they are another sequence's. This is the measurement behind the planner's
choice (`--flash-attn auto`: off on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.engine.calibration import _time_decode  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402


SHORT = 300  # tokens of the short sequence that decodes beside another's cells


def fill(ctx: Context, depth: int, seq: int = 0) -> float:
    """The sequence holds `depth` tokens (evaluated in n_ubatch chunks); returns the seconds it took."""
    ctx.seq_rm(seq, 0, -1)
    b, step = ctx.batch, ctx.params.n_ubatch
    t = time.perf_counter()
    for c0 in range(0, depth, step):
        b.clear()
        for pos in range(c0, min(depth, c0 + step)):
            b.add(pos % 100 + 5, pos, seq, pos == depth - 1)
        ctx.decode(b)
    ctx.synchronize()
    return time.perf_counter() - t


def beside(ctx: Context, cells: int, sizes: list[int], rounds: int) -> dict:
    """Seconds of a decode of n tokens of sequence 1 (SHORT deep) with sequence 0 holding `cells`
    cells and with it empty, per n: {"held": [...], "empty": [...]} (ABBA)."""
    fill(ctx, SHORT, seq=1)
    fill(ctx, cells, seq=0)
    saved, held = ctx.save_seq(0), True
    times: dict = {n: {"held": [], "empty": []} for n in sizes}
    for r in range(rounds):
        for want in ((True, False) if r % 2 == 0 else (False, True)):
            if want != held:
                if want and not ctx.load_seq(0, saved):
                    raise SystemExit(f"error: the {cells:,} cells saved could not be loaded back into the context")
                if not want:
                    ctx.seq_rm(0, 0, -1)
                held = want
            for n in sizes:
                times[n]["held" if held else "empty"].append(_time_decode(ctx, 1, SHORT, n, SHORT))
    ctx.seq_rm(0, 0, -1)
    ctx.seq_rm(1, 0, -1)
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--depths", default="64,2300,8000")
    ap.add_argument("--sizes", default="1,4,12,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=0, help="also time evaluating this many prompt tokens")
    ap.add_argument("--beside", type=int, default=0, help="also time a short sequence's decodes beside another holding this many cells")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    args.name, args.target, args.draft, args.models = args.preset, None, None, None
    sel = make_selection(args, catalog_from_args(args))
    target = read_model_info(local_path(make_fetcher(offline=True), sel.target))
    hw = detect()
    ctx_len = max(depths + [args.prefill, args.beside + SHORT]) + max(sizes) + 256
    req = PlanRequest(device="cpu", ctx=ctx_len, ctx_is_user_choice=True, parallel=2 if args.beside else 1, flash_attn="on")
    plan = make_plan(target, None, req, hw, ctx_len)
    model = Model(Path(target.path), 0)
    threads = args.threads or hw.cpu_count
    base = plan.target.with_rows(max(sizes))  # each decode asks logits for all its tokens, as a verify
    ctxs = {on: Context(model, dataclasses.replace(base, flash_attn=on), threads) for on in (True, False)}
    result: dict = {"threads": threads, "n_ubatch": plan.target.n_ubatch, "depths": {}}
    try:
        for depth in depths:
            for ctx in ctxs.values():
                fill(ctx, depth)
            times: dict = {on: {n: [] for n in sizes} for on in ctxs}
            for r in range(args.rounds):
                for on in ((True, False) if r % 2 == 0 else (False, True)):
                    for n in sizes:
                        times[on][n].append(_time_decode(ctxs[on], 0, depth, n, depth))
            row = {}
            for n in sizes:
                ratio = [off / on for on, off in zip(times[True][n], times[False][n])]
                row[n] = {"on_ms": statistics.median(times[True][n]) * 1e3, "off_ms": statistics.median(times[False][n]) * 1e3,
                          "off_vs_on": statistics.median(ratio), "off_vs_on_min_max": [min(ratio), max(ratio)]}
            result["depths"][depth] = row
            if not args.json:
                print(f"depth {depth:6d}: " + "  ".join(
                    f"n={n}: on {v['on_ms']:.0f} / off {v['off_ms']:.0f} ms ({v['off_vs_on']:.2f}, "
                    f"{v['off_vs_on_min_max'][0]:.2f}-{v['off_vs_on_min_max'][1]:.2f})" for n, v in row.items()), flush=True)
        if args.prefill:
            runs: dict = {True: [], False: []}
            for on in (True, False, True, False):
                runs[on].append(fill(ctxs[on], args.prefill))
            result["prefill"] = {"tokens": args.prefill, "on_s": runs[True], "off_s": runs[False]}
            if not args.json:
                print(f"prefill {args.prefill} tokens: on {statistics.median(runs[True]):.1f} s, "
                      f"off {statistics.median(runs[False]):.1f} s (off / on "
                      f"{statistics.median(runs[False]) / statistics.median(runs[True]):.2f})")
        if args.beside:
            result["beside"] = {"cells": args.beside, "short": SHORT, "sizes": {}}
            runs = {on: beside(ctxs[on], args.beside, sizes, args.rounds) for on in ctxs}
            for n in sizes:
                row = {("on" if on else "off"): {k: statistics.median(v) * 1e3 for k, v in runs[on][n].items()} for on in ctxs}
                result["beside"]["sizes"][n] = row
                if not args.json:
                    print(f"beside {args.beside} cells, n={n}: " + "  ".join(
                        f"{k} {v['empty']:.0f} -> {v['held']:.0f} ms ({v['held'] / v['empty']:.2f})" for k, v in row.items()))
    finally:
        for ctx in ctxs.values():
            ctx.close()
        model.close()
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
