"""The `specdeck` command. Every failure the user can cause ends in one clear line and a non-zero exit."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app import __version__
from app.commands.check import (
    check_pair,
    render_models,
    require_compatible,
    result_json,
)
from app.commands.common import (  # noqa: E402
    catalog_from_args,
    console,
    doctor_subject,
    local_path,
    make_fetcher,
    make_selection,
    model_info,
    plan_request,
    pull_one,
    serve_settings,
)
from app.errors import SpecdeckError
from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.plan.planner import PlanRequest, make_plan
from app.plan.view import render_plan
from app.server.settings import ServeSettings
from app.settings import add_flags
from app.units import parse_size

out = Console(highlight=False)










# -- models ----------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    fetcher = make_fetcher(offline=True)
    table = Table(title=f"presets ({catalog.source})")
    for col in ("preset", "target", "draft", "context", "for", "on disk"):
        table.add_column(col)
    for p in catalog.presets.values():
        names = [p.target] + ([p.draft] if p.draft else [])
        have = [fetcher.on_disk(catalog.models[n]) is not None for n in names]
        status = "yes" if all(have) else ("partly" if any(have) else "no")
        table.add_row(p.name, p.target, p.draft or "-", f"{p.context:,}", p.hardware, status)
    out.print(table)
    models = Table(title="models")
    for col in ("model", "source", "size", "sha256", "on disk"):
        models.add_column(col)
    for m in catalog.models.values():
        found = fetcher.on_disk(m)
        src = m.repo or "mirror only"
        if m.mirrors:
            src += f" (+{len(m.mirrors)} mirror)"
        models.add_row(m.name, src, f"{m.size / 2**30:.2f} GiB" if m.size else "?",
                       (m.sha256[:12] + "…") if m.sha256 else "hub LFS", str(found[0]) if found else "-")
    out.print(models)
    return 0


# -- pull ------------------------------------------------------------------------------------



def cmd_pull(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(args.offline, args.verify)
    roles = [("target", sel.target)] + ([("draft", sel.draft)] if sel.draft else [])
    for role, ref in roles:
        got = pull_one(fetcher, ref)
        how = "hashed now" if got.hashed_now else "verified earlier; size, mtime and inode unchanged"
        out.print(f"[green]ok[/] {role} {ref.label} ({got.source}, {how})", soft_wrap=True)
        out.print(f"   sha256 {got.sha256}", soft_wrap=True)
        out.print(f"   {got.path}", soft_wrap=True)
    return 0


# -- check -----------------------------------------------------------------------------------



def cmd_check(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(offline=True, verify=args.verify)
    target = local_path(fetcher, sel.target)
    draft = local_path(fetcher, sel.draft) if sel.draft else None
    result = check_pair(target, draft, probe=not args.no_probe)
    if args.json:
        out.print_json(json.dumps(result_json(result)))
    else:
        out.print(render_models(result))
        for w in result.warnings:
            out.print(f"[yellow]warning:[/] {w}")
        if result.draft is None:
            out.print("[green]target readable[/] (no draft)")
        elif result.compatible:
            out.print("[green]compatible:[/] the draft can serve the target (llama.cpp's rules)")
        else:
            bad = result.incompatibility
            assert bad is not None
            out.print(f"[red]incompatible[/] (rule {bad.rule}): {bad.message}")
    return 0 if result.compatible else 2


# -- plan ------------------------------------------------------------------------------------



def cmd_plan(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(args.offline)
    target = model_info(fetcher, sel.target)
    draft = model_info(fetcher, sel.draft) if sel.draft else None
    req = plan_request(
        args,
        device=args.device,
        vram=parse_size(args.vram) if args.vram else None,
        ram=parse_size(args.ram) if args.ram else None,
        n_ubatch=args.ubatch,
        reserve=parse_size(args.reserve) if args.reserve else None,
        margin=parse_size(args.margin) if args.margin else None,
    )
    plan = make_plan(target, draft, req, detect(), sel.context)
    if args.json:
        out.print_json(json.dumps(plan.to_json()))
    else:
        out.print(render_plan(plan, sel.name))
    return 0


# -- doctor ----------------------------------------------------------------------------------



def cmd_doctor(args: argparse.Namespace) -> int:
    from app.commands.doctor import failed, render_lines, run_all

    try:
        settings = serve_settings(args, args.api_key_file, check=False)
    except SpecdeckError:  # a config file that does not parse has its own check; bad flags still stop here
        settings = serve_settings(args, args.api_key_file, check=False, use_config=False)
    subject = doctor_subject(args, settings, make_fetcher(args.offline), args.api_key_file)
    checks = run_all(subject, detect())
    bad = failed(checks)
    if args.json:
        out.print_json(json.dumps({"ok": not bad, "checks": [c.to_json() for c in checks]}))
    else:
        for line in render_lines(checks):
            out.print(line, soft_wrap=True)
        warn = sum(c.status == "warn" for c in checks)
        out.print(f"{len(checks) - len(bad) - warn} ok, {warn} warning(s), {len(bad)} failed")
    return 1 if bad else 0


# -- verify ----------------------------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from app.commands.equivalence import (
        EquivalenceReport,
        check_equivalence,
        load_prompts,
    )
    from app.engine.loader import load

    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    if sel.draft is None:
        raise SpecdeckError("verify needs a draft model (a preset with one, or --draft)")
    prompts = load_prompts(Path(args.prompts) if args.prompts else None)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft))
    hw = detect()
    req = PlanRequest(ctx=args.ctx, ctx_is_user_choice=True, parallel=1, draft_max=args.draft_max)
    plan = make_plan(target, draft, req, hw, args.ctx)
    loaded = load(plan, target, draft, hw.cpu_count)
    report = EquivalenceReport()
    try:
        for item in prompts:
            r = check_equivalence(loaded.engine, loaded.tokenizer, item, args.max_tokens, plan.draft_max)
            report.results.append(r)
            if not args.json:
                mark = "[green]ok[/]" if r.invariant_violations == 0 and r.explained else "[red]FAIL[/]"
                acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
                out.print(f"{mark} {r.kind}: {r.explanation}; invariant violations {r.invariant_violations}; "
                          f"acceptance {acc}, {r.tokens_per_decode or 0:.2f} tokens/decode; "
                          f"plain {r.plain_tok_s or 0:.1f} tok/s, speculative {r.spec_tok_s or 0:.1f} tok/s", soft_wrap=True)
    finally:
        loaded.close()
    if args.json:
        out.print_json(json.dumps(report.to_json()))
    return 0 if report.ok else 1


# -- bench -----------------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    import contextlib

    from app.commands.bench import AnchorServers, find_llama_server, ratios, run_engine
    from app.commands.equivalence import load_prompts
    from app.engine.loader import load

    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    prompts = load_prompts(Path(args.prompts) if args.prompts else None)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft else None
    hw = detect()
    plan = make_plan(target, draft, PlanRequest(ctx=args.ctx, ctx_is_user_choice=True, parallel=1, draft_max=16), hw, args.ctx)
    threads = args.threads or hw.cpu_count
    log = (lambda *a, **k: console.print(*a, **k)) if args.json else (lambda *a, **k: out.print(*a, **k))
    server = None if args.no_anchors else find_llama_server()
    if server is not None:
        log(f"anchors: {server} (kept up, measured next to each prompt's runs)")
    elif not args.no_anchors:
        log("anchors: no llama-server found (scripts/build_llama_server.sh builds one)")
    servers = (AnchorServers(server, target.path, draft.path if draft else None, threads, plan.ctx) if server
               else contextlib.nullcontext(None))
    with servers as up:
        loaded = load(plan, target, draft, threads)
        try:
            log(f"bench: {sel.name}, {threads} threads, {args.max_tokens} tokens per prompt, {args.repeats} repeats")
            workloads, costs, anchors = run_engine(loaded, prompts, args.max_tokens, args.repeats, log=log, anchors=up)
        finally:
            loaded.close()
    anchor_runs = anchors.pop("runs", {})
    result = {"workloads": workloads, "anchors": anchors, "anchor_runs": anchor_runs,
              "ratios": ratios(workloads, anchor_runs), "costs": costs,
              "threads": threads, "max_tokens": args.max_tokens, "repeats": args.repeats}
    if args.json:
        out.print_json(json.dumps(result))
    else:
        table = Table(title="tokens/s (median of repeats)")
        for col in ("workload", "plain", "draft", "lookup", "adaptive", "adaptive / plain", "server plain", "server draft", "server lookup"):
            table.add_column(col, justify="right")
        for kind, modes in workloads.items():
            cell = lambda m, modes=modes: f"{modes[m]['tok_s']:.1f}" if m in modes and modes[m]["tok_s"] else "-"  # noqa: E731
            anchor = lambda a, kind=kind: f"{anchors[a][kind]:.1f}" if kind in anchors.get(a, {}) else "-"  # noqa: E731
            r = result["ratios"][kind].get("adaptive_vs_plain")
            table.add_row(kind, cell("plain"), cell("draft"), cell("lookup"), cell("adaptive"), f"{r:.2f}" if r else "-",
                          anchor("llama_server_plain"), anchor("llama_server_draft"), anchor("llama_server_lookup"))
        out.print(table)
    return 0


# -- serve -----------------------------------------------------------------------------------



def _server_logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.serve import serve

    _server_logging()
    settings = serve_settings(args, args.api_key_file)
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft and settings.speculative else None
    if draft is not None:
        require_compatible(target, draft)
    hw = detect()
    req = plan_request(args, draft_max=settings.draft_max)
    plan = make_plan(target, draft, req, hw, sel.context)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print(f"serving {sel.name} on http://{settings.host}:{settings.port} (context {plan.ctx:,}, "
                  f"{plan.parallel} slots, speculation {'on' if settings.speculative and draft else 'lookup only' if settings.speculative else 'off'})")
    return serve(settings, plan, target, draft, args.threads or hw.cpu_count, sel.name)


# -- up, dash, run -----------------------------------------------------------------------------

def cmd_up(args: argparse.Namespace) -> int:
    from app.commands.up import up

    _server_logging()
    return up(args, serve_settings(args, args.api_key_file), console, out, key_file=args.api_key_file)


def cmd_run(args: argparse.Namespace) -> int:
    from app.commands.up import run

    return run(args, serve_settings(args), console, out)


def cmd_dash(args: argparse.Namespace) -> int:
    from app.commands.dashboard import api_key_from_env, fetch_snapshot
    from app.commands.up import watch

    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SpecdeckError(f"--url must start with http:// or https:// (got {url})")
    key = api_key_from_env()
    fetch_snapshot(url, key)  # a wrong key is one clear line before the screen opens
    if args.once:
        from app.commands.dashboard import log_line, render

        snap = fetch_snapshot(url, key)
        out.print(render(snap) if out.is_terminal or not args.log else log_line(snap))
        return 0
    try:
        watch(lambda: fetch_snapshot(url, key), out, args.interval, args.log_interval)
    except KeyboardInterrupt:
        pass
    return 0


# -- wiring ----------------------------------------------------------------------------------

def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="preset, catalogue model, or hf://owner/repo/file.gguf[@rev] (default: the preset for this machine)")
    p.add_argument("--target", help="target model: catalogue name, hf:// URI or GGUF path")
    p.add_argument("--draft", help="draft model: catalogue name, hf:// URI or GGUF path")


def _add_plan_overrides(p: argparse.ArgumentParser, draft_max: bool = True) -> None:
    """The planner's inputs a user may fix (PlanRequest's fields; shared by plan, serve, up, run)."""
    add_flags(p, PlanRequest, PlanRequest.FLAGS)
    p.add_argument("--cache-type", dest="cache_type", help="K and V cache type (f16, q8_0, q4_0, ...)")
    if draft_max:
        add_flags(p, PlanRequest, ("draft_max",))


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    """What serve, up and doctor share: ServeSettings' flags, the key file, the config, the planner's inputs."""
    add_flags(p, ServeSettings, ServeSettings.FLAGS)
    p.add_argument("--api-key-file", help="file holding the API key (or set SPECDECK_API_KEY)")
    p.add_argument("--config", help="TOML config file (default: ~/.config/specdeck/config.toml if present)")
    _add_plan_overrides(p, draft_max=False)  # --draft-max is ServeSettings' (config and SPECDECK_DRAFT_MAX apply)
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")




class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise SpecdeckError(message, hint=f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdeck", description="A 27B GGUF target + small draft, speculative decoding, one 24 GB GPU.")
    parser.add_argument("--version", action="version", version=f"specdeck {__version__}")
    parser.add_argument("--models", metavar="FILE", help="model catalogue (default: $SPECDECK_MODELS_FILE or the bundled models.toml)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("models", help="list presets and models, and what is on disk")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("pull", help="download and verify a preset's models (or one model)")
    _add_selection(p)
    p.add_argument("--verify", action="store_true", help="re-hash every file even if it was verified before")
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("check", help="read both GGUF headers and decide whether the draft can serve the target")
    _add_selection(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--no-probe", action="store_true", help="do not confirm implicit vocabulary settings with llama.cpp")
    p.add_argument("--verify", action="store_true", help="re-hash catalogue files before checking")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="size context, KV cache types, offload and slots to fit the memory budget")
    _add_selection(p)
    p.add_argument("--vram", help="the GPU's total memory, e.g. 24GiB (default: free memory read with pynvml)")
    p.add_argument("--ram", help="host memory budget (default: available memory)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="plan for the GPU or for host RAM")
    _add_plan_overrides(p)
    p.add_argument("--ubatch", type=int, help="physical batch size (n_ubatch)")
    p.add_argument("--reserve", help="runtime reserve (CUDA context, driver, display), e.g. 768MiB")
    p.add_argument("--margin", help="safety margin, e.g. 512MiB")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--offline", action="store_true", help="plan only from files on disk (never read a header from the hub)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("doctor", help="the pre-deployment checklist: build, GPU, memory, disk, models, plan, port, key")
    _add_selection(p)
    _add_serve_flags(p)
    p.add_argument("--offline", action="store_true", help="never read a model header from the hub")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("verify", help="run prompts with speculation on and off and check every step")
    _add_selection(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help='lines of {"messages": [...]} or {"prompt": "..."}, optional "kind"')
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    p.add_argument("--draft-max", type=int, default=8, help="most tokens drafted per step (default 8)")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("bench", help="tokens/s plain, with the draft, with lookup and adaptive, next to llama-server")
    _add_selection(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help="your own prompts (as for verify)")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per prompt (default 200)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each workload and mode (default 2)")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--threads", type=int, help="threads (default: physical cores)")
    p.add_argument("--no-anchors", action="store_true", help="skip llama-server")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="serve the pair behind an OpenAI-compatible API")
    _add_selection(p)
    _add_serve_flags(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="pull, verify, check, plan, load, warm up and serve, with a live dashboard")
    _add_selection(p)
    _add_serve_flags(p)
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.add_argument("--verify", action="store_true", help="re-hash every model file even if it was verified before")
    p.add_argument("--interval", type=float, default=1.0, help="dashboard refresh, seconds (default 1)")
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between status lines when stdout is not a terminal")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("dash", help="the live dashboard of a running server (from its /v1/status and /metrics)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000); API key from SPECDECK_API_KEY")
    p.add_argument("--interval", type=float, default=1.0, help="refresh, seconds (default 1)")
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between status lines when stdout is not a terminal")
    p.add_argument("--once", action="store_true", help="draw once and exit")
    p.add_argument("--log", action="store_true", help="with --once and no terminal: one log line instead of the panel")
    p.set_defaults(func=cmd_dash)

    p = sub.add_parser("run", help="chat with the pair in the terminal (streamed, with tokens/s and acceptance)")
    _add_selection(p)
    _add_plan_overrides(p)
    p.add_argument("--config", help="TOML config file (default: ~/.config/specdeck/config.toml if present)")
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--max-tokens", type=int, default=1024, help="most tokens per answer (default 1024)")
    add_flags(p, ServeSettings, ("speculative",))
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.add_argument("--verify", action="store_true", help="re-hash every model file even if it was verified before")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SpecdeckError as e:
        console.print(f"[red]error:[/] {escape(e.message)}", soft_wrap=True)  # a message may hold [brackets]
        if e.hint:
            console.print(f"  {escape(e.hint)}", soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback for the user unless asked
        if os.environ.get("SPECDECK_DEBUG") == "1":
            raise
        console.print(f"[red]internal error:[/] {type(e).__name__}: {e} (SPECDECK_DEBUG=1 shows the traceback)", soft_wrap=True)
        return 70


if __name__ == "__main__":
    sys.exit(main())
