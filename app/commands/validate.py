"""`specdeck validate`: the go-live checklist (app/ops/validate.py) against a server started here on
a free loopback port, or against `--url`; a progress bar while it runs, then a table or `--json`;
`--save-baseline` records the run, `--compare` judges it against a baseline and exits 1 on a
regression."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.commands.common import config_path, console, out, serve_settings
from app.commands.start_request import StartRequest
from app.errors import SpecdeckError
from app.ops import baseline
from app.ops.client import Client, wait_ready
from app.ops.validate import CHECKS, Check, Options, figures_of, run_checks
from app.settings import paths

STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def _options(args: argparse.Namespace) -> Options:
    for name in ("decode_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SpecdeckError(f"--{name.replace('_', '-')} must be at least 1")
    if args.soak < 0 or args.context_margin < 0:
        raise SpecdeckError("--soak and --context-margin cannot be negative")
    return Options(decode_tokens=args.decode_tokens, repeats=args.repeats, context_margin=args.context_margin,
                   equivalence_tokens=max(16, min(48, args.decode_tokens)),
                   soak_minutes=args.soak)


@contextlib.contextmanager
def _server(args: argparse.Namespace):
    """(URL, API key): the --url given, else the selection served here."""
    if args.url:
        yield args.url, os.environ.get("SPECDECK_API_KEY")
        return
    from app.commands.serve import local_server

    req = StartRequest.of(args, serve_settings(args), config=config_path(args))
    with local_server(req) as url:
        yield url, req.settings.keyring().any_secret()


def _run(client: Client, opts: Options) -> tuple[list[Check], dict]:
    steps = len(CHECKS)
    if not console.is_terminal:
        def line(name, check):
            if check is not None:
                console.print(f"  {name}: [{STYLE[check.status]}]{check.status}[/] {escape(check.summary)}", soft_wrap=True)
        return run_checks(client, opts, line)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("validate", total=steps)

        def on_check(name, check):
            if check is None:
                bar.update(task, description=f"validate: {name}")
            else:
                bar.advance(task)

        def on_soak(share):
            bar.update(task, description=f"validate: soak {share:.0%}")
        return run_checks(client, opts, on_check, on_soak)


def render(checks: list[Check], findings: list[baseline.Finding] | None, title: str) -> Table:
    table = Table(title=title)
    for col in ("check", "result", "figures"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", escape(c.summary))
    if findings:
        table.add_section()
        for f in findings:
            table.add_row(f"vs baseline: {f.figure}", "[red]regression[/]" if f.regression else "[green]within[/]",
                          escape(f.text))
    return table


def _preflight(client: Client, args: argparse.Namespace, named: tuple[Path, dict] | None) -> tuple[dict, dict | None, Path | None]:
    """The server's status (once it is ready) and the baseline to compare with (the file --compare
    named, else the preset's), judged comparable before minutes of checks run."""
    wait_ready(client, Options().ready_timeout)
    status = client.get("/v1/status")
    if args.compare is None:
        return status, None, None
    path, old = named or (p := baseline.default_path(paths().state, status.get("model_id") or "unknown"), baseline.load(p))
    baseline.check_comparable(old, status, path)
    return status, old, path


def cmd_validate(args: argparse.Namespace) -> int:
    opts = _options(args)
    tolerances = baseline.parse_tolerances(args.tolerance)
    named = (Path(args.compare), baseline.load(Path(args.compare))) if args.compare else None  # fails before a server starts
    with _server(args) as (url, key):
        client = Client(url, key)
        try:
            status, old, compared = _preflight(client, args, named)
            checks, facts = _run(client, opts)
        finally:
            client.close()
    status = facts.get("status") or status
    figures = figures_of(checks)
    preset = status.get("model_id") or "unknown"
    findings = baseline.compare(old["figures"], figures, tolerances) if old is not None else None
    failed = [c for c in checks if c.status == "fail"]
    regressions = [f for f in findings or [] if f.regression]
    saved = None
    if args.save_baseline:
        if failed:
            raise SpecdeckError(f"not saving a baseline: {len(failed)} check(s) failed ({', '.join(c.name for c in failed)})")
        saved = baseline.save(baseline.default_path(paths().state, preset),
                              baseline.make_record(status, figures, [c.to_json() for c in checks]))
    if args.json:
        out.print_json(json.dumps({"ok": not failed and not regressions, "url": url if args.url else None, "preset": preset,
                                   "checks": [c.to_json() for c in checks], "figures": figures,
                                   "baseline": str(compared) if compared else None,
                                   "comparison": [f.to_json() for f in findings] if findings is not None else None,
                                   "regressions": [f.figure for f in regressions], "saved_baseline": str(saved) if saved else None}))
    else:
        out.print(render(checks, findings, f"specdeck validate: {preset}" + (f" at {args.url}" if args.url else "")))
        if saved:
            out.print(f"baseline saved: {saved}")
        if findings is not None:
            if regressions:
                out.print(f"[red]{len(regressions)} regression(s) against {compared}:[/] "
                          + "; ".join(escape(f.text) for f in regressions), soft_wrap=True)
            else:
                out.print(f"[green]within tolerance of {compared}[/] ({len(findings)} figures compared)")
        out.print(f"{sum(c.status == 'ok' for c in checks)} ok, {sum(c.status == 'warn' for c in checks)} warning(s), "
                  f"{len(failed)} failed, {sum(c.status == 'skip' for c in checks)} skipped")
    return 1 if failed or regressions else 0
