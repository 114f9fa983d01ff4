"""Drafters: anything that proposes up to k next tokens for a sequence.

One small interface, so the verify / accept / rollback code never changes when a drafter does:
`propose(seq, history, k, ...)` returns a Draft, `accepted` says how much of it the target kept,
and the next `propose` call carries the sequence's new history, so the drafter brings its own
state in step. Drafters that keep estimates may also have `begin_request(seq)`, which the engine
calls when a request starts, and `propose_all(asks)`, which it then calls instead of `propose` to
draft for every sequence of a step at once (they share one verify decode).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine import kv
from app.engine.accept import draw
from app.engine.controller import Candidate, Choice, Controller
from app.engine.sampling import SamplingParams, TokenSampler
from app.llama.context import Context, DecodeError


@dataclass
class Draft:
    tokens: list[int]
    q: list[np.ndarray] | None = None  # the distributions the tokens were drawn from (rejection sampling)
    source: str = ""  # which drafter proposed them
    match_len: int = 0  # prompt lookup: the n-gram length that matched
    choice: Choice | None = None  # the controller's decision, when one decided
    seconds: float | None = None  # the time proposing it took, when it was proposed alone


@dataclass
class Ask:
    """One sequence's request for a draft in a step (see Drafter.propose)."""

    seq: int
    history: Sequence[int]
    k: int
    sampling: SamplingParams | None = None
    rng: np.random.Generator | None = None


class Drafter(Protocol):
    """Everything the engine calls on a drafter. `DrafterBase` gives the optional parts defaults."""

    name: str

    def begin_request(self, seq: int) -> None:
        """A new request starts on this sequence (drafters that keep estimates per request reset them)."""
        ...

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None,
                rng: np.random.Generator | None) -> Draft:
        """Up to k tokens that may follow `history`. `sampling` is given for rejection sampling:
        then tokens are drawn from the drafter's own distribution, returned in `q`."""
        ...

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        """One step's drafts for every sequence, in the order asked (they share one verify decode, so
        a drafter may choose their lengths together)."""
        ...

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        """Told after verification how many of the draft's tokens the target kept."""
        ...

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        """Sequence `dst` now starts with `src`'s first len(prefix) cached tokens."""
        ...

    def release(self, seq: int) -> None:
        """Forget a sequence (its slot is free)."""
        ...


class DrafterBase:
    """Defaults for the optional parts of `Drafter`: nothing to reset or share, and each sequence's
    draft proposed on its own (and timed on its own)."""

    name = "drafter"

    def begin_request(self, seq: int) -> None:
        pass

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        raise NotImplementedError

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        out = []
        for a in asks:
            t = time.perf_counter()
            d = self.propose(a.seq, a.history, a.k, a.sampling, a.rng) if a.k > 0 else Draft([])
            d.seconds = time.perf_counter() - t
            out.append(d)
        return out

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        pass

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        pass

    def release(self, seq: int) -> None:
        pass


def top_probability(logits: np.ndarray, top: float | None = None) -> float:
    """Softmax probability of the argmax: one float32 exp over the vocabulary, no normalised copy."""
    m = float(logits.max()) if top is None else top
    return 1.0 / float(np.exp(logits - np.float32(m)).sum(dtype=np.float64))


class ModelDrafter(DrafterBase):
    """A small GGUF model with its own context; its cache follows each sequence's history."""

    name = "draft-model"

    def __init__(self, ctx: Context, p_min: float = 0.0, n_min: int = 0) -> None:
        self.ctx = ctx
        self.p_min = p_min
        self.n_min = n_min
        self.window = ctx.model.swa_window
        self.cached: dict[int, list[int]] = {}
        self._samplers: dict[int, tuple[SamplingParams, TokenSampler]] = {}

    def _sampler(self, seq: int, sampling: SamplingParams) -> TokenSampler:
        have = self._samplers.get(seq)
        if have is None or have[0] != sampling:
            # the draft's q leaves out penalties and grammar (their state follows the target's history;
            # a draft token the grammar forbids has p = 0 and is rejected)
            have = (sampling, TokenSampler(sampling.model_copy(update={"repeat_penalty": 1.0, "frequency_penalty": 0.0,
                                                                       "presence_penalty": 0.0, "grammar": None}),
                                           self.ctx.model.n_vocab))
            self._samplers[seq] = have
        return have[1]

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        draft = Draft([], [] if sampling is not None else None, source=self.name)
        if k <= 0:
            return draft
        cached = self.cached.setdefault(seq, [])
        n = kv.sync(self.ctx, seq, cached, history, self.window, need_logits=True)
        try:
            idx = kv.evaluate(self.ctx, seq, history, n, logits_last=True)
        except DecodeError:  # the draft's pool is full: no draft this step (the target goes on alone)
            self._resync(seq, history)
            return draft
        cached.extend(history[len(cached):])  # sync left cached == history[:n]; the rest is now evaluated
        sampler = self._sampler(seq, sampling) if sampling is not None else None
        pos = len(history)
        for j in range(k):
            logits = self.ctx.logits(idx)
            if sampler is None:
                token = int(np.argmax(logits))
                if self.p_min > 0:  # the top probability costs an exp over the vocabulary: only when used
                    if j >= self.n_min and top_probability(logits, float(logits[token])) < self.p_min:
                        break
            else:
                q = sampler.probs(logits)
                token = draw(q, rng)
                draft.q.append(q)
            draft.tokens.append(token)
            if j == k - 1:
                break
            b = self.ctx.batch
            b.clear()
            idx = b.add(token, pos, seq, True)
            try:
                self.ctx.decode(b)
            except DecodeError:
                self._resync(seq, history)
                break
            cached.append(token)
            pos += 1
        return draft

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        """`dst` starts from what `src`'s cache holds of `prefix` (shared cells, nothing copied)."""
        if not self.ctx.shares_cells:
            return
        n = kv.common_prefix(self.cached.get(src, []), prefix)
        if n == 0:
            return
        self.ctx.seq_rm(dst, 0, -1)
        self.ctx.seq_cp(src, dst, 0, n)
        self.cached[dst] = list(prefix[:n])

    def _resync(self, seq: int, history: Sequence[int]) -> None:
        """After a refused decode: keep only what the cache surely holds."""
        n = kv.truncate(self.ctx, seq, min(self.ctx.pos_max(seq) + 1, len(history)), self.window)
        self.cached[seq] = list(history[:n])

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        pass  # the next propose() brings the cache in step with the new history

    def release(self, seq: int) -> None:
        self.cached.pop(seq, None)
        self._samplers.pop(seq, None)
        self.ctx.seq_rm(seq, 0, -1)


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

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        pass

    def release(self, seq: int) -> None:
        pass


class LookupDrafter(DrafterBase):
    """Prompt lookup: find the longest recent n-gram that ends the history earlier in the history
    (prompt and output), and propose what followed it. Free to compute; strong when the answer
    repeats the prompt (code edits)."""

    name = "lookup"

    def __init__(self, ngram_max: int = 6, ngram_min: int = 2, match_max: int = 32) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.match_max = max(match_max, ngram_max)
        self._index: dict[int, tuple[list[int], dict[tuple[int, ...], int]]] = {}

    def _indexed(self, seq: int, history: Sequence[int]) -> dict[tuple[int, ...], int]:
        """n-gram -> the position right after its latest occurrence (excluding the history's end)."""
        tokens, index = self._index.get(seq, ([], {}))
        n_old = len(tokens)
        if n_old > len(history) or kv.common_prefix(tokens, history) < n_old:  # a new or rewound history
            tokens, index, n_old = [], {}, 0
        tokens.extend(history[n_old:])  # in place: the history only grew
        for end in range(max(n_old, 1), len(tokens)):  # an n-gram ending at `end` is followed by tokens[end]
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end - n >= 0:
                    index[tuple(tokens[end - n : end])] = end
        self._index[seq] = (tokens, index)
        return index

    def lookup(self, seq: int, history: Sequence[int], k: int) -> tuple[list[int], int]:
        """(proposed tokens, length of the match): the longest indexed n-gram, and where that is the
        longest indexed length, how far the match really goes back (up to `match_max`): a verbatim
        copy of 40 tokens says more about the next ones than six common words do."""
        if k <= 0 or len(history) < self.ngram_min + 1:
            return [], 0
        index = self._indexed(seq, history)
        for n in range(min(self.ngram_max, len(history) - 1), self.ngram_min - 1, -1):
            at = index.get(tuple(history[-n:]))
            if at is not None and at < len(history):
                if n == self.ngram_max:
                    n = self._extend(history, at, n)
                return list(history[at : at + k]), n
        return [], 0

    def _extend(self, history: Sequence[int], at: int, n: int) -> int:
        """The length of the match that ends at `at` and at the history's end, from n up to match_max."""
        end = len(history)
        while n < self.match_max and at - n - 1 >= 0 and history[at - n - 1] == history[end - n - 1]:
            n += 1
        return n

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        tokens, n = self.lookup(seq, history, k)
        return Draft(tokens, None, source=self.name, match_len=n)

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        pass

    def release(self, seq: int) -> None:
        self._index.pop(seq, None)


def lookup_key(match_len: int) -> str:
    """Acceptance is learned per match length: short ones exactly (2..7), long ones in doublings
    (8-15, 16-31, 32+): a long verbatim match is a copy in progress, a short one may be chance."""
    bucket = match_len if match_len < 8 else 1 << (match_len.bit_length() - 1)
    return f"lookup-{min(bucket, 32)}"


# before any trial: a verbatim match of 16+ tokens is a copy in progress and will most likely go on
LOOKUP_PRIORS = {"lookup-16": 0.95, "lookup-32": 0.95}


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
