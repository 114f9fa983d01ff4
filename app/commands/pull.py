"""`specdeck models` and `specdeck pull`: the catalogue and what is on disk, download and verify."""

from __future__ import annotations

import argparse

from rich.table import Table

from app.commands.common import (
    catalog_from_args,
    make_fetcher,
    make_selection,
    out,  # noqa: E402
    pull_one,
)


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
