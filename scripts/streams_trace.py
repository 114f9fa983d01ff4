#!/usr/bin/env python3
"""Where speculation wins or loses with several streams: the engine as `specdeck serve --parallel N`
builds it (adaptive drafter, calibrated costs), the `coding` prompts decoded N at a time, speculation
on and off in ABBA order, and what the speculative steps did.

    python scripts/streams_trace.py [--preset coder-1.5b] [--streams 4] [--tokens 128] [--rounds 2] [--ctx 16384]

Per run: generated tokens/s of the decode phase (prompts are evaluated before the clock starts,
as the server's benchmark primes its prompt cache). For the speculative runs: steps, tokens per
target decode, time drafting against verifying, and per drafter the slot-steps it drafted, its
draft lengths and how many of its tokens were kept; then the measured c_verify(n) of the steps
against the controller's model. Every run drafts from an empty suffix partition of its own.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.commands.equivalence import BUILTIN_PROMPTS, prompt_tokens  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.engine.loader import load  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402


class Run:
    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.steps = 0
        self.t_draft = 0.0
        self.t_verify = 0.0
        self.by_drafter: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # slot-steps, drafted, kept
        self.verify: dict[int, list[float]] = collections.defaultdict(list)  # batch tokens -> step verify seconds
        self.drafted: list[tuple[int, int, int]] = []  # per drafted slot-step: sequences in the step, drafted, kept


def run(engine: Engine, prompts: list[list[int]], tokens: int, speculative: bool, n_max: int, tag: str) -> Run:
    """The prompts on slots 0..N-1 together until each has `tokens` tokens; the decode phase timed."""
    slots = engine.slots[: len(prompts)]
    spec = SpecParams(enabled=speculative, n_max=n_max)
    for slot, ids in zip(slots, prompts):
        engine.start(slot, Request(prompt=ids, max_tokens=tokens, speculative=spec, partition=tag))
    live = list(slots)
    out = Run()
    t0 = time.perf_counter()
    while live:
        records = engine.step(live)
        out.steps += 1
        n_batch = sum(1 + r.drafted for r in records)
        out.verify[n_batch].append(records[0].t_verify * len(records))
        out.t_verify += records[0].t_verify * len(records)
        for r in records:
            out.tokens += len(r.tokens)
            out.t_draft += r.t_draft
            d = out.by_drafter[r.drafter]
            d[0] += 1
            d[1] += r.drafted
            d[2] += r.accepted
            if r.drafted:
                out.drafted.append((len(records), r.drafted, r.accepted))
        done = {r.slot for r in records if r.finish_reason is not None}
        for s in [s for s in live if s.id in done]:
            engine.finish(s, "length")
        live = [s for s in live if s.id not in done]
    out.seconds = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", action="store_true", help="list every drafted slot-step")
    args = ap.parse_args()
    args.name, args.target, args.draft, args.models = args.preset, None, None, None
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft else None
    hw = detect()
    plan = make_plan(target, draft, PlanRequest(ctx=args.ctx, ctx_is_user_choice=True, parallel=args.streams), hw, args.ctx)
    loaded = load(plan, target, draft, args.threads or hw.cpu_count, adaptive=True)
    try:
        tok = loaded.tokenizer
        items = (BUILTIN_PROMPTS * args.streams)[: args.streams]
        prompts = [prompt_tokens(tok, item) for item in items]
        costs = loaded.engine.costs.costs
        model_before = {n: costs.c_verify(n) for n in (1, 2, 4, 5, 6, 8, 12, 16, 24, 32)}
        print(f"{args.streams} streams, {args.tokens} tokens each, draft_max {plan.draft_max}; prompts: "
              + ", ".join(f"{i['kind']} ({len(p)})" for i, p in zip(items, prompts)))
        results: dict[str, list[Run]] = {"spec": [], "plain": []}
        for r in range(args.rounds):
            for mode in (("spec", "plain") if r % 2 == 0 else ("plain", "spec")):
                x = run(loaded.engine, prompts, args.tokens, mode == "spec", plan.draft_max, f"r{r}-{mode}")
                results[mode].append(x)
                print(f"round {r + 1} {mode:5s}: {x.tokens / x.seconds:6.2f} tok/s, {x.steps} steps, "
                      f"{x.tokens / x.steps:.2f} tokens a step, draft {x.t_draft:.2f} s, verify {x.t_verify:.2f} s "
                      f"of {x.seconds:.2f} s", flush=True)
        ratios = [s.tokens / s.seconds / (p.tokens / p.seconds) for s, p in zip(results["spec"], results["plain"])]
        print(f"spec / plain: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
        agg: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        verify: dict[int, list[float]] = collections.defaultdict(list)
        for x in results["spec"] + results["plain"]:
            for name, d in x.by_drafter.items():
                for i in range(3):
                    agg[name][i] += d[i]
            for n, ts in x.verify.items():
                verify[n] += ts
        for name, (steps, drafted, kept) in sorted(agg.items()):
            print(f"  {name:12s}: {steps} slot-steps, {drafted / max(1, steps):.2f} drafted a step, "
                  f"{kept}/{drafted} kept ({kept / max(1, drafted):.0%})")
        print("verify decode: n tokens -> measured median ms (steps) | model at start | model now")
        for n in sorted(verify):
            print(f"  {n:3d}: {statistics.median(verify[n]) * 1e3:7.1f} ({len(verify[n])}) | "
                  f"{model_before.get(n, float('nan')) * 1e3:7.1f} | {costs.c_verify(n) * 1e3:7.1f}")
        if args.steps:
            for x in results["spec"]:
                print("  drafted steps (sequences, drafted, kept):", " ".join(f"{b}:{d}/{a}" for b, d, a in x.drafted))
        print(f"draft model: {costs.draft * 1e3 if costs.draft else float('nan'):.1f} ms a token")
    finally:
        loaded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
