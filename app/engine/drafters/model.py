"""A small GGUF model with its own context as the drafter."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial

import numpy as np

from app.engine import kv
from app.engine.accept import draw
from app.engine.checkpoints import Checkpoints
from app.engine.drafters.base import Draft, DrafterBase
from app.engine.drafters.worth import DraftWorth
from app.engine.sampling import SamplingParams, TokenSampler
from app.llama.context import Context, DecodeError


def top_probability(logits: np.ndarray, top: float | None = None) -> float:
    """Softmax probability of the argmax: one float32 exp over the vocabulary, no normalised copy."""
    m = float(logits.max()) if top is None else top
    return 1.0 / float(np.exp(logits - np.float32(m)).sum(dtype=np.float64))


def below_p_min(logits: np.ndarray, p_min: float, k: int = 10) -> bool:
    """Is the argmax's probability among the k most likely tokens below p_min, as llama.cpp's drafts
    measure it (a top-k 10 sampler's candidates, normalised over those)? Its probability over the
    whole vocabulary is never larger, so the partition (1.4 ms at 248K rows, against 0.24 ms for the
    softmax) runs only for a token that may end the draft."""
    if top_probability(logits) >= p_min:
        return False
    top = np.partition(logits, -k)[-k:].astype(np.float64)
    return 1.0 / float(np.exp(top - top.max()).sum()) < p_min


class DraftSamplers:
    """Per sequence, the sampler a draft's tokens are drawn with under rejection sampling: the
    request's, less penalties and grammar (their state follows the target's history; a draft token
    the grammar forbids has p = 0 and is rejected)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._of: dict[int, tuple[SamplingParams, TokenSampler]] = {}

    def get(self, seq: int, sampling: SamplingParams) -> TokenSampler:
        have = self._of.get(seq)
        if have is None or have[0] != sampling:
            have = (sampling, TokenSampler(sampling.model_copy(update={"repeat_penalty": 1.0, "frequency_penalty": 0.0,
                                                                       "presence_penalty": 0.0, "grammar": None}),
                                           self.n_vocab))
            self._of[seq] = have
        return have[1]

    def forget(self, seq: int) -> None:
        self._of.pop(seq, None)


def pick(logits: np.ndarray, draft: Draft, sampler: TokenSampler | None, rng: np.random.Generator | None,
         worth: DraftWorth | None = None) -> int | None:
    """The next draft token from the drafter's logits, appended to `draft`: the argmax (None where
    `worth` says it is not worth verifying), or under rejection sampling a draw from the drafter's
    own distribution, kept in `draft.q`."""
    if sampler is None:
        token = int(np.argmax(logits))
        # the top probability costs an exp over the vocabulary: only when used
        if worth is not None and not worth.keep(top_probability(logits, float(logits[token]))):
            return None
    else:
        q = sampler.probs(logits)
        token = draw(q, rng)
        draft.q.append(q)
    draft.tokens.append(token)
    return token


class ModelDrafter(DrafterBase):
    """A small GGUF model with its own context; its cache follows each sequence's history."""

    name = "draft-model"

    def __init__(self, ctx: Context, halt: threading.Event | None = None,
                 checkpoints: Checkpoints | None = None) -> None:
        self.ctx = ctx
        # a recurrent / sliding-window draft goes back to an earlier prefix through these, as the target does
        self.checkpoints = checkpoints or Checkpoints(ctx, 0, 0)
        self.halt = halt or threading.Event()  # the engine's: set, a catch-up over a long prompt stops at its next chunk
        self.decodes = 0  # the decodes the last `propose` ran (a catch-up counts one)
        self.window = ctx.model.swa_window
        self.cached: dict[int, list[int]] = {}
        self._growth = kv.Growth()  # cached[:known] == history[:known]: compared only past it
        self._samplers = DraftSamplers(ctx.model.n_vocab)


    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None, worth: DraftWorth | None = None) -> Draft:
        """Up to k tokens; a greedy draft given `worth` ends at its first token not worth verifying."""
        draft = Draft([], [] if sampling is not None else None, source=self.name)
        self.decodes = 0
        if k <= 0:
            return draft
        cached = self.cached.setdefault(seq, [])
        known = min(self._growth.unchanged(seq, history), len(cached))
        n = kv.sync(self.ctx, seq, cached, history, self.window, need_logits=True, known=known,
                    checkpoints=self.checkpoints)
        # a catch-up over a prompt is checkpointed as the target's evaluation is; a step's few tokens not
        evaluate = self.checkpoints.evaluate if len(history) - n > self.ctx.params.n_ubatch else partial(kv.evaluate, self.ctx)
        try:
            idx = evaluate(seq, history, n, logits_last=True, stop=self.halt.is_set)
        except kv.Interrupted as e:  # halted while catching up: no draft, the cache keeps what it evaluated
            cached.extend(history[len(cached): e.done])
            return draft
        except DecodeError:  # the draft's pool is full: no draft this step (the target goes on alone)
            self._resync(seq, history)
            return draft
        self.decodes = int(n < len(history))
        cached.extend(history[len(cached):])  # sync left cached == history[:n]; the rest is now evaluated
        self._growth.see(seq, history)
        sampler = self._samplers.get(seq, sampling) if sampling is not None else None
        worth = worth if sampler is None else None
        pos = len(history)
        for j in range(k):
            token = pick(self.ctx.logits(idx), draft, sampler, rng, worth)
            if token is None or j == k - 1 or (worth is not None and not worth.go_on(draft.tokens)):
                break
            b = self.ctx.batch
            b.clear()
            idx = b.add(token, pos, seq, True)
            try:
                self.decodes += 1
                self.ctx.decode(b)
            except DecodeError:
                self._resync(seq, history)
                break
            cached.append(token)
            pos += 1
        return draft

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        self.checkpoints.new_prompt(seq)

    def prefill(self, seq: int, prompt: Sequence[int], done: int) -> None:
        """Follow the target's evaluation of a prompt, chunk for chunk (checkpointed where the
        target's is): the first draft then has only the prompt's last token to catch up with."""
        cached = self.cached.setdefault(seq, [])
        n = kv.sync(self.ctx, seq, cached, prompt, self.window, need_logits=True, checkpoints=self.checkpoints)
        if n >= done:
            return
        try:
            self.checkpoints.evaluate(seq, prompt, n, logits_last=False, end=min(done, len(prompt) - 1))
        except DecodeError:  # the draft's pool is full: the first draft catches up (or drafts nothing)
            self._resync(seq, prompt)
            return
        cached.extend(prompt[n: min(done, len(prompt) - 1)])
        self._growth.forget(seq)

    def behind(self, seq: int, history: Sequence[int]) -> int:
        """Tokens of `history` this sequence's cache has not evaluated (what the next draft must catch
        up with first: the whole prompt, at a request's first draft)."""
        return max(len(history) - len(self.cached.get(seq, ())), 0)

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        """`dst` starts from what `src`'s cache holds of `prefix` (shared cells, nothing copied)."""
        if not self.ctx.shares_cells:
            return
        n = kv.common_prefix(self.cached.get(src, []), prefix)
        if n == 0:
            return
        self.ctx.seq_rm(dst, 0, -1)
        self.ctx.seq_cp(src, dst, 0, n)
        self.cached[dst] = list(prefix[:n])
        self._growth.forget(dst)

    def _resync(self, seq: int, history: Sequence[int]) -> None:
        """After a refused decode: keep only what the cache surely holds."""
        n = kv.truncate(self.ctx, seq, min(self.ctx.pos_max(seq) + 1, len(history)), self.window, self.checkpoints)
        self.cached[seq] = list(history[:n])

    def host_bytes(self) -> int:
        return self.checkpoints.nbytes

    def release(self, seq: int) -> None:
        self.cached.pop(seq, None)
        self._growth.forget(seq)
        self._samplers.forget(seq)
        self.checkpoints.drop(seq)
        self.ctx.seq_rm(seq, 0, -1)
