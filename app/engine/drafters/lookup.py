"""Prompt lookup: drafts copied from where the sequence's last n-gram appeared before."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.engine import kv
from app.engine.drafters.base import Draft, DrafterBase
from app.engine.sampling import SamplingParams


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
        self._growth = kv.Growth()

    def _indexed(self, seq: int, history: Sequence[int]) -> dict[tuple[int, ...], int]:
        """n-gram -> the position right after its latest occurrence (excluding the history's end)."""
        tokens, index = self._index.get(seq, ([], {}))
        n_old = len(tokens)
        same = min(self._growth.unchanged(seq, history), n_old)
        if n_old > len(history) or kv.common_prefix(tokens, history, same) < n_old:  # a new or rewound history
            tokens, index, n_old = [], {}, 0
        tokens.extend(history[n_old:])  # in place: the history only grew
        for end in range(max(n_old, 1), len(tokens)):  # an n-gram ending at `end` is followed by tokens[end]
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end - n >= 0:
                    index[tuple(tokens[end - n : end])] = end
        self._index[seq] = (tokens, index)
        self._growth.see(seq, history)
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
                    n = self._extend(history, at, history, n)
                return list(history[at : at + k]), n
        return [], 0

    def depth_after(self, seq: int, history: Sequence[int], drafted: Sequence[int]) -> int:
        """How deep the end of `history + drafted` matches the history indexed at this step's lookup
        (0: not at all, or the index is not this history's): a draft that has run into a copy."""
        tokens, index = self._index.get(seq, ([], {}))
        if not drafted or len(tokens) != len(history):
            return 0
        tail = list(history[-self.match_max:]) + list(drafted)  # all a match of match_max tokens reads
        n = min(self.ngram_max, len(tail) - 1)
        at = index.get(tuple(tail[-n:])) if n >= self.ngram_min else None
        if at is None:
            return 0
        return self._extend(tokens, at, tail, n)

    def _extend(self, source: Sequence[int], at: int, text: Sequence[int], n: int) -> int:
        """The length of the match that ends at `at` in `source` and at the end of `text`, from n up
        to match_max."""
        end = len(text)
        while n < self.match_max and at - n - 1 >= 0 and end - n - 1 >= 0 and source[at - n - 1] == text[end - n - 1]:
            n += 1
        return n

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        tokens, n = self.lookup(seq, history, k)
        return Draft(tokens, None, source=self.name, match_len=n)

    def release(self, seq: int) -> None:
        self._index.pop(seq, None)
        self._growth.forget(seq)


def lookup_key(match_len: int) -> str:
    """Acceptance is learned per match length: short ones exactly (2..7), long ones in doublings
    (8-15, 16-31, 32+): a long verbatim match is a copy in progress, a short one may be chance."""
    bucket = match_len if match_len < 8 else 1 << (match_len.bit_length() - 1)
    return f"lookup-{min(bucket, 32)}"


LOOKUP_PRIORS = {"lookup-16": 0.95, "lookup-32": 0.95}
