#!/usr/bin/env python3
"""How many tokens per target decode drafting by copying text could reach on the agent workload:
the target's greedy answers to its turns (in session order), then for each turn the bound
(`app.commands.workloads.copy_bound`) with the request's own text only, and with every earlier
turn's prompt and answer as well (what a global suffix index can hold).

    python scripts/copy_bound.py [--preset coder-1.5b] [--max-tokens 96] [--draft-max 16] [--json]

A bound, not a speed: it counts decodes, not their cost, and it picks each draft knowing the answer.
It tells how much of a turn's answer is in reach of copying at all: where it is low, no lookup,
suffix or n-gram drafter helps, and only a draft model could.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.bench import prompt_tokens  # noqa: E402
from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.commands.workloads import agent_turns, copy_bound  # noqa: E402
from app.engine.drafters.suffix import KEY  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.engine.loader import load  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402


def answers(preset: str, max_tokens: int, threads: int) -> list[tuple[dict, list[int], list[int]]]:
    """(turn, prompt tokens, greedy answer tokens) for every turn of the agent workload."""
    args = argparse.Namespace(name=preset, target=None, draft=None, models=None)
    sel = make_selection(args, catalog_from_args(args))
    target = read_model_info(local_path(make_fetcher(offline=True), sel.target))
    plan = make_plan(target, None, PlanRequest(ctx=8192, ctx_is_user_choice=True, parallel=1), detect(), 8192)
    loaded = load(plan, target, None, threads)
    try:
        out = []
        for turn in agent_turns():
            ids = prompt_tokens(loaded.tokenizer, turn)
            engine = Engine(loaded.target, None, 1)
            req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=loaded.tokenizer.stop_tokens,
                          speculative=SpecParams(enabled=False))
            for _ in engine.generate(req):
                pass
            out.append((turn, ids, list(engine.slots[0].record.completion)))
        return out
    finally:
        loaded.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, earlier = [], []
    for turn, prompt, answer in answers(args.preset, args.max_tokens, args.threads):
        own = copy_bound([], prompt, answer, KEY, args.draft_max)
        every = copy_bound(earlier, prompt, answer, KEY, args.draft_max)
        rows.append({"turn": turn["session"] + str(turn["turn"]), "kind": turn["kind"], "cross": turn["cross"],
                     "tokens": len(answer), "decodes_own": own, "decodes_all": every})
        earlier += prompt + answer
    cross = [r for r in rows if r["cross"]]
    total = {"cross_tokens_per_decode_all": sum(r["tokens"] for r in cross) / max(1, sum(r["decodes_all"] for r in cross)),
             "all_tokens_per_decode_all": sum(r["tokens"] for r in rows) / max(1, sum(r["decodes_all"] for r in rows))}
    if args.json:
        print(json.dumps({"turns": rows, **total, "max_tokens": args.max_tokens, "draft_max": args.draft_max}, indent=1))
        return 0
    print(f"copy bound, tokens per target decode (greedy answers of {args.max_tokens} tokens at most, drafts of "
          f"{args.draft_max} at most, matches of {KEY}+ tokens)")
    print(f"{'turn':4} {'kind':22} {'cross':5} {'tokens':>6} {'own text':>9} {'+ earlier':>9}")
    for r in rows:
        print(f"{r['turn']:4} {r['kind']:22} {'yes' if r['cross'] else '':5} {r['tokens']:6} "
              f"{r['tokens'] / max(1, r['decodes_own']):9.2f} {r['tokens'] / max(1, r['decodes_all']):9.2f}")
    print(f"cross-request turns together: {total['cross_tokens_per_decode_all']:.2f}; "
          f"all turns: {total['all_tokens_per_decode_all']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
