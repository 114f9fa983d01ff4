"""Measuring what decodes cost on this machine, for the controller's cost model.

`calibrate` times target decodes of n tokens (logits for all, as in a verify step) for the sizes a
step may verify, and single draft tokens, on a scratch sequence it clears afterwards. The policy
that uses the figures is pure and lives in `controller`; this is the part that runs llama.cpp.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from app.engine.controller import CostModel
from app.engine.drafters.base import HeadDrafter
from app.llama.context import Context, LoadCancelled


PREFIX = 64  # tokens decoded before the timed ones (a quarter of a smaller context)
SIZE_BOUND = 4 * PREFIX  # a context of at least this many cells calibrates as any larger one does

def _prefix(ctx: Context, seq: int, n: int) -> None:
    ctx.seq_rm(seq, 0, -1)
    b = ctx.batch
    b.clear()
    for pos in range(n):
        b.add(pos % 100 + 5, pos, seq, pos == n - 1)
    ctx.decode(b)


def _time_decode(ctx: Context, seq: int, start: int, n: int, prefix: int) -> float:
    """One timed decode of n tokens at `start`, then back to the prefix (cleared and rebuilt where
    the cache cannot drop them, as with recurrent state)."""
    b = ctx.batch
    b.clear()
    for j in range(n):
        b.add((start + j) % 100 + 5, start + j, seq, True)
    t = time.perf_counter()
    ctx.decode(b)
    ctx.synchronize()
    elapsed = time.perf_counter() - t
    if not ctx.seq_rm(seq, start, -1):
        _prefix(ctx, seq, prefix)
    return elapsed


def calibration_sizes(k_max: int) -> list[int]:
    """Verify sizes to time: every n up to 9, then doublings and their midpoints up to k_max + 1
    (interpolated between): long lookup drafts need the cost of 33 or 49 tokens, not of each n."""
    top = k_max + 1
    sizes = list(range(1, min(top, 9) + 1))
    sizes += [n for n in (12, 16, 24, 32, 48, 64) if 9 < n < top] + ([top] if top > 9 else [])
    return sizes


def calibrate(target: Context, draft: Context | None, k_max: int, reps: int = 3, seq: int = 0,
              stop: Callable[[], bool] | None = None, head: HeadDrafter | None = None) -> CostModel:
    """Time target decodes of n tokens, n in calibration_sizes(k_max) (logits for all, as in a verify step), and single
    draft tokens, after a short prefix, on a scratch sequence that is cleared afterwards. `stop()`, asked
    before each timed decode, ends it with LoadCancelled (a stop during start-up). `head`: a drafter on
    the target's own model drafts (its MTP head: its token's cost is its own to time; it never catches
    up, and it follows each target decode, which the verify times include)."""
    prefix = min(PREFIX, target.n_ctx // 4)
    k_max = min(k_max, target.n_ctx - prefix - 2)
    if target.params.n_outputs_max:  # a verify of more rows than the context was made for is refused
        k_max = min(k_max, target.params.n_outputs_max - 1)
    _prefix(target, seq, prefix)
    prefill = None
    if draft is not None:  # the draft's prefill rate (warm): what catching up with a prompt costs it
        _prefix(draft, seq, prefix)
        t = time.perf_counter()
        _prefix(draft, seq, prefix)
        draft.synchronize()
        prefill = (time.perf_counter() - t) / prefix
    sizes = calibration_sizes(k_max)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(reps):  # every size once per round: a machine that speeds up or slows down meanwhile
        for n in sizes:    # shifts all sizes alike, not the last few
            if stop is not None and stop():
                raise LoadCancelled("calibration stopped")
            times[n].append(_time_decode(target, seq, prefix, n, prefix))
    costs = CostModel({n: statistics.median(t) for n, t in times.items()})
    if head is not None:
        costs.draft = head.time_token(seq, prefix, reps * 2)
    if draft is not None:
        costs.draft = statistics.median(_time_decode(draft, seq, prefix, 1, prefix) for _ in range(reps * 2))
        costs.draft_prefill = prefill
    for ctx in [target] + ([draft] if draft else []):
        ctx.seq_rm(seq, 0, -1)
    return costs
