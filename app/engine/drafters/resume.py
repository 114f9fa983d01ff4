"""Picking a copy up again right after the answer parted from it.

A copied text (a regenerated module, an edit of the file in the prompt, a tool call of a known shape)
usually parts from its source for a word and then goes on as before: a renamed identifier, another
path, a value. Lookup and the suffix index find the source again only once the answer has repeated
a few of its tokens after the change (an n-gram of 2 or 3), so the steps in between decode plainly.
`Resume` keeps, per sequence, the source's text after the draft token that was not kept, and
proposes its continuation at once:

- right after the change, the source's next tokens (the change replaced one token: a guess);
- then, where the answer's last tokens reappear early in that text (the change was longer or shorter
  than what it replaced), what follows them there.

It looks only `WINDOW` tokens into the source and only for `WINDOW` tokens after the change; the
controller learns how often each kind is kept (keys from `resume_key`), as for any text drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.drafters.suffix import Match

WINDOW = 8  # tokens of the source searched, and tokens after the change it waits for the copy to resume


@dataclass
class Parted:
    at: int  # history position of the token the target chose instead of the draft's
    tail: list[int]  # the source's text after the draft token that was not kept


class Resume:
    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._parted: dict[int, Parted] = {}

    def parted(self, seq: int, at: int, tail: Sequence[int]) -> None:
        """The target chose another token than the draft at history position `at`; `tail` is the
        source's text after the draft's token there."""
        if tail:
            self._parted[seq] = Parted(at, list(tail))
        else:
            self._parted.pop(seq, None)

    def propose(self, seq: int, history: Sequence[int], k: int) -> Match:
        """Up to k tokens where the source may go on after what the history holds since the change;
        the match's depth is how many of the answer's last tokens since the change agree with the
        source (0: the guess right after the change)."""
        p = self._parted.get(seq)
        if p is None or k <= 0:
            return Match([])
        since = history[p.at:]
        if not since or len(since) > self.window:
            self._parted.pop(seq, None)
            return Match([])
        best, depth = -1, 0
        for i in range(min(len(p.tail) - 1, self.window)):  # the answer's last token at tail[i], text after it
            if p.tail[i] == since[-1]:
                d = _agreement(p.tail, i, since)
                if d > depth:
                    best, depth = i, d
        if best >= 0:
            return Match(p.tail[best + 1: best + 1 + k], depth)
        if len(since) == 1:  # right after the change: the source as if it replaced one token
            return Match(p.tail[:k], 0)
        return Match([])

    def forget(self, seq: int) -> None:
        self._parted.pop(seq, None)


def _agreement(tail: list[int], i: int, since: Sequence[int]) -> int:
    """How many of the answer's tokens since the change (the change's own included), back from its
    last, equal the source's back from tail[i]."""
    n = 0
    while n <= i and n < len(since) and tail[i - n] == since[-1 - n]:
        n += 1
    return n


def resume_key(depth: int) -> str:
    """Acceptance is learned for the guess right after the change, one agreeing token, and more."""
    return f"resume-{min(depth, 2)}"
