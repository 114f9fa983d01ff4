"""Lookup and the draft model behind the controller, which picks each step's drafter and lengths."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.engine import kv
from app.engine.controller import Candidate, Choice, Controller, CostModel
from app.engine.drafters.base import Ask, Draft, DrafterBase, Why
from app.engine.drafters.lookup import LOOKUP_PRIORS, LookupDrafter, lookup_key
from app.engine.drafters.model import ModelDrafter
from app.engine.drafters.base import HeadDrafter
from app.engine.drafters.resume import Resume, resume_key
from app.engine.drafters.suffix import SUFFIX_PRIORS, Match, SuffixDrafter, suffix_key
from app.engine.drafters.worth import DraftWorth
from app.engine.sampling import SamplingParams


class AdaptiveDrafter(DrafterBase):
    """Text found earlier first (free): prompt lookup in the request, or the suffix index over
    recent requests where it matches deeper, or, right after the answer parted from such a text, that
    text picked up again (`Resume`); else the draft model; each only with the draft length the
    controller expects to beat plain decoding on this machine (often none). The model drafter is a
    draft model or the target's MTP head; the controller learns it under its name."""

    name = "adaptive"
    LOOKUP_COST = 2e-5  # seconds per proposed token: a dictionary lookup

    def __init__(self, controller: Controller, lookup: LookupDrafter | None, model: ModelDrafter | HeadDrafter | None,
                 suffix: SuffixDrafter | None = None) -> None:
        """`controller`: one made by `adaptive_controller` (it knows this drafter's keys and groups)."""
        self.controller = controller
        self.lookup = lookup
        self.model = model
        self.suffix = suffix
        # per sequence, the text proposal of its last step that was not drafted: (key, position, tokens)
        self._shadow: dict[int, tuple[str, int, list[int]]] = {}
        # per sequence, its last text draft's whole proposal and where it started: where the target
        # parts from it, `resume` keeps what came after the token not kept
        self._proposed: dict[int, tuple[int, list[int]]] = {}
        self._model_keys: dict[int, str] = {}  # per sequence, the controller key its model draft was priced under
        self.resume = Resume()

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        """A new request on this sequence: its own acceptance estimates start again."""
        self.controller.new_request(seq)
        self._forget(seq)
        if self.suffix is not None:
            self.suffix.begin_request(seq, partition)
        if self.model is not None:
            self.model.begin_request(seq, partition)

    def finish_request(self, seq: int, history: Sequence[int]) -> None:
        if self.suffix is not None:
            self.suffix.finish_request(seq, history)

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        """One sequence's draft, alone in its verify decode."""
        return self.propose_all([Ask(seq, history, k, sampling, rng)])[0]

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        """Drafts for every sequence of one step, their lengths chosen together (they share one
        verify decode): the text match, or the model drafter where the controller expects that to
        pay more (where there is no match, where the match would not be taken, or where the model's
        drafts are kept so often that its longer drafts beat a shallow match's). A copy in progress
        (a deep match, a copy picked up again) is drafted as it is: the model's estimate prices k
        tokens, but its drafts end where it is unsure, and a copy's are free."""
        self._score_shadows(asks)
        both = [self._found(a) for a in asks]
        found = [first for first, _ in both]
        cands = [self._candidate(a, m) for a, m in zip(asks, found)]
        choices = self.controller.plan(cands)
        if any(other[1].tokens for _, other in both):  # where both texts matched, the one expected to pay more
            alt_found = [other if other[1].tokens else first for first, other in both]
            better = self._better(choices, [self._candidate(a, m) for a, m in zip(asks, alt_found)])
            if better:
                found, (cands, choices) = alt_found, better
        if self.model is not None:  # sequence by sequence: would the model drafter pay more than the text?
            for i, a in enumerate(asks):
                if self._is_model(cands[i].key) or a.k <= 0 or _copying(found[i], choices[i]):
                    continue
                alt = [*cands[:i], self._model_candidate(a), *cands[i + 1:]]
                cands, choices = self._better(choices, alt) or (cands, choices)
        choices = self.controller.probe_idle(cands, choices)
        drafts = [self._draft(a, x, ch, m) for a, x, ch, m in zip(asks, cands, choices, found)]
        pending = [(i, d) for i, d in enumerate(drafts) if isinstance(d, _ModelAsk)]
        for (i, _), d in zip(pending, self._model_drafts([d for _, d in pending])):
            drafts[i] = d
        return drafts

    def _score_shadows(self, asks: Sequence[Ask]) -> None:
        """Evidence at no cost: where a text proposal was not drafted last step, the tokens the step
        emitted say whether it would have been kept, a trial for its key like a drafted one. Without
        it a key whose estimate fell below paying never drafts again in the request, and never learns
        that the copy it proposes has resumed (a regenerated module after the point where it differs)."""
        for a in asks:
            shadow = self._shadow.pop(a.seq, None)
            if shadow is None:
                continue
            key, pos, tokens = shadow
            emitted = a.history[pos: pos + len(tokens)]
            if emitted:
                kept = kv.common_prefix(tokens, emitted)
                self.controller.observe(key, min(len(tokens), len(emitted)), kept, a.seq)

    def _better(self, choices: list[Choice], alt: list[Candidate]) -> tuple[list[Candidate], list[Choice]] | None:
        """Other candidates for the same step, with their plan, where the controller expects the step
        to go faster with them than with the plan it has."""
        alt_choices = self.controller.plan(alt)
        return (alt, alt_choices) if max(ch.gain for ch in alt_choices) > max(ch.gain for ch in choices) else None

    def _found(self, a: Ask) -> tuple[tuple[str, Match], tuple[str, Match]]:
        """Text that may come next, first and second: the suffix index's continuation where it matched
        deeper than prompt lookup's, else lookup's; the other where both matched and they differ (a
        regenerated module: the prompt holds the old code, an earlier answer the new). A copy the
        answer just parted from, picked up again, comes before a shallow match, or where one of them
        found nothing. The suffix index is kept in step with every history, drafting or not."""
        none = ("none", Match([]))
        deep = self.suffix.match(a.seq, a.history, a.k) if self.suffix is not None else Match([])
        tokens, n = self.lookup.lookup(a.seq, a.history, a.k) if self.lookup is not None else ([], 0)
        near = ("lookup", Match(tokens, n)) if tokens else none
        far = ("suffix", deep) if deep.tokens else none
        first, second = (far, near) if deep.tokens and (not tokens or deep.depth > n) else (near, far)
        resumed = self.resume.propose(a.seq, a.history, a.k)
        if resumed.tokens:
            again = ("resume", resumed)
            if not first[1].tokens or first[1].depth < SHALLOW:  # before a match that may be chance
                first, second = again, first
            elif not second[1].tokens:
                second = again
        return first, (second if second[1].tokens[:1] != first[1].tokens[:1] else none)

    def _model_cost(self) -> float:
        return self.controller.costs.draft or self.controller.costs.c_verify(1)

    def _model_candidate(self, a: Ask) -> Candidate:
        """The draft model, with what catching up with this sequence's history costs first."""
        setup = self.controller.costs.catch_up(self.model.behind(a.seq, a.history))
        return Candidate(None, self._model_key(len(a.history)), a.k, self._model_cost(), setup)

    def _model_key(self, depth: int) -> str:
        """The controller's key for the model drafter's acceptance. An MTP head's falls as the context
        fills (published for Qwen3.6: 80-91 % near empty, ~53 % at 34K, 40-55 % at 86K), so its
        acceptance is measured per depth band and its draft length follows the band the slot is in;
        a band met for the first time starts from the shallower band's measure."""
        bands = getattr(self.model, "depth_bands", ())  # a head drafter's (HeadDrafter); a draft model has none
        name = self.model.name
        band = sum(depth >= b for b in bands)
        for b in range(1, band + 1):  # shallowest first: each new band from the one before it
            if head_key(name, bands, b) not in self.controller.priors:
                self.controller.priors[head_key(name, bands, b)] = self.controller.alpha(head_key(name, bands, b - 1))
        return head_key(name, bands, band)

    def _is_model(self, key: str) -> bool:
        return self.model is not None and (key == self.model.name or key.startswith(self.model.name + "@"))

    def _candidate(self, a: Ask, found: tuple[str, Match]) -> Candidate:
        source, m = found
        if m.tokens:
            return Candidate(a.seq, text_key(source, m), len(m.tokens), self.LOOKUP_COST)
        if self.model is not None:
            return self._model_candidate(a)
        return Candidate(a.seq, "none", 0, 0.0)

    def _draft(self, a: Ask, x: Candidate, choice: Choice, found: tuple[str, Match]) -> Draft | _ModelAsk:
        """The step's draft for one sequence: the text found, nothing, or the model drafter's (asked
        for in `_model_drafts`, all sequences' together)."""
        source, m = found
        drafts_model = self._is_model(x.key)
        if m.tokens and (choice.k <= 0 or drafts_model):  # scored against the next step's history
            self._shadow[a.seq] = (text_key(source, m), len(a.history), m.tokens)
        why = Why(choice.alpha, choice.gain, choice.reason)
        if choice.k <= 0 or x.key == "none":
            return Draft([], source="none", why=why)
        if not drafts_model:
            self._proposed[a.seq] = (len(a.history), m.tokens)
            return Draft(m.tokens[: choice.k], None, source=source, match_len=m.depth, support=m.count, why=why)
        # a greedy draft the controller expects to pay ends at its first token neither sure nor worth
        # verifying (the controller's length prices an average token), or where it runs into text
        # found earlier (the next step copies it for free); where it was chosen over a text match, at
        # the controller's length at most
        greedy = a.sampling is None and choice.gain > 1.0
        k = a.k if greedy and not m.tokens else choice.k
        worth = DraftWorth(self.controller.costs, self._copied(a)) if greedy else None
        self._model_keys[a.seq] = x.key
        return _ModelAsk(Ask(a.seq, a.history, k, a.sampling, a.rng), worth, why)

    def _model_drafts(self, pending: list[_ModelAsk]) -> list[Draft]:
        """The model drafter's drafts: the MTP head's for every sequence at once (one head decode per
        draft step), a draft model's one sequence after another (each catches up on its own)."""
        if not pending:
            return []
        if hasattr(self.model, "propose_many"):  # a head drafter (HeadDrafter): every sequence in one decode
            t = time.perf_counter()
            drafts = self.model.propose_many([p.ask for p in pending], [p.worth for p in pending])
            if self.model.decodes and self.controller.learn_costs:
                self._observe_model(time.perf_counter() - t, self.model.decodes, 0)
        else:
            drafts = []
            for p in pending:
                a = p.ask
                behind = self.model.behind(a.seq, a.history)
                t = time.perf_counter()
                drafts.append(self.model.propose(a.seq, a.history, a.k, a.sampling, a.rng, p.worth))
                if self.model.decodes and self.controller.learn_costs:
                    self._observe_model(time.perf_counter() - t, self.model.decodes, behind)
        for p, d in zip(pending, drafts):
            d.why = p.why
        return drafts

    def _copied(self, a: Ask):
        """Has a model draft after `a.history` run into a copy (a lookup match of SHALLOW tokens or more)?"""
        if self.lookup is None:
            return None
        lookup, seq, history = self.lookup, a.seq, a.history
        return lambda drafted: lookup.depth_after(seq, history, drafted) >= SHALLOW

    def _observe_model(self, seconds: float, decodes: int, behind: int) -> None:
        """A draft's time is its decodes (one token each, after a catch-up of `behind` tokens in one
        decode; the last may have shown a token not worth drafting): a step that was nearly in step
        measures the cost of a draft decode, a long catch-up the prefill rate."""
        costs = self.controller.costs
        if behind <= 2:
            costs.observe_draft(seconds / decodes)
        elif behind >= 32:
            costs.observe_prefill(max(seconds - (decodes - 1) * (costs.draft or 0.0), 0.0) / behind)

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        if draft.source in TEXT_SOURCES:
            key = text_key(draft.source, Match(draft.tokens, draft.match_len, draft.support))
            self.controller.observe(key, len(draft.tokens), n_accepted, seq)
            start, proposed = self._proposed.pop(seq, (0, []))
            copying = draft.source == "resume" or draft.match_len >= SHALLOW  # a copy, not a chance phrase
            if copying and n_accepted < len(draft.tokens) and proposed[: len(draft.tokens)] == draft.tokens:
                self.resume.parted(seq, start + n_accepted, proposed[n_accepted + 1:])
        else:
            modelled = self.model is not None and draft.source == self.model.name
            key = self._model_keys.pop(seq, draft.source) if modelled else draft.source  # an MTP head's depth band
            self.controller.observe(key, len(draft.tokens), n_accepted)
            if modelled:
                self.model.accepted(seq, draft, n_accepted)  # the MTP head drafts next from the last kept state

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        if self.model is not None:
            self.model.share_prefix(src, dst, prefix)

    def host_bytes(self) -> int:
        return sum(d.host_bytes() for d in (self.suffix, self.model) if d is not None)

    def saved_state(self, seq: int) -> object | None:
        return self.model.saved_state(seq) if self.model is not None else None

    def restore_state(self, seq: int, state: object) -> None:
        if self.model is not None:
            self.model.restore_state(seq, state)

    def release(self, seq: int) -> None:
        for d in (self.lookup, self.model, self.suffix):
            if d is not None:
                d.release(seq)
        self._forget(seq)

    def _forget(self, seq: int) -> None:
        self._shadow.pop(seq, None)
        self._model_keys.pop(seq, None)
        self._proposed.pop(seq, None)
        self.resume.forget(seq)


def adaptive_controller(costs: CostModel, learn_costs: bool = True) -> Controller:
    """The controller an AdaptiveDrafter decides with: the text drafters' prior acceptance per match
    depth, and the match groups that share evidence within a request."""
    return Controller(costs, learn_costs=learn_costs, priors={**LOOKUP_PRIORS, **SUFFIX_PRIORS}, group=match_group)


@dataclass
class _ModelAsk:
    """A sequence's step drafted by the model drafter: its ask (the length to draft at most), the stop
    rule of a greedy draft, the controller's reasons."""

    ask: Ask
    worth: DraftWorth | None
    why: Why


TEXT_SOURCES = ("lookup", "suffix", "resume")  # drafters that copy text (the controller learns them per match)


def text_key(source: str, m: Match) -> str:
    """The bucket the controller learns a text match's acceptance for."""
    if source == "resume":
        return resume_key(m.depth)
    return suffix_key(m.depth, m.count) if source == "suffix" else lookup_key(m.depth)


def head_key(name: str, bands: tuple[int, ...], band: int) -> str:
    """The controller's key of a drafter's acceptance in a depth band ("mtp", "mtp@4k", ...)."""
    return name if band == 0 else f"{name}@{bands[band - 1] // 1024}k"


SHALLOW = 8  # a match shorter than this (tokens) may be chance: a short phrase, a common shape


def _copying(found: tuple[str, Match], choice: Choice) -> bool:
    """Is this step's text draft a copy in progress: taken, and a deep match or a copy picked up again?"""
    source, m = found
    return choice.k > 0 and bool(m.tokens) and (source == "resume" or m.depth >= SHALLOW)


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
