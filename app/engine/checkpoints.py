"""Context checkpoints: saved partial states that let a cache go back where it cannot be cut.

A hybrid model's recurrent state (Qwen3.6: 48 Gated DeltaNet layers) only goes back as far as its
few rollback snapshots, and a sliding-window layer keeps only its last window of cells, so a cache
of such a model cannot be truncated to an earlier length. A checkpoint is the part of one
sequence's state that cannot be cut (llama.cpp's PARTIAL_ONLY sequence state: the recurrent state,
the sliding-window cells), taken when the cache held exactly its first `n` tokens. Putting it back
and truncating the attention cells (which can be cut) at `n` leaves the cache as it was then: the
next turn of a conversation that departs from the cache after `n` evaluates only the rest.

As llama-server keeps them (`--ctx-checkpoints`, tools/server/server-context.cpp): a bounded list
per sequence, taken at the end of a prompt and every so many tokens of a long one; when the list
is full, the checkpoints closer than `min_step` tokens to the one before them go first, then the
oldest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from app.engine import kv
from app.engine.kv import can_keep
from app.llama import media
from app.llama.context import Context

TAIL = 4  # a prompt is checkpointed this many tokens before its end (and n_ubatch more), where the
# next turn of a conversation most often departs from it: a template that drops the last answer's
# reasoning, or renders the generation prompt differently once the answer is in the history


@dataclass(frozen=True)
class Checkpoint:
    n: int  # the cache held the sequence's first n tokens
    data: np.ndarray  # Context.save_partial's copy
    epoch: int = 0  # which of the sequence's prompts took it (see Checkpoints.new_prompt)

    @property
    def nbytes(self) -> int:
        return len(self.data)


class Checkpoints:
    """The checkpoints of one context's sequences: at most `limit` and `max_bytes` each."""

    def __init__(self, ctx: Context, limit: int, min_step: int, max_bytes: int | None = None) -> None:
        self.ctx = ctx
        self.limit = max(0, limit) if ctx.needs_checkpoints else 0
        self.min_step = max(0, min_step)
        self.max_bytes = max_bytes
        self._seqs: dict[int, list[Checkpoint]] = {}
        self._epochs: dict[int, int] = {}
        self.restored = 0  # checkpoints put back (a count for tests and the log)
        self.skipped = 0  # checkpoints not kept: larger than the bound, or refused by llama.cpp

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for cs in self._seqs.values() for c in cs)

    def of(self, seq: int) -> list[Checkpoint]:
        return list(self._seqs.get(seq, ()))

    def stops(self, total: int, start: int, end: int) -> list[int]:
        """Where a sequence of `total` tokens evaluated from `start` to `end` is checkpointed: TAIL
        and TAIL + n_ubatch tokens before its end, and every min_step tokens."""
        if not self.enabled:
            return []
        marks = {total - TAIL, total - TAIL - self.ctx.params.n_ubatch}
        if self.min_step:
            marks.update(range(self.min_step, total, self.min_step))
        return sorted(m for m in marks if start < m <= end and m < total)

    def evaluate(self, seq: int, tokens: Sequence[int], start: int, logits_last: bool,
                 stop: Callable[[], bool] | None = None, end: int | None = None, images: kv.ImageRows | None = None) -> int:
        """`kv.evaluate`, pausing at each of `stops` to take a checkpoint there."""
        end = len(tokens) if end is None else min(end, len(tokens))
        idx, at = -1, start
        for m in self.stops(len(tokens), start, end):
            m = media.image_end(tokens, m)  # never inside an image (its rows may attend both ways)
            if m > end:
                break
            if m > at:
                idx = kv.evaluate(self.ctx, seq, tokens, at, logits_last, stop, m, images)
                at = m
            self.take(seq, m)
        if end > at:
            idx = kv.evaluate(self.ctx, seq, tokens, at, logits_last, stop, end, images)
        return idx

    def new_prompt(self, seq: int) -> None:
        """A new prompt starts on the sequence: the checkpoints it takes are its own."""
        self._epochs[seq] = self._epochs.get(seq, 0) + 1

    def take(self, seq: int, n: int) -> Checkpoint | None:
        """Save the sequence's partial state; the cache holds its first n tokens now."""
        if not self.enabled or n <= 0:
            return None
        have = self._seqs.setdefault(seq, [])
        if have and have[-1].n == n:
            return have[-1]
        try:
            ck = Checkpoint(n, self.ctx.save_partial(seq), self._epochs.get(seq, 0))
        except Exception:  # llama.cpp could not save it: no checkpoint, never an error
            self.skipped += 1
            return None
        if self.max_bytes is not None and ck.nbytes > self.max_bytes:  # larger than the bound: skipped
            self.skipped += 1
            return None
        self._evict(seq, ck.nbytes)
        have.append(ck)
        return ck

    def _evict(self, seq: int, incoming: int) -> None:
        """Room for one more checkpoint of `seq`. When the list is full, those closer than min_step
        tokens to the checkpoint before them go first (not the current prompt's: the two near its
        end are close by design), then the oldest; then the oldest until the bytes fit."""
        have, epoch = self._seqs[seq], self._epochs.get(seq, 0)
        if len(have) + 1 >= self.limit and self.min_step:
            kept: list[Checkpoint] = []
            for c in have:
                if kept and c.epoch != epoch and c.n <= kept[-1].n + self.min_step:
                    continue
                kept.append(c)
            have[:] = kept
        while have and len(have) >= self.limit:
            have.pop(0)
        while have and self.max_bytes is not None and sum(c.nbytes for c in have) + incoming > self.max_bytes:
            have.pop(0)

    def restore(self, seq: int, n: int, window: int) -> int:
        """Put back the latest checkpoint at or before n tokens and cut the cache there; returns its
        length, or 0 where there is none or llama.cpp refuses it (the caller clears the sequence and
        its checkpoints, and evaluates from the start: a failed restore never leaves wrong state)."""
        for ck in reversed(self._seqs.get(seq, ())):
            if ck.n > n:
                continue
            if self.ctx.load_partial(seq, ck.data) and self.ctx.seq_rm(seq, ck.n, -1) \
                    and can_keep(self.ctx, seq, ck.n, window):
                self.cut(seq, ck.n)
                self.restored += 1
                return ck.n
            self.skipped += 1
            break
        return 0

    def cut(self, seq: int, n: int) -> None:
        """The cache was cut to n tokens: the checkpoints past it are no longer of this sequence."""
        have = self._seqs.get(seq)
        if have:
            have[:] = [c for c in have if c.n <= n]

    def drop(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def give(self, seq: int, checkpoints: Sequence[Checkpoint]) -> None:
        """The sequence's cache became another's (a saved prompt loaded): its checkpoints come too."""
        self._seqs[seq] = list(checkpoints)[-self.limit:] if self.enabled else []
