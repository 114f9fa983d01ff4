"""Lookup and the draft model behind the controller, which picks each step's drafter and lengths."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from app.engine.controller import Candidate, Choice, Controller
from app.engine.drafters.base import Ask, Draft, DrafterBase
from app.engine.drafters.lookup import LOOKUP_PRIORS, LookupDrafter, lookup_key
from app.engine.drafters.model import ModelDrafter
from app.engine.sampling import SamplingParams


class AdaptiveDrafter(DrafterBase):
    """Prompt lookup first (free), else the draft model; each only with the draft length the
    controller expects to beat plain decoding on this machine (often none)."""

    name = "adaptive"
    LOOKUP_COST = 2e-5  # seconds per proposed token: a dictionary lookup

    def __init__(self, controller: Controller, lookup: LookupDrafter | None, model: ModelDrafter | None) -> None:
        self.controller = controller
        self.lookup = lookup
        self.model = model
        controller.priors.update(LOOKUP_PRIORS)

    def begin_request(self, seq: int) -> None:
        """A new request on this sequence: its own acceptance estimates start again."""
        self.controller.new_request(seq)

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        """One sequence's draft, alone in its verify decode."""
        return self.propose_all([Ask(seq, history, k, sampling, rng)])[0]

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        """Drafts for every sequence of one step, their lengths chosen together (they share one
        verify decode): lookup where it has a match, the draft model where it has none or where
        lookup's draft would not be taken."""
        found = [self.lookup.lookup(a.seq, a.history, a.k) if self.lookup is not None and a.k > 0 else ([], 0)
                 for a in asks]
        cands = [self._candidate(a, tokens, n) for a, (tokens, n) in zip(asks, found)]
        choices = self.controller.plan(cands)
        if self.model is not None:  # where lookup got nothing, would the draft model be taken instead?
            alt = [Candidate(None, "draft-model", a.k, self._model_cost()) if c.key != "draft-model" and ch.k == 0 and a.k > 0
                   else c for a, c, ch in zip(asks, cands, choices)]
            if alt != cands:
                alt_choices = self.controller.plan(alt)
                if max(ch.gain for ch in alt_choices) > max(ch.gain for ch in choices):
                    cands, choices = alt, alt_choices
        choices = self.controller.probe_idle(cands, choices)
        return [self._draft(a, x, ch, tokens, n) for a, x, ch, (tokens, n) in zip(asks, cands, choices, found)]

    def _model_cost(self) -> float:
        return self.controller.costs.draft or self.controller.costs.c_verify(1)

    def _candidate(self, a: Ask, tokens: list[int], n: int) -> Candidate:
        if tokens:
            return Candidate(a.seq, lookup_key(n), len(tokens), self.LOOKUP_COST)
        if self.model is not None:
            return Candidate(None, "draft-model", a.k, self._model_cost())
        return Candidate(a.seq, "none", 0, 0.0)

    def _draft(self, a: Ask, x: Candidate, choice: Choice, tokens: list[int], n: int) -> Draft:
        if choice.k <= 0 or x.key == "none":
            return Draft([], source="none", choice=choice)
        if x.key != "draft-model":
            return Draft(tokens[: choice.k], None, source="lookup", match_len=n, choice=choice)
        t = time.perf_counter()
        d = self.model.propose(a.seq, a.history, choice.k, a.sampling, a.rng)
        if d.tokens and self.controller.learn_costs:
            self.controller.costs.observe_draft((time.perf_counter() - t) / len(d.tokens))
        d.choice = choice
        return d

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        if draft.source == "lookup":
            self.controller.observe(lookup_key(draft.match_len), len(draft.tokens), n_accepted, seq)
        else:
            self.controller.observe(draft.source, len(draft.tokens), n_accepted)

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        if self.model is not None:
            self.model.share_prefix(src, dst, prefix)

    def release(self, seq: int) -> None:
        for d in (self.lookup, self.model):
            if d is not None:
                d.release(seq)
