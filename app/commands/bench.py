"""`specdeck bench`: tokens/s with speculation off, with the draft model, with prompt lookup, with
the suffix index and with the adaptive choice, on the same prompts, side by side in one run; and,
where a llama-server built from the same llama.cpp sources is present, the same prompts through it
as anchors.

`--workload builtin` (the default) runs each prompt on its own: the suffix index is cleared before
every run, so no run drafts from an earlier run of the very prompt it measures. `--workload agent`
replays the agent workload (app/commands/workloads.py) turn by turn in session order, each mode
from an empty index that the workload's own turns then fill, as in real use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from app.commands.anchors import (
    AGENT_ANCHORS,
    ANCHORS,
    CARD_ANCHORS,
    MTP_ANCHORS,
    AnchorServers,
    find_llama_server,
)
from app.commands.benchruns import (
    ADAPTIVE_N_MAX,
    AGENT_MAX_TOKENS,
    AGENT_MODES,
    CARD_MODES,
    MAX_TOKENS,
    MODES,
    answers_unlike_plain,
    run_agent,
    run_engine,
)
from app.commands.common import (
    catalog_from_args,
    chat_template,
    console,
    local_path,
    make_fetcher,
    make_selection,
    out,
    plan_request_of,
    projector,
    template_file,
    threads,
)
from app.commands.ratios import agent_ratios, ratios, workload_per_decode
from app.commands.standin import f32_standin
from app.commands.workloads import agent_turns
from app.errors import SpecdeckError
from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.drafting.kinds import head_of, rows_of
from app.plan.planner import make_plan


def cmd_bench(args: argparse.Namespace) -> int:
    import contextlib

    from app.commands.equivalence import load_prompts
    from app.engine.loader import load

    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    agent = getattr(args, "workload", "builtin") == "agent"
    if agent and args.prompts:
        raise SpecdeckError("--prompts and --workload agent do not go together", hint="the agent workload is built in")
    prompts = agent_turns() if agent else load_prompts(Path(args.prompts) if args.prompts else None)
    max_tokens = args.max_tokens if args.max_tokens is not None else AGENT_MAX_TOKENS if agent else MAX_TOKENS
    if max_tokens < 1:
        raise SpecdeckError(f"--max-tokens must be at least 1, not {max_tokens}")
    template = chat_template(template_file(args), sel)  # read (and a bad one refused) before anything starts
    fetcher = make_fetcher(offline=True)
    hw = detect()
    target_path = local_path(fetcher, sel.target)
    if getattr(args, "f32_target", False):
        target_path = f32_standin(target_path, fetcher.paths.store, fetcher.records, threads(args.threads, hw), say=console.print)
    target = read_model_info(target_path)
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft else None
    vision = projector(fetcher, sel, target, need=True)
    plan = make_plan(target, draft, plan_request_of(ctx=args.ctx, ctx_is_user_choice=True, parallel=1, draft_max=16), hw, args.ctx,
                     head=rows_of(sel), projector=vision)
    # the adaptive modes verify up to ADAPTIVE_N_MAX drafted tokens: the target's logits rows for them
    plan.target = plan.target.with_rows(ADAPTIVE_N_MAX + 1)
    n_threads = threads(args.threads, hw)
    log = (lambda *a, **k: console.print(*a, **k)) if args.json else (lambda *a, **k: out.print(*a, **k))
    server = None if args.no_anchors else find_llama_server()
    if server is not None:
        log(f"anchors: {server} (kept up, measured next to each prompt's runs; flash attention "
            f"{'on' if plan.target.flash_attn else 'off'}, as specdeck's plan)")
    elif not args.no_anchors:
        log("anchors: no llama-server found (scripts/build_llama_server.sh builds one)")
    servers = (AnchorServers(server, target.path, draft.path if draft else None, n_threads, plan.ctx,
                             AGENT_ANCHORS if agent else CARD_ANCHORS if getattr(args, "f32_target", False)
                             else MTP_ANCHORS if sel.mtp else ANCHORS,
                             plan.target.flash_attn)
               if server else contextlib.nullcontext(None))
    with servers as up:
        loaded = load(plan, target, draft, n_threads, chat_template=template, mmproj=vision.path if vision else None,
                      head=head_of(sel))
        try:
            log(f"bench: {sel.name}, {n_threads} threads, {max_tokens} tokens per prompt, {args.repeats} repeats"
                + (f", the agent workload ({len(prompts)} turns, two sessions interleaved; every mode starts from an "
                   "empty suffix index that the turns fill in order)" if agent else
                   "; the suffix index is cleared before every run"))
            if agent:
                workloads, costs, per_decode, totals = run_agent(loaded, prompts, max_tokens, args.repeats, log=log,
                                                                 anchors=up)
            else:
                modes = CARD_MODES if getattr(args, "f32_target", False) else MODES
                workloads, costs, anchors = run_engine(loaded, prompts, max_tokens, args.repeats, modes=modes, log=log,
                                                       anchors=up)
        finally:
            loaded.close()
    if agent:
        result = {"workload": "agent", "turns": [{k: t[k] for k in ("session", "turn", "kind", "cross")} for t in prompts],
                  "workloads": workloads, "totals": totals, "ratios": agent_ratios(totals),
                  "tokens_per_decode": workload_per_decode(per_decode),
                  "answers_unlike_plain": answers_unlike_plain(workloads), "costs": costs,
                  "threads": n_threads, "max_tokens": max_tokens, "repeats": args.repeats}
        out.print_json(json.dumps(result)) if args.json else print_agent(result)
        return 0
    anchor_runs = anchors.pop("runs", {})
    anchor_tpd = anchors.pop("tokens_per_decode", {})
    result = {"workloads": workloads, "anchors": anchors, "anchor_runs": anchor_runs, "anchor_tokens_per_decode": anchor_tpd,
              "ratios": ratios(workloads, anchor_runs), "answers_unlike_plain": answers_unlike_plain(workloads),
              "costs": costs,
              "threads": n_threads, "max_tokens": max_tokens, "repeats": args.repeats}
    if args.json:
        out.print_json(json.dumps(result))
    else:
        print_builtin(result)
        print_answers(result["answers_unlike_plain"])
    return 0


BUILTIN_MODES = ("plain", "draft", "lookup", "suffix", "adaptive")
RATIO_LINES = (("adaptive_vs_plain", None), ("draft_vs_plain", None),
               ("adaptive_vs_best_single_mode", "best_single_mode"),
               ("adaptive_vs_best_llama_server_draft", "best_llama_server_draft"),
               ("adaptive_vs_best_llama_server_ngram", "best_llama_server_ngram"))


def print_builtin(result: dict) -> None:
    """Per prompt kind: tokens/s and tokens per target decode of every mode and anchor, then the
    goals' ratios (paired by repeat: median, min, max)."""
    workloads, anchors = result["workloads"], result["anchors"]
    modes = [m for m in BUILTIN_MODES if any(m in w for w in workloads.values())]
    table = Table(title="tokens/s, median of repeats (tokens per target decode)")
    table.add_column("workload")
    for name in (*modes, *anchors):
        table.add_column(name.replace("llama_server_", "server "), justify="right")
    for kind, by_mode in workloads.items():
        row = [kind]
        for m in modes:
            got = by_mode.get(m) or {}
            tpd = got.get("tokens_per_decode")
            row.append(f"{got['tok_s']:.1f}" + (f" ({tpd:.2f})" if tpd else "") if got.get("tok_s") else "-")
        tpd = result.get("anchor_tokens_per_decode", {})
        row += [f"{anchors[a][kind]:.1f}" + (f" ({tpd[a][kind]:.2f})" if kind in tpd.get(a, {}) else "")
                if kind in anchors.get(a, {}) else "-" for a in anchors]
        table.add_row(*row)
    out.print(table)
    for kind, r in result["ratios"].items():
        parts = [f"{key.replace('_vs_', ' / ').replace('_', ' ')}"
                 + (f" [{r[which].replace('llama_server_', 'server ')}]" if which else "")
                 + f" {r[key]:.2f} ({r[key + '_min']:.2f}-{r[key + '_max']:.2f})"
                 for key, which in RATIO_LINES if key in r]
        if parts:
            out.print(f"{kind}: " + "; ".join(parts), soft_wrap=True, markup=False)


def print_answers(unlike: list[dict]) -> None:
    """Say whether every mode answered as plain decoding did, turn by turn and repeat by repeat."""
    if not unlike:
        out.print("answers: every mode gave plain decoding's answer in every run")
    for u in unlike:
        out.print(f"answers: {u['kind']} {u['mode']}: {u['differ']} of {u['runs']} runs differ from plain decoding's "
                  "(their tokens per decode are of another answer; `specdeck verify` shows whether it parts at a near-tie)")


def print_agent(result: dict) -> None:
    """Per turn kind: tokens/s and tokens per target decode for every mode; then the workload's totals."""
    modes = [m for m in (*AGENT_MODES, *AGENT_ANCHORS) if m in result["totals"]]
    table = Table(title="agent workload: tokens/s, median of repeats (tokens per target decode)")
    table.add_column("turn kind")
    for m in modes:
        table.add_column(m.replace("llama_server_", "server "), justify="right")
    for kind, by_mode in result["workloads"].items():
        cross = any(t["cross"] for t in result["turns"] if t["kind"] == kind)
        row = [kind + (" (cross)" if cross else "")]
        for m in modes:
            s = by_mode.get(m)
            row.append(f"{s['tok_s']:.1f} ({s['tokens_per_decode']:.2f})" if s and s["tok_s"] and s["tokens_per_decode"]
                       else f"{s['tok_s']:.1f}" if s and s["tok_s"] else "-")
        table.add_row(*row)
    r = result["ratios"]
    per_decode = result.get("tokens_per_decode", {})
    for part in ("cross", "all"):
        table.add_row(f"workload: {'cross-request turns' if part == 'cross' else 'all turns'}",
                      *[f"{r['tok_s'][m][part]:.1f}" + (f" ({per_decode[m][part]:.2f})" if m in per_decode else "")
                        for m in modes])
    out.print(table)
    for key in ("adaptive_vs_plain_cross", "adaptive_vs_adaptive_local_cross", "adaptive_vs_plain_all",
                "adaptive_vs_best_ngram_all"):
        if key in r:
            out.print(f"{key}: {r[key]:.2f} (min {r[key + '_min']:.2f}, max {r[key + '_max']:.2f})"
                      + (f" [{r['best_ngram_anchor']}]" if key.endswith("ngram_all") else ""))
    print_answers(result["answers_unlike_plain"])
