"""The plan as a rich table: each term, its size and its share of the budget."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from app.plan.planner import Plan
from app.units import fmt_gib


def render_plan(plan: Plan, title: str) -> Group:
    where = "GPU" if plan.device == "cuda" else "host RAM"
    table = Table(title=f"{title}: memory plan ({where}, budget {fmt_gib(plan.budget)} from {plan.budget_source})")
    table.add_column("term")
    table.add_column("size", justify="right")
    table.add_column("share", justify="right")
    table.add_column("")
    for t in plan.terms:
        if t.where != "device":
            continue
        table.add_row(t.name, fmt_gib(t.bytes), f"{t.bytes / plan.budget:.1%}", t.note)
    table.add_section()
    table.add_row("total", fmt_gib(plan.used), f"{plan.used / plan.budget:.1%}", "")
    table.add_row("headroom", fmt_gib(plan.headroom), f"{plan.headroom / plan.budget:.1%}", "")
    parts: list = [table]
    host = [t for t in plan.terms if t.where == "host"]
    if host:
        h = Table(title=f"host memory ({fmt_gib(plan.host_available)} available)")
        h.add_column("term")
        h.add_column("size", justify="right")
        h.add_column("")
        for t in host:
            h.add_row(t.name, fmt_gib(t.bytes), t.note)
        h.add_row("total", fmt_gib(plan.host_used), "")
        parts.append(h)
    p = Table(title="llama.cpp parameters")
    p.add_column("")
    columns = [("target", plan.target), ("draft", plan.draft), (plan.head_label, plan.head)]
    for name, params in columns:
        if params:
            p.add_column(name)
    for key in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "kv_unified", "type_k", "type_v", "flash_attn",
                "swa_full", "n_rs_seq", "n_gpu_layers", "n_outputs_max"):
        p.add_row(key, *[str(getattr(params, key)) for _, params in columns if params])
    parts.append(p)
    summary = (f"context {plan.ctx:,} tokens (wanted {plan.ctx_wanted:,}), {plan.parallel} slot(s) sharing one "
               f"KV pool, up to {plan.draft_max} drafted tokens per step"
               + (f" (the target's {plan.head_label} drafts)" if plan.head else ""))
    parts.append(Text(summary))
    if plan.vision is not None:
        v = plan.vision
        parts.append(Text(f"images: {v.tokens_per_image:,} tokens each at {v.image_size}x{v.image_size}; "
                          f"{v.images_per_request:,} such images fill the context; the largest image it holds: "
                          f"{v.largest_image}x{v.largest_image}"))
    for w in plan.warnings:
        parts.append(Text.from_markup(f"[yellow]warning:[/] {w}"))
    return Group(*parts)
