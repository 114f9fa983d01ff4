"""Where a model's greedy draft stops: at its first token neither sure nor worth verifying.

The drafter's top probability p_j says how likely the target is to keep its j-th token, given it
kept the ones before; the draft is kept whole up to j with about the product of them (its reach).
A token the drafter is sure of (p >= SURE) is drafted; an unsure one while what its reach is worth,
at the step's expected rate (tokens per second so far), pays the verify's extra cost for one more
token. The next token is decoded while the last was sure, or while a token as likely would also pay
that decode. On a card, where a draft token costs 1/25 of a 27B decode, drafts run on through unsure
stretches; on a CPU, where it costs a third, they end at the first doubt. A fixed confidence stop
alone (llama-server's p-min) fits one cost ratio at most, and the reach alone ends long runs of sure
tokens too soon: those are kept more often than the product says. docs/BENCHMARKS.md
(`bench --f32-target`) has what each did. Greedy drafts only: under rejection sampling a token's
chance of being kept is not its probability.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.engine.controller import CostModel

SURE = 0.75  # a token this likely is drafted whatever the reach (llama-server's p-min default)


class DraftWorth:
    """One greedy draft's stop rule (`keep` each token's top probability, then `go_on`?), priced
    with `costs` at the time the draft starts. Its first token's logits came from a decode the
    step paid (the draft model catching up, or the MTP head's first)."""

    def __init__(self, costs: CostModel, copied: Callable[[Sequence[int]], bool] | None = None) -> None:
        """`copied(drafted)`: has the draft run into text found earlier? It then ends there: the next
        step copies that text for free, where each further draft token costs a decode."""
        self.copied = copied
        self.c_verify = costs.c_verify
        self.c_draft = costs.draft or costs.c_verify(1)
        self.reach = 1.0  # chance the target keeps every token kept so far
        self.tokens = 1.0  # expected tokens of the step (the target's own, then each kept token's reach)
        self.seconds = self.c_draft + self.c_verify(1)
        self.n = 0  # tokens kept
        self.p = 0.0  # the last token's top probability

    def _extra(self) -> float:
        """Seconds one more token adds to the verify."""
        return self.c_verify(self.n + 2) - self.c_verify(self.n + 1)

    def keep(self, p: float) -> bool:
        """Is a token of top probability `p`, next in the draft, sure or worth verifying? (Counted if so.)"""
        extra = self._extra()
        if p < SURE and self.reach * p * self.seconds <= extra * self.tokens:
            return False
        self.reach *= p
        self.tokens += self.reach
        self.seconds += extra
        self.n += 1
        self.p = p
        return True

    def go_on(self, drafted: Sequence[int] = ()) -> bool:
        """Decode the next token: was the last sure, or would one as likely pay the decode, and has
        the draft not run into a copy? (Counted if so.)"""
        if self.p < SURE and self.reach * self.p * self.seconds <= (self.c_draft + self._extra()) * self.tokens:
            return False
        if self.copied is not None and self.copied(drafted):
            return False
        self.seconds += self.c_draft
        return True
