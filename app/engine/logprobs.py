"""The target's log-probabilities at an emitted token: log-softmax of its raw logits (before any
sampling transform, as OpenAI reports them), the token's own and the `n_top` most likely. With
speculation they come from the verify decode's rows, the same logits that chose the token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # OpenAI's top_logprobs bound


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, logprob), most likely first


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    x = logits.astype(np.float64)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    top: list[tuple[int, float]] = []
    if n_top > 0:
        idx = np.argpartition(-x, n_top - 1)[:n_top]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return TokenLogprob(token, float(x[token] - lse), top)
