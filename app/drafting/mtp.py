"""The target's own MTP (nextn) head drafts (`--draft mtp`; the qwen3.6-27b-mtp preset): llama.cpp's
`draft-mtp`. Its drafter is app/engine/drafters/mtp.py; its rows app/plan/rows.py's `mtp_terms`."""

from __future__ import annotations

from app.drafting.kind import DrafterKind
from app.engine.drafters.mtp import MtpDrafter
from app.gguf.info import ModelInfo
from app.llama.context import Context
from app.llama.params import ModelParams
from app.plan.rows import HeadRows, mtp_shape, mtp_terms

DRAFT_MAX = 3  # an MTP head is trained one step ahead: llama.cpp's draft-mtp n_max until real weights say more
HINT = "use a file with them (Qwen3.6-27B's: the qwen3.6-27b-mtp preset), or give a draft model"


def missing(target: ModelInfo) -> str | None:
    """Why the target cannot draft with an MTP head (None: it has nextn layers)."""
    return None if target.n_nextn else f"--draft mtp: {target.path.name} has no MTP (nextn) layers to draft with"


def open_head(target: Context, params: ModelParams, threads: int) -> MtpDrafter:
    """The head's context, made from the target's model, and the drafter over both."""
    head = Context(target.model, params, threads, mtp_of=target)
    try:
        return MtpDrafter(target, head)
    except BaseException:
        head.close()
        raise


KIND = DrafterKind("mtp", "the target's own MTP head", "target head", check=lambda target, draft: missing(target),
                   hint=HINT, rows=HeadRows("mtp", "MTP head", DRAFT_MAX, mtp_terms, mtp_shape, missing, HINT),
                   target_layers=True, opener=open_head)
