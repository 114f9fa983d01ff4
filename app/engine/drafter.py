"""Drafters: anything that proposes up to k next tokens for a sequence.

One small interface, so the verify / accept / rollback code never changes when a drafter does:
`propose(seq, history, k, ...)` returns a Draft; the engine then tells nothing back: the next
`propose` call carries the sequence's new history and the drafter brings its own state in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..llama_ctx import Context
from . import kv
from .accept import draw
from .sampling import SamplingParams, TokenSampler

TOP_LOGIT_SPAN = 20.0  # exp(-20) * vocabulary is below 1e-3: ignoring those tokens barely moves p_top


@dataclass
class Draft:
    tokens: list[int]
    q: list[np.ndarray] | None = None  # the distributions the tokens were drawn from (rejection sampling)
    p_top: list[float] = field(default_factory=list)


class Drafter(Protocol):
    name: str

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None,
                rng: np.random.Generator | None) -> Draft:
        """Up to k tokens that may follow `history`. `sampling` is given for rejection sampling:
        then tokens are drawn from the drafter's own distribution, returned in `q`."""
        ...

    def release(self, seq: int) -> None:
        """Forget a sequence (its slot is free)."""
        ...


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the argmax, from the few logits near the top (no full softmax)."""
    m = float(logits.max())
    near = logits[logits > m - TOP_LOGIT_SPAN]
    return 1.0 / float(np.exp(near.astype(np.float64) - m).sum())


class ModelDrafter:
    """A small GGUF model with its own context; its cache follows each sequence's history."""

    name = "draft-model"

    def __init__(self, ctx: Context, p_min: float = 0.0, n_min: int = 0) -> None:
        self.ctx = ctx
        self.p_min = p_min
        self.n_min = n_min
        self.window = ctx.model.swa_window
        self.cached: dict[int, list[int]] = {}
        self._samplers: dict[int, tuple[SamplingParams, TokenSampler]] = {}

    def _sampler(self, seq: int, sampling: SamplingParams) -> TokenSampler:
        have = self._samplers.get(seq)
        if have is None or have[0] != sampling:
            have = (sampling, TokenSampler(sampling.model_copy(update={"repeat_penalty": 1.0, "frequency_penalty": 0.0,
                                                                       "presence_penalty": 0.0}), self.ctx.model.n_vocab))
            self._samplers[seq] = have
        return have[1]

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        draft = Draft([], [] if sampling is not None else None)
        if k <= 0:
            return draft
        cached = self.cached.setdefault(seq, [])
        n = kv.sync(self.ctx, seq, cached, history, self.window, need_logits=True)
        idx = kv.evaluate(self.ctx, seq, history, n, logits_last=True)
        cached[:] = list(history)
        sampler = self._sampler(seq, sampling) if sampling is not None else None
        pos = len(history)
        for j in range(k):
            logits = self.ctx.logits(idx)
            if sampler is None:
                token = int(np.argmax(logits))
                p = top_probability(logits)
                if j >= self.n_min and p < self.p_min:
                    break
                draft.p_top.append(p)
            else:
                q = sampler.probs(logits)
                token = draw(q, rng)
                draft.q.append(q)
            draft.tokens.append(token)
            if j == k - 1:
                break
            b = self.ctx.batch
            b.clear()
            idx = b.add(token, pos, seq, True)
            self.ctx.decode(b)
            cached.append(token)
            pos += 1
        return draft

    def release(self, seq: int) -> None:
        self.cached.pop(seq, None)
        self._samplers.pop(seq, None)
        self.ctx.seq_rm(seq, 0, -1)


class ListDrafter:
    """Proposes fixed continuations (tests): tokens[len(history):] of the longest list that extends history."""

    name = "list"

    def __init__(self, continuations: list[list[int]], q: np.ndarray | None = None) -> None:
        self.continuations = continuations
        self.q = q

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        for c in self.continuations:
            if list(c[: len(history)]) == list(history):
                toks = list(c[len(history) : len(history) + k])
                return Draft(toks, [self.q] * len(toks) if (sampling is not None and self.q is not None) else None)
        return Draft([])

    def release(self, seq: int) -> None:
        pass
