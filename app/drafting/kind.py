"""What a drafter kind declares (`DrafterKind`); the planner, the loader and the checks read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.engine.drafters.base import HeadDrafter
from app.gguf.info import ModelInfo
from app.llama.context import Context
from app.llama.params import ModelParams
from app.plan.rows import HeadRows


def no_problem(target: ModelInfo, draft: ModelInfo | None) -> str | None:
    return None


@dataclass(frozen=True)
class DrafterKind:
    """One way of drafting. A kind on the target's own model (`needs == "target head"`) also gives
    the planner its rows and the loader its opener (it is the loader's `HeadKind`)."""

    name: str  # as --draft names it, and as the controller and the metrics label its drafts
    summary: str  # what drafts, in a few words
    needs: Literal["draft model", "target head", "nothing"]
    check: Callable[[ModelInfo, ModelInfo | None], str | None] = no_problem  # why it cannot draft for this pair
    hint: str = ""  # what to do then
    rows: HeadRows | None = None  # a target head's memory rows (app/plan/planner.py adds them up)
    target_layers: bool = False  # the target's model loads the head's layers (an MTP head's nextn blocks)
    opener: Callable[[Context, ModelParams, int], HeadDrafter] | None = None

    def open(self, target: Context, params: ModelParams, threads: int) -> HeadDrafter:
        """Its drafter beside the target's context, in a context of `params` (the plan's `head`)."""
        if self.opener is None:
            raise TypeError(f"the {self.name} drafter is not opened beside the target")
        return self.opener(target, params, threads)
