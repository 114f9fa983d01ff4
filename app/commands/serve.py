"""`specdeck serve`: the pair behind the API, started from the command line."""

from __future__ import annotations

import argparse

from app.commands.check import (
    require_compatible,
)
from app.commands.common import (
    catalog_from_args,
    console,
    local_path,
    make_fetcher,
    make_selection,
    plan_request,
    serve_settings,
)
from app.gguf.info import ModelInfo, read_model_info
from app.models.refs import resolve_ref
from app.plan.hardware import detect
from app.plan.planner import make_plan

# -- models ----------------------------------------------------------------------------------



def embedding_model(args: argparse.Namespace, catalog, fetcher, sel) -> ModelInfo | None:
    """--embedding-model, else the preset's embedding model, else none (the embedding routes then say so)."""
    ref = resolve_ref(args.embedding_model, catalog) if getattr(args, "embedding_model", None) else sel.embedding
    return read_model_info(local_path(fetcher, ref)) if ref is not None else None


def server_logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.serve import serve

    server_logging()
    settings = serve_settings(args, args.api_key_file)
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft and settings.speculative else None
    if draft is not None:
        require_compatible(target, draft)
    embedder = embedding_model(args, catalog, fetcher, sel)
    hw = detect()
    req = plan_request(args, draft_max=settings.draft_max)
    plan = make_plan(target, draft, req, hw, sel.context, embedder)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print(f"serving {sel.name} on http://{settings.host}:{settings.port} (context {plan.ctx:,}, "
                  f"{plan.parallel} slots, speculation {'on' if settings.speculative and draft else 'lookup only' if settings.speculative else 'off'})")
    return serve(settings, plan, target, draft, args.threads or hw.cpu_count, sel.name, embedder)
