"""Keeping a context's cache for one sequence equal to a token list, safely.

`sync(ctx, seq, cached, wanted)` leaves the cache holding `wanted[:n]` for the largest reusable n
and returns n; the caller evaluates `wanted[n:]`. Removing the tail of a sequence is only trusted
where llama.cpp can really do it:
- sliding-window caches keep only the last window (+ a batch) of positions, and
  `llama_memory_seq_rm` returns true even when a removal reaches behind them (the next logits are
  then wrong). So before keeping n tokens we check that the cache still holds positions
  [n - window, n - 1]; otherwise the sequence is evaluated again from the start.
- recurrent state can go back only as far as its rollback snapshots; where `seq_rm` says no, the
  sequence is cleared and evaluated again.
In both cases a context checkpoint at or before the length wanted (checkpoints.py) is put back
instead, where there is one, and only the rest is evaluated again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from app.llama import media
from app.llama.context import Batch, Context, DecodeError


class Rewind(Protocol):
    """What lets a cache go back where it cannot be cut (checkpoints.Checkpoints)."""

    def restore(self, seq: int, n: int, window: int) -> int: ...

    def cut(self, seq: int, n: int) -> None: ...

    def drop(self, seq: int) -> None: ...

class ImageRows(Protocol):
    """What gives the target an image's embedding rows by its key (the projector, vision.py)."""

    non_causal: bool

    def rows(self, key: int) -> np.ndarray: ...

    def width(self, key: int) -> int: ...


CHUNK = 4096  # tokens compared at a time by C code (a Python loop over 100K tokens takes milliseconds)


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the longest common prefix of two token sequences, in time proportional to it but at
    C speed: this runs on every step over whole contexts (110K tokens on a 24 GB card). `start`: the
    first `start` tokens are known to agree (they are not compared again)."""
    n = min(len(a), len(b))
    for c0 in range(min(start, n), n, CHUNK):
        c1 = min(c0 + CHUNK, n)
        ca, cb = a[c0:c1], b[c0:c1]
        if type(ca) is not type(cb):  # a list never equals a tuple
            ca, cb = list(ca), list(cb)
        if ca != cb:
            for i in range(c0, c1):
                if a[i] != b[i]:
                    return i
    return n


def can_keep(ctx: Context, seq: int, n: int, window: int) -> bool:
    """Does the cache hold what the token at position n attends to?"""
    if n == 0:
        return True
    lo, hi = ctx.pos_min(seq), ctx.pos_max(seq)
    if hi < n - 1:
        return False
    return window <= 0 or lo <= max(0, n - window)


def truncate(ctx: Context, seq: int, n: int, window: int, checkpoints: Rewind | None = None) -> int:
    """Drop positions >= n; returns n, or where that cannot be done the length of the checkpoint put
    back instead (< n), or 0 when the cache had to be cleared."""
    if n > 0 and can_keep(ctx, seq, n, window) and ctx.seq_rm(seq, n, -1):
        if checkpoints is not None:
            checkpoints.cut(seq, n)
        return n
    if checkpoints is not None and n > 0:
        kept = checkpoints.restore(seq, n, window)
        if kept:
            return kept
    ctx.seq_rm(seq, 0, -1)
    if checkpoints is not None:
        checkpoints.drop(seq)
    return 0


def sync(ctx: Context, seq: int, cached: list[int], wanted: Sequence[int], window: int, need_logits: bool,
         known: int = 0, checkpoints: Rewind | None = None) -> int:
    """Make the cache hold a reusable prefix of `wanted`; returns its length (<= len(wanted) - need_logits).
    `known`: cached[:known] == wanted[:known] already (see `Growth`)."""
    n = common_prefix(cached, wanted, known)
    if need_logits:
        n = min(n, len(wanted) - 1)
    if n < len(cached):
        n = truncate(ctx, seq, n, window, checkpoints)
        del cached[n:]
    return n


class Interrupted(Exception):
    """An evaluation stopped between two chunks: the cache holds the sequence's first `done` tokens."""

    def __init__(self, done: int) -> None:
        super().__init__(f"stopped after {done} tokens")
        self.done = done


def evaluate(ctx: Context, seq: int, tokens: Sequence[int], start: int, logits_last: bool,
             stop: Callable[[], bool] | None = None, end: int | None = None, images: ImageRows | None = None) -> int:
    """Decode tokens[start:end] (to the end by default) at their positions; returns the last token's
    batch index. The tokens go in chunks of n_ubatch (what llama.cpp computes at once in any case),
    and `stop()` is asked before each: when it says so, Interrupted is raised with what is evaluated,
    so a long prompt stops within one chunk (the server stopping, its client gone) and what it
    evaluated stays a reusable prefix. `logits_last`: logits for the sequence's last token, where
    this call reaches it. Images' positions (media ids, media.py) go as embedding rows: `images`'
    rows, or zeros where this context cannot read them (a draft model: llama-server's rule)."""
    end = len(tokens) if end is None else min(end, len(tokens))
    if not media.has_media(tokens, start, end):
        return _evaluate_text(ctx, seq, tokens, start, end, logits_last, stop)
    last = -1
    for r in media.runs(tokens, start, end):
        if not r.media:
            last = _evaluate_text(ctx, seq, tokens, r.start, r.end, logits_last, stop)
            continue
        if stop is not None and stop():
            raise Interrupted(r.start)
        want = logits_last and r.end == len(tokens)
        n = r.end - r.start
        if images is None:
            rows, non_causal, width = np.zeros((n, ctx.model.n_embd_inp), np.float32), False, 0
        else:
            rows, non_causal, width = images.rows(r.key)[r.row: r.row + n], images.non_causal, images.width(r.key)
        last = _decode_rows(ctx, seq, rows, r, want, non_causal, width if ctx.model.mrope else 0)
    return last


def mrope_sections(start: int, row: int, n: int, width: int) -> np.ndarray:
    """An image's M-RoPE positions for rows [row, row + n) of an image at `start` that is `width`
    patches wide: time, then the patch's row and column offsets (llama.cpp's 2-D layout), then 0.
    The time section counts on by one a row, so the cache keeps one position a token (llama.cpp
    gives every row of an image the image's first position, and text after it max(nx, ny) more)."""
    r = np.arange(row, row + n)
    p0 = start - row
    return np.stack([p0 + r, p0 + r // width, p0 + r % width, np.zeros(n, int)])


def _decode_rows(ctx: Context, seq: int, rows: np.ndarray, r: media.Run, logits_last: bool, non_causal: bool,
                 width: int) -> int:
    """An image's rows in chunks of n_ubatch, or whole where they attend both ways (one ubatch)."""
    size = ctx.params.n_ubatch
    if non_causal and len(rows) > size:
        raise DecodeError(f"an image of {len(rows)} positions must be decoded in one batch, and this context's "
                          f"n_ubatch is {size}: raise --ubatch")
    last = -1
    for c0 in range(0, len(rows), size):
        c1 = min(c0 + size, len(rows))
        sections = mrope_sections(r.start + c0, r.row + c0, c1 - c0, width) if width else None
        last = ctx.decode_rows(rows[c0:c1], r.start + c0, seq, logits_last and c1 == len(rows), non_causal, sections)
    return last


def _evaluate_text(ctx: Context, seq: int, tokens: Sequence[int], start: int, end: int, logits_last: bool,
                   stop: Callable[[], bool] | None) -> int:
    batch: Batch = ctx.batch
    size = ctx.params.n_ubatch
    last = -1
    for c0 in range(start, end, size):
        if stop is not None and stop():
            raise Interrupted(c0)
        batch.clear()
        c1 = min(c0 + size, end)
        for pos in range(c0, c1):
            last = batch.add(tokens[pos], pos, seq, logits_last and pos == len(tokens) - 1)
        ctx.decode(batch)
    return last


class Growth:
    """Per sequence, the history list last seen and its length then. The engine's histories (a slot's
    tokens) are only appended to within a request, so when the same list comes back no shorter, the
    part seen before is unchanged: a drafter compares only what is new, not the whole context, every
    step. A new list (a new request) is compared in full."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Sequence[int], int]] = {}

    def unchanged(self, seq: int, history: Sequence[int]) -> int:
        """How many leading tokens of `history` are as they were at the last `see` (0 if unknown)."""
        last = self._seen.get(seq)
        if last is None or last[0] is not history or len(history) < last[1]:
            return 0
        return last[1]

    def see(self, seq: int, history: Sequence[int]) -> None:
        self._seen[seq] = (history, len(history))

    def forget(self, seq: int) -> None:
        self._seen.pop(seq, None)
