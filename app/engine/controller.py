"""Choosing the draft lengths per step: measured costs, estimated acceptance, best expected speed.

    E[tokens | k, a] = (1 - a^(k+1)) / (1 - a)        tokens per step with k drafts, acceptance a
    cost(k)          = k * c_draft + c_verify(k + 1)   seconds per step (c_draft = 0 for lookup)
                       + setup / SETUP_STEPS             where the draft model must first catch up
    choose k in 0..k_max maximising E / cost; k = 0 is plain decoding (1 token per c_verify(1)).

Slots that share one verify decode share its cost: B sequences with k_1..k_B drafts give
B + sum_i (E_i - 1) tokens for c_verify(B + sum k_i) seconds. The j-th draft of sequence i adds
a_i^j expected tokens, so drafts are taken best first across all sequences and the step keeps the
count that gives the most tokens per second (`allocate`).

Costs are measured on the machine at start (`calibration.calibrate`) and refreshed from every real step;
acceptance is estimated per drafter (and per lookup match length) from the steps it drafted.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

EMA = 0.9  # weight of the past in running estimates
TRIAL_DECAY = 0.85  # weight of an acceptance observation after one more trial
OPTIMISTIC_ALPHA = 0.95  # probing a drafter only makes sense if it would pay at this acceptance
# a request's drafts start this short and grow only as its own drafts are kept whole (to TRUST_GROWTH
# times the longest kept so far): estimates carried over from other requests are a guess (a code
# edit's copy is not this text's), and on a CPU, where verifying k tokens costs nearly k times one,
# a 47-token draft that misses costs ~16 plain steps
UNPROVEN_K_MAX = 4
TRUST_GROWTH = 4
# a draft must be expected to beat plain decoding by this much: the estimates it rests on are noisy and
# picked at their best, and a draft that misses costs its whole verify (on a CPU, where a 3-token verify
# costs ~2.6 single decodes, a 2-token draft kept whole only breaks even)
MIN_GAIN = 1.03
# a drafter that must first catch up with the sequence (the draft model evaluating a prompt it has
# not seen: 5.5 s for 500 tokens of the 0.5B on a 2-core CPU) pays that once, then drafts for the
# steps that follow: a step counts this share of it
SETUP_STEPS = 8
# no run of kept drafts makes the next miss impossible: a copy from an earlier text goes on until the
# point where this text differs, unseen until it comes. An estimate tops out here, so a long draft is
# priced with the chance it breaks: on a 2-core CPU a 47-token draft that missed at its first token cost
# 0.57 s, 15 plain decodes, after 42 kept tokens had pushed the estimate to 0.997
ALPHA_MAX = 0.985
GROUP = "group:"  # a request's shared estimate for a group of keys is kept under this prefix


@dataclass
class Choice:
    k: int
    alpha: float
    expected_tokens: float
    cost: float
    gain: float  # expected tokens/s relative to plain decoding (of the whole step, where shared)
    reason: str


@dataclass
class Candidate:
    """A sequence that could draft this step: up to k_max tokens from `key`, each costing draft_cost s."""

    seq: int | None
    key: str
    k_max: int
    draft_cost: float
    setup: float = 0.0  # seconds paid once before its first draft token (catching up with the history)


@dataclass
class CostModel:
    """Seconds per target decode of n tokens, and per draft-model token."""

    verify: dict[int, float] = field(default_factory=dict)
    draft: float | None = None
    draft_prefill: float | None = None  # seconds per token the draft model evaluates in one batch
    _known: list[int] = field(init=False, repr=False, compare=False)  # sorted sizes (c_verify runs often)

    def __post_init__(self) -> None:
        self._known = sorted(self.verify)

    def c_verify(self, n: int) -> float:
        v = self.verify
        if n in v:
            return v[n]
        known = self._known
        if not known:
            return float(n)  # uncalibrated: assume linear
        if n > known[-1]:  # extrapolate with the last measured slope, or the mean one if steeper
            first, last = known[0], known[-1]
            if len(known) >= 2:
                a = known[-2]
                slope = max((v[last] - v[a]) / (last - a), (v[last] - v[first]) / (last - first), 0.0)
            else:
                slope = v[last] / last
            return v[last] + slope * (n - last)
        i = bisect.bisect_left(known, n)
        if i == 0:
            return v[known[0]] * n / known[0]
        lo, hi = known[i - 1], known[i]
        t = (n - lo) / (hi - lo)
        return v[lo] * (1 - t) + v[hi] * t

    def observe_verify(self, n: int, seconds: float) -> None:
        old = self.verify.get(n)
        if old is None:
            bisect.insort(self._known, n)
        self.verify[n] = _ema(old, seconds)

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft = _ema(self.draft, seconds_per_token)

    def observe_prefill(self, seconds_per_token: float) -> None:
        self.draft_prefill = _ema(self.draft_prefill, seconds_per_token)

    def catch_up(self, n: int) -> float:
        """Seconds for the draft model to evaluate n tokens of history it has not seen (unmeasured:
        one decode each, which overestimates)."""
        if n <= 0:
            return 0.0
        return n * (self.draft_prefill or self.draft or self.c_verify(1))


def _ema(old: float | None, new: float) -> float:
    """A running estimate: the first figure as is, then EMA of the past."""
    return new if old is None else EMA * old + (1 - EMA) * new


@dataclass
class Acceptance:
    """Per-token acceptance a: each drafted position the target judged is one trial (kept drafts
    are successes, the first rejection a failure; later positions were never judged). Old trials
    fade by TRIAL_DECAY each, so a drafter that stops matching is noticed within a few steps."""

    kept: float = 1.0  # a weak prior: a = 0.5
    rejected: float = 1.0

    @property
    def alpha(self) -> float:
        return min(self.kept / (self.kept + self.rejected), ALPHA_MAX)

    def observe(self, drafted: int, accepted: int) -> None:
        rejected = 1 if accepted < drafted else 0
        fade = TRIAL_DECAY ** (accepted + rejected)
        self.kept = self.kept * fade + accepted
        self.rejected = self.rejected * fade + rejected


def expected_tokens(k: int, a: float) -> float:
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


class Controller:
    def __init__(self, costs: CostModel, probe_every: int = 32, learn_costs: bool = True,
                 priors: dict[str, float] | None = None, group: Callable[[str], str | None] | None = None) -> None:
        self.costs = costs
        self.local: dict[tuple[int, str], Acceptance] = {}  # per slot, for the request it serves
        self.trust: dict[int, int] = {}  # per slot: the longest draft its request has earned
        self.learn_costs = learn_costs  # refresh costs from real steps (off: fixed costs, for tests)
        self.acceptance: dict[str, Acceptance] = {}
        self.priors: dict[str, float] = dict(priors or {})  # acceptance expected of a drafter before any trial (else 0.5)
        self.probe_every = probe_every
        self._idle: dict[str, int] = {}
        # keys whose evidence a request shares (shallow matches: one that misses says this request's
        # text is not what made them good before); key -> group name, or None for a key of its own
        self.group: Callable[[str], str | None] = group or (lambda key: None)
        self._limits: dict[tuple[int, int], int] = {}  # (trusted, k_max) -> limit, until the costs change

    def observe_verify(self, n: int, seconds: float) -> None:
        """The engine's cost observer: a real verify decode of n tokens took `seconds`."""
        if self.learn_costs:
            self.costs.observe_verify(n, seconds)
            self._limits.clear()

    def verify_cost(self, n: int) -> float:
        """Seconds a verify decode of n tokens costs, as measured."""
        return self.costs.c_verify(n)

    def alpha(self, key: str, seq: int | None = None) -> float:
        """The request's own estimate for this key where it has one, capped by what the request's
        drafts of the key's group have shown so far; for a key new to the request, the group's
        evidence here where there is some (a copy resuming is matched at depth 3, 4, 5..., each its
        own key), else the estimate across requests."""
        own = self.local.get((seq, key)) if seq is not None else None
        group = self.group(key) if seq is not None else None
        shared = self.local.get((seq, GROUP + group)) if group else None
        if own is None:
            return shared.alpha if shared is not None else self._global(key).alpha
        return min(own.alpha, shared.alpha) if shared is not None else own.alpha

    def trusted(self, seq: int) -> int:
        """The longest draft this slot's request may take now."""
        return self.trust.get(seq, UNPROVEN_K_MAX)

    def _global(self, key: str) -> Acceptance:
        """The estimate across requests; before any trial, the drafter's prior with the weight of two."""
        if key not in self.acceptance:
            a = self.priors.get(key, 0.5)
            self.acceptance[key] = Acceptance(2 * a, 2 * (1 - a))
        return self.acceptance[key]

    def new_request(self, seq: int) -> None:
        """A new request on this slot: its own estimates start again from the global ones, weakly,
        so a drafter that was good for the last text is tried but dropped after one miss."""
        for k in [k for k in self.local if k[0] == seq]:
            del self.local[k]
        self.trust.pop(seq, None)

    def choose(self, key: str, k_max: int, draft_cost: float, seq: int | None = None, batch: int = 1) -> Choice:
        """The best k in 0..k_max for one sequence whose draft tokens cost `draft_cost` seconds each,
        when it shares its verify decode with `batch - 1` others that do not draft."""
        return self.allocate([Candidate(seq, key, k_max, draft_cost)], batch)[0]

    def allocate(self, cands: Sequence[Candidate], batch: int | None = None) -> list[Choice]:
        """`plan` the step, then now and then probe a sequence that would not draft."""
        return self.probe_idle(cands, self.plan(cands, batch))

    def plan(self, cands: Sequence[Candidate], batch: int | None = None) -> list[Choice]:
        """Draft lengths for sequences verified in one decode of `batch` sequences (default: the
        candidates; others there take one token each). Drafts are added in order of what each adds
        (a^j for the j-th of a sequence), and the step keeps the number that gives the most
        expected tokens per second, if that beats plain decoding by MIN_GAIN. Changes nothing."""
        batch = max(batch or len(cands), 1)
        c = self.costs.c_verify
        plain = batch / c(batch)
        alphas = [self.alpha(x.key, x.seq) for x in cands]
        limits = [self._limit(x) for x in cands]
        ks = [0] * len(cands)
        best_rate, best_ks = plain * MIN_GAIN, list(ks)
        heap = [(-a, i) for i, (a, lim) in enumerate(zip(alphas, limits)) if lim > 0 and a > 0]
        heapq.heapify(heap)
        tokens, spent, total = float(batch), 0.0, 0
        while heap:
            neg, i = heapq.heappop(heap)
            ks[i] += 1
            total += 1
            tokens -= neg
            spent += cands[i].draft_cost + (cands[i].setup / SETUP_STEPS if ks[i] == 1 else 0.0)
            rate = tokens / (c(batch + total) + spent)
            if rate > best_rate:
                best_rate, best_ks = rate, list(ks)
            if ks[i] < limits[i]:
                heapq.heappush(heap, (neg * alphas[i], i))
        drafts = sum(best_ks)
        gain = best_rate / plain if drafts else 1.0
        cost = c(batch + drafts) + sum(k * x.draft_cost + (x.setup / SETUP_STEPS if k else 0.0)
                                       for x, k in zip(cands, best_ks))
        choices = []
        for x, a, k in zip(cands, alphas, best_ks):
            if k:
                shared = f" in a batch of {batch}" + (f", {drafts} drafts in all" if drafts > k else "") if batch > 1 else ""
                e = expected_tokens(k, a)
                choices.append(Choice(k, a, e, cost, gain, f"{x.key}: a={a:.2f}, {e:.2f} tokens per {cost * 1e3:.1f} ms{shared}"))
            else:
                choices.append(Choice(0, a, 1.0, c(batch), 1.0, "plain decoding is fastest"))
        return choices

    def _limit(self, x: Candidate) -> int:
        """The longest draft this candidate may take: its k_max, and for a request's own text no
        draft whose verify costs more than the longest the request has earned. A longer one that
        costs no more is allowed: where this machine's kernels take tokens in blocks (a 2-core CPU
        here verified 16 tokens in the time of 12), it risks nothing more and may keep more."""
        if x.seq is None:
            return x.k_max
        trusted = self.trusted(x.seq)
        if trusted >= x.k_max:
            return x.k_max
        limit = self._limits.get((trusted, x.k_max))
        if limit is None:  # a scan of the cost model: once per step, not per plan and probe
            c = self.costs.c_verify
            budget = c(trusted + 1)
            limit = max(k for k in range(trusted, x.k_max + 1) if k == trusted or c(k + 1) <= budget)
            self._limits[(trusted, x.k_max)] = limit
        return limit

    def probe_idle(self, cands: Sequence[Candidate], choices: list[Choice]) -> list[Choice]:
        """The step's final choices, where a drafter that has not drafted for `probe_every` steps
        tries two tokens, so a changed acceptance is noticed (only where drafting could pay at all).
        Call once per step: it counts the idle steps."""
        out = []
        for x, ch in zip(cands, choices):
            k_max = self._limit(x)
            if ch.k or (k_max > 0 and not self._could_pay(k_max, x.draft_cost, x.setup)):
                self._idle[x.key] = 0
            elif k_max > 0:  # k_max 0: nothing to draft from, or speculation off for this request
                self._idle[x.key] = self._idle.get(x.key, 0) + 1
                if self._idle[x.key] >= self.probe_every:
                    self._idle[x.key] = 0
                    k = min(2, k_max)
                    ch = Choice(k, ch.alpha, expected_tokens(k, ch.alpha),
                                k * x.draft_cost + x.setup + self.costs.c_verify(k + 1), 0.0, f"{x.key}: probe")
            out.append(ch)
        return out

    def _could_pay(self, k_max: int, draft_cost: float, setup: float = 0.0, a: float = OPTIMISTIC_ALPHA) -> bool:
        plain = 1.0 / self.costs.c_verify(1)
        once = setup / SETUP_STEPS
        return any(expected_tokens(k, a) / (k * draft_cost + once + self.costs.c_verify(k + 1)) > plain * 1.05
                   for k in range(1, k_max + 1))

    def observe(self, key: str, drafted: int, accepted: int, seq: int | None = None) -> None:
        if not drafted:
            return
        glob = self._global(key)
        if seq is not None:
            local = self.local.get((seq, key))
            if local is None:  # seeded from the global estimate with the weight of two trials
                local = self.local[(seq, key)] = Acceptance(2 * glob.alpha, 2 * (1 - glob.alpha))
            local.observe(drafted, accepted)
            if accepted == drafted:
                self.trust[seq] = max(self.trusted(seq), TRUST_GROWTH * drafted)
            group = self.group(key)
            if group:  # from a neutral start: only this request's drafts of the group count
                self.local.setdefault((seq, GROUP + group), Acceptance(0.5, 0.5)).observe(drafted, accepted)
        glob.observe(drafted, accepted)
