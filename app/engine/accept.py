"""Which drafted tokens the target keeps. Pure functions over plain data.

Greedy: a drafted token is kept while it equals the target's argmax at its position; at the first
mismatch the target's argmax is emitted instead; if all k drafts are kept, the target's argmax
after the last one is a free bonus token. So every emitted token is the target's own argmax.

Sample-and-match (llama.cpp's rule): the target samples its own token at each position in turn,
from its own distribution given the kept prefix; a draft is kept while it equals that sample; the
first differing sample is emitted. Every token is a sample of the target: lossless, and with a
seeded sampler the same draws as plain decoding.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): draft token d_i, drawn from the
draft's q_i, is kept with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the
token is drawn from norm(max(0, p_i - q_i)); if all are kept the bonus is drawn from p_{k+1}.
The output is distributed exactly as p, and more drafts survive than by matching samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Accepted:
    tokens: list[int]  # what is emitted this step: the kept drafts, then one token of the target's
    n_accepted: int  # how many drafts were kept


def accept_greedy(drafts: Sequence[int], target_argmax: Sequence[int]) -> Accepted:
    """`target_argmax[i]` is the target's argmax after drafts[:i] (len = len(drafts) + 1)."""
    for i, d in enumerate(drafts):
        if d != target_argmax[i]:
            return Accepted(list(drafts[:i]) + [int(target_argmax[i])], i)
    return Accepted(list(drafts) + [int(target_argmax[len(drafts)])], len(drafts))


def accept_by_match(drafts: Sequence[int], sample: Callable[[int], int]) -> Accepted:
    """`sample(i)` draws the target's token at position i; called only while the drafts match."""
    for i, d in enumerate(drafts):
        t = sample(i)
        if t != d:
            return Accepted(list(drafts[:i]) + [t], i)
    return Accepted(list(drafts) + [sample(len(drafts))], len(drafts))


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from (unnormalised) weights p."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def accept_by_rejection(
    drafts: Sequence[int], q: Sequence[np.ndarray], p: Callable[[int], np.ndarray], rng: np.random.Generator
) -> Accepted:
    """`q[i]` is the draft's distribution d_i was drawn from; `p(i)` the target's at position i."""
    for i, d in enumerate(drafts):
        pi = p(i)
        if rng.random() * q[i][d] <= pi[d]:  # accept with probability min(1, p/q)
            continue
        residual = np.maximum(pi - q[i], 0.0)
        total = residual.sum()
        token = draw(residual, rng) if total > 0 else draw(pi, rng)
        return Accepted(list(drafts[:i]) + [token], i)
    return Accepted(list(drafts) + [draw(p(len(drafts)), rng)], len(drafts))
