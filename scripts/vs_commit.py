#!/usr/bin/env python3
"""The agent workload with this tree's adaptive drafter and with an earlier commit's, side by side.

    python scripts/vs_commit.py --commit 79d153f [--preset coder-1.5b] [--max-tokens 512] [--repeats 3] [--json]

`specdeck bench --workload agent` compares adaptive with `adaptive-local`: this tree's drafter
without the suffix index, which has gained other things since the index came (copies picked up
again after a change, text proposals scored when not drafted). This script measures against the
adaptive drafter as it was at `--commit` (by default 79d153f, the last commit before the suffix
index), checked out into a temporary git worktree and run in a process of its own. Each repeat
runs two processes back to back, who goes first alternating (ABBA): the earlier commit's (plain
decoding, then its adaptive; the order flips each repeat) and this tree's (adaptive, and
adaptive-local; the suffix index empty at the first turn, filled by the turns in session order as
in `bench`). The turns' prompts are the same token ids in both. Both run with flash attention off
(as this tree plans a CPU) and the same threads. Reported per turn group (the cross-request
turns; all turns): tokens/s and tokens per target decode, each mode's median of the repeats, and
the ratios paired per repeat (median, min-max). Loopback only; nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_ADAPTIVE = "79d153f"  # the last commit before the suffix index (#20)


def _pair_info(preset: str):
    """The preset's target and draft headers, from the local copies (with whichever tree's code is
    imported)."""
    from app.commands.common import catalog_from_args, local_path, make_fetcher, make_selection
    from app.gguf.info import read_model_info

    args = argparse.Namespace(name=preset, target=None, draft=None, models=None)
    sel = make_selection(args, catalog_from_args(args))
    fetcher = make_fetcher(offline=True)
    return read_model_info(local_path(fetcher, sel.target)), read_model_info(local_path(fetcher, sel.draft))


def _plan_and_load(tree: Path, preset: str, threads: int):
    """The pair loaded by `tree`'s own code, flash attention off, costs calibrated as its bench does."""
    import dataclasses

    sys.path.insert(0, str(tree))
    from app.engine.loader import load
    from app.plan.hardware import detect
    from app.plan.planner import PlanRequest, make_plan

    target, draft = _pair_info(preset)
    plan = make_plan(target, draft, PlanRequest(ctx=4096, ctx_is_user_choice=True, parallel=1, draft_max=16),
                     detect(), 4096)
    rows = {"n_outputs_max": 49} if hasattr(plan.target, "n_outputs_max") else {}  # adaptive verifies up to 48 drafted
    plan = dataclasses.replace(plan, target=dataclasses.replace(plan.target, flash_attn=False, **rows),
                               draft=dataclasses.replace(plan.draft, flash_attn=False))
    return load(plan, target, draft, threads)


def prompt_ids(turns: list[dict], preset: str) -> list[list[int]]:
    """The turns' prompts as token ids, with the target's own tokenizer (its weights mapped, no context)."""
    from app.commands.equivalence import prompt_tokens
    from app.engine.text import Tokenizer
    from app.llama.context import Model

    target, _ = _pair_info(preset)
    model = Model(Path(target.path))
    try:
        tok = Tokenizer(model, target.vocab.chat_template)
        return [prompt_tokens(tok, t) for t in turns]
    finally:
        model.close()


def _one(loaded, drafter, mode: str, ids: list[int], max_tokens: int, n_max: int) -> dict:
    """One greedy request, as `benchruns.measure_one` runs it. Kept here rather than imported: an
    earlier commit's bench has no `measure_one`, and this must run the same way in both trees."""
    from app.engine.engine import Engine, Request, SpecParams

    engine = Engine(loaded.target, drafter, 1, draft_limit=n_max, costs=getattr(drafter, "controller", None))
    req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=loaded.tokenizer.stop_tokens,
                  speculative=SpecParams(enabled=mode != "plain", n_max=n_max))
    for _ in engine.generate(req):
        pass
    r = engine.slots[0].record
    if drafter is not None:
        drafter.release(0)
    return {"tokens": len(r.completion), "seconds": r.t_generate, "decodes": r.target_decodes}


def worker(tree: Path, modes: list[str], turns_file: Path, max_tokens: int, threads: int, preset: str,
           flip: bool) -> dict:
    """In `tree`'s code: each mode replays the turns in order (its suffix index, if any, cleared
    first). {mode: [per turn {tokens, seconds, decodes}]}."""
    loaded = _plan_and_load(tree, preset, threads)
    from app.commands import bench
    from app.engine.controller import Controller

    controller = Controller(bench.calibrate(loaded.target, loaded.draft, bench.ADAPTIVE_N_MAX))
    new = hasattr(bench, "clear_index")  # a tree with the suffix index
    drafters = bench._drafters(loaded, controller)
    ids = json.loads(turns_file.read_text())
    out: dict[str, list] = {}
    try:
        for mode in (reversed(modes) if flip else modes):
            drafter = None if mode == "plain" else drafters[mode]
            if new and drafter is not None:
                bench.clear_index(drafter)
            n_max = bench.ADAPTIVE_N_MAX if mode.startswith("adaptive") else bench.DRAFT_N_MAX
            out[mode] = [_one(loaded, drafter, mode, p, max_tokens, n_max) for p in ids]
    finally:
        loaded.close()
    return out


def _rate(runs: list[dict], pick: list[bool]) -> tuple[float, float]:
    chosen = [r for r, p in zip(runs, pick) if p]
    n = sum(r["tokens"] for r in chosen)
    return n / sum(r["seconds"] for r in chosen), n / sum(r["decodes"] for r in chosen)


def _spawn(tree: Path, modes: list[str], turns_file: Path, args, flip: bool) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), "--modes", ",".join(modes),
               "--turns-file", str(turns_file), "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
               "--preset", args.preset, "--out", f.name] + (["--flip"] if flip else [])
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RunFailed(f"the run in {tree} failed: {last}")
        return json.loads(Path(f.name).read_text())


class RunFailed(Exception):
    """A step that did not work, told in one line."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commit", default=OLD_ADAPTIVE, help="the earlier commit whose adaptive drafter to run")
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--modes", help=argparse.SUPPRESS)
    ap.add_argument("--turns-file", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--flip", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        got = worker(Path(args.worker), args.modes.split(","), Path(args.turns_file), args.max_tokens, args.threads,
                     args.preset, args.flip)
        Path(args.out).write_text(json.dumps(got))
        return 0
    if args.max_tokens < 1 or args.repeats < 1:
        print("vs_commit: --max-tokens and --repeats must be at least 1", file=sys.stderr)
        return 2

    sys.path.insert(0, str(ROOT))
    from app.commands.workloads import agent_turns

    turns = agent_turns()
    cross = [t["cross"] for t in turns]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), args.commit],
                              capture_output=True, text=True)
        if made.returncode != 0:
            print(f"vs_commit: git could not check out {args.commit}: {made.stderr.strip()}", file=sys.stderr)
            return 2
        turns_file = Path(tmp) / "turns.json"
        turns_file.write_text(json.dumps(prompt_ids(turns, args.preset)))
        runs: dict[str, list[dict]] = {}
        try:
            for rep in range(args.repeats):
                jobs = [(old, ["plain", "adaptive"], "old"), (ROOT, ["adaptive", "adaptive-local"], "new")]
                for tree, modes, who in (jobs if rep % 2 == 0 else list(reversed(jobs))):
                    got = _spawn(tree, modes, turns_file, args, flip=rep % 2 == 1)
                    for mode, per_turn in got.items():
                        name = f"{args.commit} adaptive" if (who, mode) == ("old", "adaptive") else mode
                        runs.setdefault(name, []).append(per_turn)
                    print(f"[{rep + 1}/{args.repeats}] {who}: " + ", ".join(
                        f"{m} {_rate(v, cross)[0]:.1f} tok/s cross ({_rate(v, cross)[1]:.2f} per decode)"
                        for m, v in got.items()), file=sys.stderr, flush=True)
        except RunFailed as e:
            print(f"vs_commit: {e}", file=sys.stderr)
            return 1
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    result = summarize(runs, cross, args)
    if args.json:
        print(json.dumps(result))
    else:
        for part in ("cross", "all"):
            print(f"{part} turns: " + "; ".join(f"{m} {v[part]['tok_s']:.1f} tok/s ({v[part]['tokens_per_decode']:.2f} per decode)"
                                               for m, v in result["modes"].items()))
        for key, r in result["ratios"].items():
            print(f"{key}: {r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})")
    return 0


def summarize(runs: dict[str, list[list[dict]]], cross: list[bool], args) -> dict:
    parts = {"cross": cross, "all": [True] * len(cross)}
    modes = {m: {p: {"tok_s": statistics.median(_rate(r, pick)[0] for r in reps),
                     "tokens_per_decode": statistics.median(_rate(r, pick)[1] for r in reps)}
                 for p, pick in parts.items()} for m, reps in runs.items()}
    old = f"{args.commit} adaptive"
    ratios = {}
    for a, b in (("adaptive", old), ("adaptive", "adaptive-local"), ("adaptive-local", old), (old, "plain"),
                 ("adaptive", "plain")):
        for p, pick in parts.items():
            pairs = sorted(_rate(x, pick)[0] / _rate(y, pick)[0] for x, y in zip(runs[a], runs[b]))
            ratios[f"{a} / {b}, {p} turns"] = (statistics.median(pairs), pairs[0], pairs[-1])
    return {"commit": args.commit, "max_tokens": args.max_tokens, "repeats": args.repeats, "threads": args.threads,
            "modes": modes, "ratios": ratios, "runs": runs}


if __name__ == "__main__":
    sys.exit(main())
