"""A small model of the target's family drafts (a preset's draft, `--draft FILE`): llama.cpp's
`draft-simple`. The planner plans it as a model of its own; the loader opens its context."""

from __future__ import annotations

from app.drafting.kind import DrafterKind
from app.gguf.info import ModelInfo
from app.gguf.pairing import first_incompatibility, resolve_vocab


def incompatible(target: ModelInfo, draft: ModelInfo | None) -> str | None:
    """llama.cpp's rules for a draft to serve a target, on the headers (the first that fails)."""
    if draft is None:
        return "no draft model"
    bad = first_incompatibility(resolve_vocab(target, None), resolve_vocab(draft, None))
    return None if bad is None else f"the draft cannot serve the target (rule {bad.rule}): {bad.message}"


KIND = DrafterKind("draft", "a small model of the same family", "draft model", check=incompatible,
                   hint="pick a draft of the same family (--draft); `specdeck check` shows both vocabularies")
