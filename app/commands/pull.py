"""`specdeck models` and `specdeck pull`: the catalogue and what is on disk, download and verify."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from rich.table import Table

from app.commands.common import (
    catalog_from_args,
    make_fetcher,
    make_selection,
    out,  # noqa: E402
    pull_one,
    roles_of,
)
from app.commands.start_request import Chosen
from app.models.catalog import MTP
from app.models.integrity import VerifiedRecords
from app.settings import paths


def prune_candidates(catalog, fetcher, keep: set[Path]) -> list[Path]:
    """Model files specdeck fetched (its store, and the catalogue's files in the hub cache) that no
    good revision and not the serving one uses."""
    found: set[Path] = set()
    if fetcher.paths.store.is_dir():
        found |= set(fetcher.paths.store.glob("*/*.gguf"))
    for spec in catalog.models.values():
        hit = fetcher.on_disk(spec)
        if hit is not None:
            found.add(hit[0])
    return sorted(p for p in found if p not in keep and p.resolve() not in keep)


def remove_model_file(path: Path, records: VerifiedRecords) -> int:
    """Remove one model file; in the hub cache, the snapshot link and its blob unless another
    snapshot still links to it (huggingface_hub deletes whole revisions only). Returns bytes freed."""
    real = path.resolve()
    size = real.stat().st_size if real.exists() else 0
    records.forget(path)
    if path.is_symlink():
        path.unlink()
        snapshots = next((p for p in path.parents if p.name == "snapshots"), None)
        others = [q for q in snapshots.rglob("*") if q.is_symlink() and q.resolve() == real] if snapshots else []
        if not others and real.exists():
            real.unlink()
        else:
            size = 0
    else:
        path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the store's per-digest folder, once empty
    return size


def prune(args: argparse.Namespace, catalog, fetcher) -> int:
    from app.ops.revisions import RevisionStore

    st = RevisionStore(paths().state)
    keep = st.protected_paths()
    doomed = prune_candidates(catalog, fetcher, keep)
    kept = sorted({p for p in keep if p.exists() and not p.is_symlink()})
    for p in kept:
        out.print(f"[green]keep[/]   {p} (used by a good revision)", soft_wrap=True)
    if not doomed:
        out.print("nothing to prune: every model file on disk is used by a good revision")
        return 0
    freed = 0
    for p in doomed:
        if args.dry_run:
            out.print(f"[yellow]would remove[/] {p}", soft_wrap=True)
            continue
        freed += remove_model_file(p, fetcher.records)
        out.print(f"[red]removed[/] {p}", soft_wrap=True)
    out.print(f"{len(doomed)} file(s) {'would be removed' if args.dry_run else f'removed, {freed / 2**30:.2f} GiB freed'}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    fetcher = make_fetcher(offline=True)
    if getattr(args, "prune", False):
        return prune(args, catalog, fetcher)
    table = Table(title=f"presets ({catalog.source})")
    for col in ("preset", "target", "draft", "context", "for", "on disk"):
        table.add_column(col)
    for p in catalog.presets.values():
        names = [p.target] + ([p.draft] if p.draft and p.draft != MTP else [])
        have = [fetcher.on_disk(catalog.models[n]) is not None for n in names]
        status = "yes" if all(have) else ("partly" if any(have) else "no")
        draft = "the target's MTP head" if p.draft == MTP else p.draft or "-"
        table.add_row(p.name, p.target, draft, f"{p.context:,}", p.hardware, status)
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
    for role, ref in roles_of(sel, Chosen.of(args), True, catalog):
        got = pull_one(fetcher, ref)
        how = "hashed now" if got.hashed_now else "verified earlier; size, mtime and inode unchanged"
        out.print(f"[green]ok[/] {role} {ref.label} ({got.source}, {how})", soft_wrap=True)
        out.print(f"   sha256 {got.sha256}", soft_wrap=True)
        out.print(f"   {got.path}", soft_wrap=True)
    return 0
