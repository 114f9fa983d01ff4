"""Fixed continuations as drafts (tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.engine.drafters.base import Draft, DrafterBase
from app.engine.sampling import SamplingParams


class ListDrafter(DrafterBase):
    """Proposes fixed continuations (tests): tokens[len(history):] of the longest list that extends history."""

    name = "list"

    def __init__(self, continuations: list[list[int]], q: np.ndarray | None = None) -> None:
        self.continuations = continuations
        self.q = q

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        for c in self.continuations:
            if list(c[: len(history)]) == list(history):
                toks = list(c[len(history) : len(history) + k])
                return Draft(toks, [self.q] * len(toks) if (sampling is not None and self.q is not None) else None)
        return Draft([])
