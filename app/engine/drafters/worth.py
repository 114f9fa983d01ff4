"""Where a model's greedy draft stops: at the token not worth verifying, by the step's measured costs.

The drafter's top probability p_j says how likely the target is to keep its j-th token, given it
kept the ones before; the draft is kept whole up to j with the product of them (its reach). A
token is put in the verify while what its reach is worth, at the step's expected rate (tokens per
second so far), pays the verify's extra cost for one more token; the next token is decoded only
while a token as likely as this one would also pay that decode. On a card, where a draft token
costs 1/25 of a 27B decode, drafts run deep through unsure stretches; on a CPU, where it costs a
third, they end at the first doubt. A fixed confidence stop (llama-server's p-min 0.75) is right
for neither: on a CPU stand-in of a card's cost ratio it halved the tokens a code question kept per
decode (2.4 against 4.5 for a fixed 8-token draft), and without it code completion lost 12 %.
"""

from __future__ import annotations

from app.engine.controller import CostModel


class DraftWorth:
    """One greedy draft's stop rule (`keep` each token's top probability, then `go_on`?), priced
    with `costs` at the time the draft starts. Its first token's logits came from a decode the
    step paid (the draft model catching up, or the MTP head's first)."""

    def __init__(self, costs: CostModel) -> None:
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
        """Is a token of top probability `p`, next in the draft, worth verifying? (Counted if so.)"""
        extra = self._extra()
        if self.reach * p * self.seconds <= extra * self.tokens:
            return False
        self.reach *= p
        self.tokens += self.reach
        self.seconds += extra
        self.n += 1
        self.p = p
        return True

    def go_on(self) -> bool:
        """Is decoding the next token worth it, were it as likely as the last? (Its decode counted if so.)"""
        if self.reach * self.p * self.seconds <= (self.c_draft + self._extra()) * self.tokens:
            return False
        self.seconds += self.c_draft
        return True
