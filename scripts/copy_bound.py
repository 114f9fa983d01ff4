#!/usr/bin/env python3
"""How many tokens per target decode drafting by copying text could reach on the agent workload:
the target's greedy answers to its turns (in session order), then for each turn the bound
(`app.commands.workloads.copy_bound`: each draft the longest run of the answer's next tokens in the
text, chosen knowing the answer) with the request's own text only, and with every earlier turn's
prompt and answer as well (what a global suffix index can hold); for runs found anywhere, and for
runs that follow an occurrence of the history's last 3 tokens (what lookup, the suffix index and
llama-server's n-gram modes draft).

    python scripts/copy_bound.py [--preset coder-1.5b] [--max-tokens 96] [--draft-max 16]
                                 [--costs BENCH.json] [--answers FILE] [--json]

A bound, not a speed: it counts decodes, and it picks each draft knowing the answer. It tells how
much of a turn's answer is in reach of copying at all: where it is low, no lookup, suffix or n-gram
drafter helps, and only a draft model could. Every run of text counts, a single common token too, so
the bound is generous where little is copied.

Then the same bound in time, on this machine's costs: the fewest seconds of target decodes for each
answer when every draft is copied from text (the earlier turns' included; after a 3-token key, or from
anywhere) and its length is chosen knowing the answer and what a verify of n tokens costs
(`copy_seconds`; drafting counted free), over plain decoding's seconds on the same costs. The costs
are the target's, timed at start (`calibrate`, a short context), or with --costs c_verify_ms of a
`specdeck bench --json` run's "costs" (what its steps measured). No drafter that copies text beats
the ratio from anywhere on these costs; one that drafts after a key match only (no copy resumed past
a changed token) does not beat the ratio after a key.

Last, the text drafters themselves replayed on the same answers and costs (`workloads.replay`):
lookup, suffix, adaptive and adaptive-local, each step's draft checked against the known answer, its
suffix index fed in session order. Deterministic and without the target, so a change to a drafter or
the controller shows its effect in seconds; no draft model (it cannot be replayed without running it).
`--answers FILE` keeps the greedy answers between runs (written on the first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import DRAFT_N_MAX  # noqa: E402
from app.commands.benchruns import mode_drafters  # noqa: E402
from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection  # noqa: E402
from app.commands.equivalence import prompt_tokens  # noqa: E402
from app.commands.workloads import agent_turns, copy_decodes, copy_runs, copy_seconds, replay  # noqa: E402
from app.engine.calibration import calibrate  # noqa: E402
from app.engine.controller import Controller, CostModel  # noqa: E402
from app.engine.drafters.suffix import KEY  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.engine.loader import load  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402


def answers(preset: str, max_tokens: int, threads: int, time_costs: int | None,
            known: list[tuple[dict, list[int], list[int]]] | None = None,
            ) -> tuple[list[tuple[dict, list[int], list[int]]], CostModel | None]:
    """(turn, prompt tokens, greedy answer tokens) for every turn of the agent workload (`known`
    where given), and where `time_costs` is a draft length, the target's decode costs timed here for
    verifies up to one more."""
    if known is not None and time_costs is None:
        return known, None
    args = argparse.Namespace(name=preset, target=None, draft=None, models=None)
    sel = make_selection(args, catalog_from_args(args))
    target = read_model_info(local_path(make_fetcher(offline=True), sel.target))
    plan = make_plan(target, None, PlanRequest(ctx=8192, ctx_is_user_choice=True, parallel=1), detect(), 8192)
    loaded = load(plan, target, None, threads)
    try:
        costs = calibrate(loaded.target, None, time_costs) if time_costs is not None else None
        if known is not None:
            return known, costs
        out = []
        for turn in agent_turns():
            ids = prompt_tokens(loaded.tokenizer, turn)
            engine = Engine(loaded.target, None, 1)
            req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=loaded.tokenizer.stop_tokens,
                          speculative=SpecParams(enabled=False))
            for _ in engine.generate(req):
                pass
            out.append((turn, ids, list(engine.slots[0].record.completion)))
        return out, costs
    finally:
        loaded.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--costs", type=Path, metavar="BENCH.json",
                    help="c_verify_ms of a `specdeck bench --json` run's \"costs\" for the bound in time "
                         "(default: timed here at start)")
    ap.add_argument("--answers", type=Path, metavar="FILE",
                    help="the greedy answers: read from FILE where it was written by a run with the same preset and "
                         "--max-tokens, else generated and written there")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    measured = read_costs(ap, args.costs) if args.costs else None
    turns, timed = cached_answers(ap, args, measured is None)
    costs = measured or timed
    assert costs is not None
    rows, earlier = [], []
    drafters = replay_drafters(costs)
    for turn, prompt, answer in turns:
        row = {"turn": turn["session"] + str(turn["turn"]), "kind": turn["kind"], "cross": turn["cross"],
               "tokens": len(answer)}
        row["plain_s"] = max(0, len(answer) - 1) * costs.c_verify(1)
        for key, name in ((0, "anywhere"), (KEY, "after_key")):
            own = copy_runs([], prompt, answer, args.draft_max, key)
            row[f"decodes_own_{name}"] = copy_decodes(own)
            row[f"best_own_{name}_s"] = copy_seconds(own, costs.c_verify)
            runs = copy_runs(earlier, prompt, answer, args.draft_max, key)
            row[f"decodes_all_{name}"] = copy_decodes(runs)
            row[f"best_copy_{name}_s"] = copy_seconds(runs, costs.c_verify)
        rows.append(row)
        earlier += prompt + answer
        row.update(replayed(prompt, answer, drafters, costs.c_verify, args.draft_max, args.max_tokens))
    cross = [r for r in rows if r["cross"]]
    per = lambda rs, col: sum(r["tokens"] for r in rs) / max(1, sum(r[col] for r in rs))  # noqa: E731
    cols = ("decodes_own_after_key", "decodes_all_after_key", "decodes_own_anywhere", "decodes_all_anywhere")
    total = {f"{part}_{col.removeprefix('decodes_')}": per(rs, col) for part, rs in (("cross", cross), ("all", rows))
             for col in cols}
    speed = {f"{part}_{name}": sum(r["plain_s"] for r in rs) / max(1e-9, sum(r[f"best_copy_{name}_s"] for r in rs))
             for part, rs in (("cross", cross), ("all", rows)) for name in ("anywhere", "after_key")}
    # what the earlier turns' text adds at best: the bound with it over the bound with the request's own
    added = {f"{part}_{name}": sum(r[f"best_own_{name}_s"] for r in rs) / max(1e-9, sum(r[f"best_copy_{name}_s"] for r in rs))
             for part, rs in (("cross", cross), ("all", rows)) for name in ("anywhere", "after_key")}
    c_verify_ms = {n: round(costs.c_verify(n) * 1e3, 1) for n in sorted(costs.verify)}
    if args.json:
        print(json.dumps({"turns": rows, "tokens_per_decode": total, "best_copy_vs_plain": speed,
                          "earlier_text_adds_at_best": added,
                          "c_verify_ms": c_verify_ms, "costs_from": str(args.costs or "calibrated here"),
                          "max_tokens": args.max_tokens, "draft_max": args.draft_max}, indent=1))
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
    print(f"\nthe bound in time, copies from the earlier turns' text too, on c_verify(n) ms {c_verify_ms} "
          f"({args.costs or 'timed here'}): plain decoding's seconds over the fewest with copies after a {KEY}-token "
          "key / from anywhere")
    for r in rows:
        print(f"{r['turn']:4} {r['kind']:22} {r['plain_s']:6.2f} s / " + " / ".join(
            f"{r[f'best_copy_{n}_s']:5.2f} s = {r['plain_s'] / max(1e-9, r[f'best_copy_{n}_s']):5.2f} x"
            for n in ("after_key", "anywhere")))
    for part, label in (("cross", "cross-request turns"), ("all", "all turns")):
        print(f"{label}: {speed[part + '_after_key']:.2f} x plain after a key, {speed[part + '_anywhere']:.2f} x from anywhere")
    print("what the earlier turns' text adds to the bound (in time, with it over with the request's own text only: "
          "how much faster copying knowing the answer gets with a global index): "
          + ", ".join(f"{label} {added[part + '_after_key']:.2f} x after a key, {added[part + '_anywhere']:.2f} x from anywhere"
                      for part, label in (("cross", "cross-request turns"), ("all", "all turns"))))
    print_replay(rows, cross)
    return 0


def print_replay(rows: list[dict], cross: list[dict]) -> None:
    """The text drafters replayed on the same answers and costs: tokens per decode, and plain's
    seconds over theirs."""
    print("\nthe text drafters replayed on these answers and costs (no draft model; suffix indexes fed in session "
          "order): tokens per decode, x plain in time")
    print(f"{'turn':4} {'kind':22} " + " ".join(f"{m:>20}" for m in REPLAYED))
    for r in rows:
        print(f"{r['turn']:4} {r['kind']:22} " + " ".join(
            f"{r['tokens'] / max(1, r[f'replay_{m}_decodes']):8.2f} {r['plain_s'] / max(1e-9, r[f'replay_{m}_s']):6.2f} x    "
            for m in REPLAYED))
    for label, rs in (("cross-request turns", cross), ("all turns", rows)):
        plain = sum(r["plain_s"] for r in rs)
        print(f"{label:27} " + " ".join(
            f"{sum(r['tokens'] for r in rs) / max(1, sum(r[f'replay_{m}_decodes'] for r in rs)):8.2f} "
            f"{plain / max(1e-9, sum(r[f'replay_{m}_s'] for r in rs)):6.2f} x    " for m in REPLAYED))
    for label, rs in (("cross-request turns", cross), ("all turns", rows)):
        local = sum(r["replay_adaptive-local_s"] for r in rs) / max(1e-9, sum(r["replay_adaptive_s"] for r in rs))
        print(f"adaptive / adaptive-local, {label}: {local:.2f} x")


def cached_answers(ap: argparse.ArgumentParser, args: argparse.Namespace,
                   time_costs: bool) -> tuple[list[tuple[dict, list[int], list[int]]], CostModel | None]:
    """The turns' greedy answers, from --answers where that file holds this preset's at this
    --max-tokens (else generated, and written there), with the costs timed here where asked."""
    known = None
    if args.answers and not args.answers.exists() and not args.answers.parent.is_dir():
        ap.error(f"--answers {args.answers}: no folder {args.answers.parent} to write the answers in")
    if args.answers and args.answers.exists():
        try:
            saved = json.loads(args.answers.read_text(encoding="utf-8"))
            if (saved["preset"], saved["max_tokens"], saved["workload"]) == (args.preset, args.max_tokens, workload_digest()):
                turns = agent_turns()
                known = [(t, list(map(int, s["prompt"])), list(map(int, s["answer"]))) for t, s in zip(turns, saved["turns"])]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--answers {args.answers}: not answers written by this script ({e})")
    out, costs = answers(args.preset, args.max_tokens, args.threads, args.draft_max if time_costs else None, known)
    if args.answers and known is None:
        write_answers(ap, args, out)
    return out, costs


def write_answers(ap: argparse.ArgumentParser, args: argparse.Namespace, out: list) -> None:
    try:
        args.answers.write_text(json.dumps({"preset": args.preset, "max_tokens": args.max_tokens,
                                            "workload": workload_digest(), "turns": [
            {"prompt": p, "answer": a} for _, p, a in out]}), encoding="utf-8")
    except OSError as e:
        ap.error(f"--answers {args.answers}: cannot write the answers there ({e})")


def workload_digest() -> str:
    """Which agent workload answers were made for (its turns' messages change with the code they quote)."""
    return hashlib.sha256(json.dumps(agent_turns(), sort_keys=True).encode()).hexdigest()[:16]


REPLAYED = ("lookup", "suffix", "adaptive", "adaptive-local")


def replay_drafters(costs: CostModel) -> dict:
    """The text drafters as `specdeck bench` builds them (`benchruns.mode_drafters`), on these costs and
    without a draft model (its proposals cannot be replayed without running it). Their suffix indexes
    start empty and take each turn's prompt and answer in session order, as in the agent workload."""
    return mode_drafters(None, Controller(costs, learn_costs=False))


def replayed(prompt: list[int], answer: list[int], drafters: dict, c_verify, draft_max: int, max_tokens: int) -> dict:
    """Each text drafter's decodes and seconds to this answer, replayed (`workloads.replay`), with
    drafts as long as `specdeck bench` lets it take (lookup and suffix alone: DRAFT_N_MAX)."""
    row = {}
    for mode in REPLAYED:
        drafter = drafters[mode]
        longest = draft_max if mode.startswith("adaptive") else min(draft_max, DRAFT_N_MAX)
        decodes, seconds = replay(drafter, prompt, answer, c_verify, longest, max_tokens)
        row[f"replay_{mode}_decodes"], row[f"replay_{mode}_s"] = decodes, seconds
    return row


def read_costs(ap: argparse.ArgumentParser, path: Path) -> CostModel:
    """The verify costs a `specdeck bench --json` run reported ("costs": {"c_verify_ms": {n: ms}})."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))["costs"]["c_verify_ms"]
        costs = CostModel({int(n): float(ms) / 1e3 for n, ms in table.items()})
        if 1 not in costs.verify:
            raise ValueError("no cost for a decode of 1 token")
        return costs
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        ap.error(f"--costs {path}: not a `specdeck bench --json` output with costs.c_verify_ms ({e})")


if __name__ == "__main__":
    sys.exit(main())
