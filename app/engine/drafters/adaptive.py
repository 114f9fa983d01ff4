"""Lookup and the draft model behind the controller, which picks each step's drafter and lengths."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from app.engine import kv
from app.engine.controller import Candidate, Choice, Controller
from app.engine.drafters.base import Ask, Draft, DrafterBase
from app.engine.drafters.lookup import LOOKUP_PRIORS, LookupDrafter, lookup_key
from app.engine.drafters.model import ModelDrafter
from app.engine.drafters.suffix import SUFFIX_PRIORS, Match, SuffixDrafter, suffix_key
from app.engine.sampling import SamplingParams


class AdaptiveDrafter(DrafterBase):
    """Text found earlier first (free): prompt lookup in the request, or the suffix index over
    recent requests where it matches deeper; else the draft model; each only with the draft length
    the controller expects to beat plain decoding on this machine (often none)."""

    name = "adaptive"
    LOOKUP_COST = 2e-5  # seconds per proposed token: a dictionary lookup

    def __init__(self, controller: Controller, lookup: LookupDrafter | None, model: ModelDrafter | None,
                 suffix: SuffixDrafter | None = None) -> None:
        self.controller = controller
        self.lookup = lookup
        self.model = model
        self.suffix = suffix
        controller.priors.update(LOOKUP_PRIORS)
        controller.priors.update(SUFFIX_PRIORS)
        controller.group = match_group
        # per sequence, the text proposals of its last step that were not drafted: (key, position, tokens)
        self._shadow: dict[int, list[tuple[str, int, list[int]]]] = {}
        # per sequence, the copy its last step followed: (position, the text's continuation there, the
        # match's depth, whether it is a resumed copy)
        self._source: dict[int, tuple[int, list[int], int, bool]] = {}

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        """A new request on this sequence: its own acceptance estimates start again."""
        self.controller.new_request(seq)
        self._shadow.pop(seq, None)
        self._source.pop(seq, None)
        if self.suffix is not None:
            self.suffix.begin_request(seq, partition)

    def finish_request(self, seq: int, history: Sequence[int]) -> None:
        if self.suffix is not None:
            self.suffix.finish_request(seq, history)

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        """One sequence's draft, alone in its verify decode."""
        return self.propose_all([Ask(seq, history, k, sampling, rng)])[0]

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        """Drafts for every sequence of one step, their lengths chosen together (they share one
        verify decode): lookup where it has a match, the draft model where it has none or where
        lookup's draft would not be taken."""
        self._score_shadows(asks)
        resumed = [self._resumed(a) for a in asks]
        both = [self._found(a) for a in asks]
        found = [first for first, _ in both]
        cands = [self._candidate(a, m) for a, m in zip(asks, found)]
        choices = self.controller.plan(cands)
        # where another text matched too, or a copy can resume past the token the target replaced,
        # the one expected to pay more
        for others in ([other for _, other in both], resumed):
            if any(m.tokens for _, m in others):
                alt_found = [o if o[1].tokens else f for f, o in zip(found, others)]
                better = self._better(choices, [self._candidate(a, m) for a, m in zip(asks, alt_found)])
                if better:
                    found, (cands, choices) = alt_found, better
        if self.model is not None:  # where lookup got nothing, would the draft model be taken instead?
            alt = [self._model_candidate(a) if c.key != "draft-model" and ch.k == 0 and a.k > 0
                   else c for a, c, ch in zip(asks, cands, choices)]
            if alt != cands:
                cands, choices = self._better(choices, alt) or (cands, choices)
        choices = self.controller.probe_idle(cands, choices)
        for a, x, ch, chosen, (first, second), resume in zip(asks, cands, choices, found, both, resumed):
            drafted = chosen if ch.k > 0 and x.key not in ("draft-model", "none") else None
            self._shadow[a.seq] = [(text_key(*p), len(a.history), p[1].tokens) for p in (first, second, resume)
                                   if p[1].tokens and p is not drafted]
            # the copy followed from here: the one drafted, else a resumed copy, else the first match
            follow = next((p for p in (drafted, resume, first) if p is not None and p[1].tokens), None)
            if follow is not None:
                self._source[a.seq] = (len(a.history), follow[1].tokens, follow[1].depth, follow[0] in RESUMED)
        return [self._draft(a, x, ch, m) for a, x, ch, m in zip(asks, cands, choices, found)]

    def _score_shadows(self, asks: Sequence[Ask]) -> None:
        """Evidence at no cost: where a text proposal was not drafted last step (none was, or another
        was: the other text, a resumed copy), the tokens the step emitted say whether it would have
        been kept, a trial for its key like a drafted one. Without
        it a key whose estimate fell below paying never drafts again in the request, and never learns
        that the copy it proposes has resumed (a regenerated module after the point where it differs)."""
        for a in asks:
            for key, pos, tokens in self._shadow.pop(a.seq, ()):
                emitted = a.history[pos: pos + len(tokens)]
                if emitted:
                    kept = kv.common_prefix(tokens, emitted)
                    self.controller.observe(key, min(len(tokens), len(emitted)), kept, a.seq)

    def _resumed(self, a: Ask) -> tuple[str, Match]:
        """A copy that broke at the last step, resumed. Where the target kept part of a text's
        continuation and then put a token of its own in place of the text's next (a renamed name,
        another path, `List` for `list`): the text past the token the target's is found at a little
        further on (the text's tokens it left out or that tokenize otherwise here), else past the
        one it replaced. A resumed copy that the target follows goes on from there (the suffix
        index matches it only shallowly, from the change on). Without this a copy resumes only once
        three tokens after the change match again (the suffix index's key), each a plain step.
        Only a copy: a deep match, or one the target followed for RESUME_KEPT tokens first (not a
        short phrase seen once, whose next tokens were chance); a resumed copy that broke at once
        is realigned, never resumed blindly again."""
        source = self._source.pop(a.seq, None)
        none = ("none", Match([]))
        if source is None or a.k <= 0:
            return none
        pos, text, depth, resumed = source
        emitted = a.history[pos:]
        j = kv.common_prefix(text, emitted)
        if j == len(emitted):  # followed throughout: a resumed copy goes on, others match deeply themselves
            rest = list(text[j: j + a.k]) if resumed else []
            return ("resume", Match(rest, depth)) if rest else none
        if j != len(emitted) - 1 or j + 1 >= len(text):  # left more than a token back
            return none
        if not (resumed or depth >= SHALLOW or j >= RESUME_KEPT):
            return none
        mine = emitted[-1]
        found = next((q for q in range(j + 1, min(j + 1 + RESYNC_WINDOW, len(text))) if text[q] == mine), None)
        if found is not None:
            source, start = "resume", found + 1
        elif not resumed or j >= RESUME_KEPT:
            source, start = "skip", j + 1  # the text's token replaced (a guess: its own bucket)
        else:
            return none
        rest = list(text[start: start + a.k])
        return (source, Match(rest, depth)) if rest else none

    def _better(self, choices: list[Choice], alt: list[Candidate]) -> tuple[list[Candidate], list[Choice]] | None:
        """Other candidates for the same step, with their plan, where the controller expects the step
        to go faster with them than with the plan it has."""
        alt_choices = self.controller.plan(alt)
        return (alt, alt_choices) if max(ch.gain for ch in alt_choices) > max(ch.gain for ch in choices) else None

    def _found(self, a: Ask) -> tuple[tuple[str, Match], tuple[str, Match]]:
        """Text that may come next, first and second: the suffix index's continuation where it matched
        deeper than prompt lookup's, else lookup's; the other where both matched and they differ (a
        regenerated module: the prompt holds the old code, an earlier answer the new). The suffix
        index is kept in step with every history, drafting or not."""
        none = ("none", Match([]))
        deep = self.suffix.match(a.seq, a.history, a.k) if self.suffix is not None else Match([])
        if self.lookup is None or a.k <= 0:
            return (("suffix", deep) if deep.tokens else none), none
        tokens, n = self.lookup.lookup(a.seq, a.history, a.k)
        near = ("lookup", Match(tokens, n)) if tokens else none
        far = ("suffix", deep) if deep.tokens else none
        first, second = (far, near) if deep.tokens and (not tokens or deep.depth > n) else (near, far)
        return first, (second if second[1].tokens[:1] != first[1].tokens[:1] else none)

    def _model_cost(self) -> float:
        return self.controller.costs.draft or self.controller.costs.c_verify(1)

    def _model_candidate(self, a: Ask) -> Candidate:
        """The draft model, with what catching up with this sequence's history costs first."""
        setup = self.controller.costs.catch_up(self.model.behind(a.seq, a.history))
        return Candidate(None, "draft-model", a.k, self._model_cost(), setup)

    def _candidate(self, a: Ask, found: tuple[str, Match]) -> Candidate:
        source, m = found
        if m.tokens:
            return Candidate(a.seq, text_key(source, m), len(m.tokens), self.LOOKUP_COST)
        if self.model is not None:
            return self._model_candidate(a)
        return Candidate(a.seq, "none", 0, 0.0)

    def _draft(self, a: Ask, x: Candidate, choice: Choice, found: tuple[str, Match]) -> Draft:
        source, m = found
        if choice.k <= 0 or x.key == "none":
            return Draft([], source="none", choice=choice)
        if x.key != "draft-model":
            return Draft(m.tokens[: choice.k], None, source=source, match_len=m.depth, support=m.count, choice=choice)
        behind = self.model.behind(a.seq, a.history)
        t = time.perf_counter()
        d = self.model.propose(a.seq, a.history, choice.k, a.sampling, a.rng)
        if d.tokens and self.controller.learn_costs:
            self._observe_model(time.perf_counter() - t, len(d.tokens), behind)
        d.choice = choice
        return d

    def _observe_model(self, seconds: float, drafted: int, behind: int) -> None:
        """A draft's time is its tokens' decodes, after a catch-up of `behind` tokens: a step that
        was nearly in step measures the per-token cost, a long catch-up the prefill rate."""
        costs = self.controller.costs
        if behind <= 2:
            costs.observe_draft(seconds / drafted)
        elif behind >= 32:
            costs.observe_prefill(max(seconds - drafted * (costs.draft or 0.0), 0.0) / behind)

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        if draft.source in ("lookup", "suffix", *RESUMED):
            key = text_key(draft.source, Match(draft.tokens, draft.match_len, draft.support))
            self.controller.observe(key, len(draft.tokens), n_accepted, seq)
        else:
            self.controller.observe(draft.source, len(draft.tokens), n_accepted)

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        if self.model is not None:
            self.model.share_prefix(src, dst, prefix)

    def release(self, seq: int) -> None:
        for d in (self.lookup, self.model, self.suffix):
            if d is not None:
                d.release(seq)
        self._shadow.pop(seq, None)
        self._source.pop(seq, None)


def text_key(source: str, m: Match) -> str:
    """The bucket the controller learns a text match's acceptance for (resumed copies have their own)."""
    if source in RESUMED:
        return source
    return suffix_key(m.depth, m.count) if source == "suffix" else lookup_key(m.depth)


SHALLOW = 8  # a match shorter than this (tokens) may be chance: a short phrase, a common shape
RESUME_KEPT = 2  # tokens of a shallow match the target must have followed before its copy is resumed
RESYNC_WINDOW = 4  # a broken copy's text is searched this far on for the token the target put in
RESUMED = ("resume", "skip")  # a copy resumed: realigned (or going on), or past a token taken as replaced


def match_group(key: str) -> str | None:
    """Lookup and suffix matches share their evidence within a request, in two groups: shorter than
    SHALLOW, and deeper. Shallow ones were good on the last request because its answer copied its
    prompt (a code edit), and one that misses on this request (a short tool call whose words the
    prompt merely mentions) says the others will too. Deep ones are a copy in progress: where this
    request's have been kept, a depth bucket new to it is drafted on that evidence. A shallow miss
    says nothing of a long verbatim match. The draft model keeps its own."""
    kind, _, rest = key.partition("-")
    if kind not in ("lookup", "suffix") or not rest:
        return None
    return "shallow" if int(rest.split("-")[0]) < SHALLOW else "deep"
