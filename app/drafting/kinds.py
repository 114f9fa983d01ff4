"""Every drafter kind by name, and the one a selection drafts with beside the text drafters."""

from __future__ import annotations

from app.drafting import draft_model, mtp, text
from app.drafting.kind import DrafterKind

KINDS: dict[str, DrafterKind] = {k.name: k for k in (draft_model.KIND, mtp.KIND, text.LOOKUP, text.SUFFIX)}


def head_of(sel, speculative: bool = True) -> DrafterKind | None:
    """The kind on the target's own model a selection drafts with (`--draft mtp`), if any, and only
    while speculating (the planner then plans its rows, the loader opens it)."""
    return KINDS["mtp"] if getattr(sel, "mtp", False) and speculative else None


def rows_of(sel, speculative: bool = True):
    """The planner's rows of the selection's head kind (None: it has none)."""
    head = head_of(sel, speculative)
    return head.rows if head is not None else None
