"""Prompt caches kept in host memory, as llama-server's `--cache-ram` keeps them.

When a slot's cache is about to be replaced by an unrelated prompt (another conversation, another
API key's request), its tokens and a copy of its KV state (llama.cpp's sequence state) are kept
here. A later request that starts with those tokens gets them back with one copy instead of
evaluating them again. Copies live in host memory, not in the KV pool: cells held there for a
conversation that may never come back would lengthen every running sequence's attention (measured:
`scripts/pool_cost.py`).

Entries are bounded in bytes and evicted least recently used first. Each belongs to an owner (the
API key's name): a request only ever gets its own owner's entries back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.kv import common_prefix


@dataclass
class Saved:
    owner: str
    tokens: list[int]  # exactly what `data` holds
    data: Any  # the sequence state (Context.save_seq's buffer; its len() is its size in bytes)
    # the slot's context checkpoints (checkpoints.Checkpoint) when it was saved: a recurrent or
    # sliding-window cache loaded from here can still go back to them
    checkpoints: list = field(default_factory=list)
    drafter: Any = None  # what the drafter keeps of it (Drafter.saved_state: an MTP head's cells), or None

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(c.nbytes for c in self.checkpoints) + getattr(self.drafter, "nbytes", 0)


class SavedPrompts:
    """Saved sequence states, least recently used first, at most `max_bytes` in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.entries: list[Saved] = []  # the least recently used first
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def covers(self, owner: str, tokens: Sequence[int]) -> bool:
        """Is there an entry of this owner that starts with all of `tokens`? (Marks it used.)"""
        hit = next((e for e in self.entries if e.owner == owner and len(e.tokens) >= len(tokens)
                    and common_prefix(e.tokens, tokens) == len(tokens)), None)
        if hit is not None:
            self.touch(hit)
        return hit is not None

    def best(self, owner: str, prompt: Sequence[int]) -> tuple[Saved, int] | None:
        """The owner's entry sharing the longest prefix with `prompt`, and that prefix's length
        (None when no entry shares a token)."""
        hit, n = max(((e, common_prefix(e.tokens, prompt)) for e in self.entries if e.owner == owner),
                     key=lambda x: x[1], default=(None, 0))
        return None if hit is None or n == 0 else (hit, n)

    def add(self, owner: str, tokens: Sequence[int], data: Any, slack: int = 0, checkpoints: Sequence = (),
            drafter: Any = None) -> bool:
        """Keep a copy. The owner's entries it holds go, all but their last `slack` tokens (an earlier
        turn of the same conversation), then the least recently used until it fits. False when the
        copy alone is larger than the bound."""
        entry = Saved(owner, list(tokens), data, list(checkpoints), drafter)
        if entry.nbytes > self.max_bytes:
            return False
        for e in [e for e in self.entries if e.owner == owner
                  and common_prefix(e.tokens, entry.tokens) >= len(e.tokens) - slack]:
            self._remove(e)
        while self.entries and self.nbytes + entry.nbytes > self.max_bytes:
            self._remove(self.entries[0])
        self.entries.append(entry)
        self.nbytes += entry.nbytes
        return True

    def touch(self, entry: Saved) -> None:
        """Mark an entry used (the last to be evicted)."""
        self.entries.remove(entry)
        self.entries.append(entry)

    def _remove(self, entry: Saved) -> None:
        self.entries.remove(entry)
        self.nbytes -= entry.nbytes
