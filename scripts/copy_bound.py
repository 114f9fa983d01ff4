#!/usr/bin/env python3
"""How many tokens per target decode drafting by copying text could reach on the agent workload:
the target's greedy answers to its turns (in session order), then for each turn the bound
(`app.commands.workloads.copy_bound`: each draft the longest run of the answer's next tokens in the
text, chosen knowing the answer) with the request's own text only, and with every earlier turn's
prompt and answer as well (what a global suffix index can hold); for runs found anywhere, and for
runs that follow an occurrence of the history's last 3 tokens (what lookup, the suffix index and
llama-server's n-gram modes draft).

    python scripts/copy_bound.py [--preset coder-1.5b] [--max-tokens 96] [--draft-max 16] [--json]

A bound, not a speed: it counts decodes, not their cost, and it picks each draft knowing the answer.
It tells how much of a turn's answer is in reach of copying at all: where it is low, no lookup,
suffix or n-gram drafter helps, and only a draft model could. Every run of text counts, a single
common token too, so the bound is generous where little is copied.
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
        row = {"turn": turn["session"] + str(turn["turn"]), "kind": turn["kind"], "cross": turn["cross"],
               "tokens": len(answer)}
        for key, name in ((0, "anywhere"), (KEY, "after_key")):
            row[f"decodes_own_{name}"] = copy_bound([], prompt, answer, args.draft_max, key)
            row[f"decodes_all_{name}"] = copy_bound(earlier, prompt, answer, args.draft_max, key)
        rows.append(row)
        earlier += prompt + answer
    cross = [r for r in rows if r["cross"]]
    per = lambda rs, col: sum(r["tokens"] for r in rs) / max(1, sum(r[col] for r in rs))  # noqa: E731
    cols = ("decodes_own_after_key", "decodes_all_after_key", "decodes_own_anywhere", "decodes_all_anywhere")
    total = {f"{part}_{col.removeprefix('decodes_')}": per(rs, col) for part, rs in (("cross", cross), ("all", rows))
             for col in cols}
    if args.json:
        print(json.dumps({"turns": rows, "tokens_per_decode": total, "max_tokens": args.max_tokens,
                          "draft_max": args.draft_max}, indent=1))
        return 0
    print(f"copy bound, tokens per target decode (greedy answers of {args.max_tokens} tokens at most, drafts of "
          f"{args.draft_max} at most): runs after a {KEY}-token key / runs anywhere, from the request's own text "
          "and with the earlier turns' too")
    print(f"{'turn':4} {'kind':22} {'cross':5} {'tokens':>6} {'key, own':>9} {'key, all':>9} {'any, own':>9} {'any, all':>9}")
    for r in rows:
        print(f"{r['turn']:4} {r['kind']:22} {'yes' if r['cross'] else '':5} {r['tokens']:6} "
              + " ".join(f"{r['tokens'] / max(1, r[c]):9.2f}" for c in cols))
    for part, rs in (("cross-request turns", cross), ("all turns", rows)):
        print(f"{part:34} " + " ".join(f"{per(rs, c):9.2f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
