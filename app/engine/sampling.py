"""Sampling settings and llama.cpp sampler chains built from them.

Two uses:
- `TokenSampler.sample(ctx, i)`: llama.cpp's own chain (penalties, top-k, top-p, min-p,
  temperature, then a seeded draw) picks a token from the logits at batch position i and
  remembers it for the penalties. Greedy when temperature <= 0.
- `TokenSampler.probs(logits)`: the same chain without the draw, as a probability vector over the
  vocabulary (for rejection sampling, which needs p and q themselves).
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
from pydantic import BaseModel, Field

from app.errors import SpecdeckError
from app.llama.backend import capture_llama_log, init_llama

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class SamplingParams(BaseModel):
    temperature: float = Field(0.0, ge=0.0, le=10.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repeat_penalty: float = Field(1.0, ge=0.0, le=10.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    penalty_last_n: int = Field(64, ge=0)
    seed: int = Field(0, ge=0, lt=2**32)
    grammar: str | None = Field(None, description="GBNF the output must follow (root rule `root`)")
    grammar_triggers: tuple[str, ...] = Field((), description="lazy grammar: it applies from the first match of one "
                                              "of these patterns in the output (llama.cpp's trigger patterns)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def plain_argmax(self) -> bool:
        """Greedy with nothing reshaping the logits: the token is their argmax."""
        return self.greedy and not self.penalised and self.grammar is None

    @property
    def penalised(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def grammar_sampler(vocab, grammar: str, triggers: tuple[str, ...] = ()) -> llama_cpp.llama_sampler_p:
    """llama.cpp's grammar sampler for GBNF text (root rule `root`); SpecdeckError if it does not parse.
    With `triggers`, lazy: the grammar applies from the first match of a pattern in the output on."""
    init_llama()
    with capture_llama_log() as lines:
        if triggers:
            patterns = (ctypes.c_char_p * len(triggers))(*[t.encode() for t in triggers])
            ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, grammar.encode(), b"root", patterns,
                                                                     len(triggers), None, 0)
        else:
            ptr = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not ptr:
        detail = next((ln.strip() for ln in lines if "parse" in ln.lower() or "error" in ln.lower()), "")
        raise SpecdeckError(f"the grammar does not parse{': ' + detail if detail else ''}")
    return ptr


def check_grammar(vocab, grammar: str, triggers: tuple[str, ...] = ()) -> None:
    """Parse `grammar` as llama.cpp will (SpecdeckError if it does not)."""
    llama_cpp.llama_sampler_free(grammar_sampler(vocab, grammar, triggers))


def _chain(params: SamplingParams, n_vocab: int, with_draw: bool, vocab=None) -> llama_cpp.llama_sampler_p:
    init_llama()
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731
    if params.grammar is not None:
        if vocab is None:
            raise SpecdeckError("a grammar needs the model's vocabulary")
        try:
            add(grammar_sampler(vocab, params.grammar, params.grammar_triggers))
        except SpecdeckError:
            llama_cpp.llama_sampler_free(chain)
            raise
    if params.penalised:
        add(llama_cpp.llama_sampler_init_penalties(n_vocab, params.penalty_last_n, params.repeat_penalty,
                                                   params.frequency_penalty, params.presence_penalty))
    if params.greedy:
        if with_draw:
            add(llama_cpp.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(llama_cpp.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    add(llama_cpp.llama_sampler_init_temp(params.temperature))
    if with_draw:
        add(llama_cpp.llama_sampler_init_dist(params.seed))
    return chain


class TokenSampler:
    """One sequence's sampler: llama.cpp's chain plus the penalty history it keeps."""

    def __init__(self, params: SamplingParams, n_vocab: int, vocab=None) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self._draw = _chain(params, n_vocab, True, vocab)
        self._shape = _chain(params, n_vocab, False, vocab)  # the same transforms, no draw
        self._buf = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._buf["id"] = np.arange(n_vocab, dtype=np.int32)

    def sample(self, ctx_ptr, batch_index: int) -> int:
        """llama.cpp samples from the logits at `batch_index` (and records the token for penalties)."""
        token = int(llama_cpp.llama_sampler_sample(self._draw, ctx_ptr, batch_index))
        llama_cpp.llama_sampler_accept(self._shape, token)
        return token

    def accept(self, token: int) -> None:
        """Record a token chosen elsewhere (rejection sampling), so penalties see it."""
        llama_cpp.llama_sampler_accept(self._draw, token)
        llama_cpp.llama_sampler_accept(self._shape, token)

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The chain's distribution over the vocabulary (zeros where top-k / top-p / min-p cut)."""
        if self.params.greedy:
            out = np.zeros(self.n_vocab, dtype=np.float64)
            out[int(np.argmax(self._shaped_logits(logits)))] = 1.0
            return out
        shaped = self._shaped_logits(logits)
        finite = np.isfinite(shaped)
        m = shaped[finite].max()
        p = np.zeros(self.n_vocab, dtype=np.float64)
        p[finite] = np.exp(shaped[finite].astype(np.float64) - m)
        return p / p.sum()

    def _shaped_logits(self, logits: np.ndarray) -> np.ndarray:
        if self.params.plain_argmax:
            return logits
        buf = self._buf
        buf["id"] = np.arange(self.n_vocab, dtype=np.int32)
        buf["logit"] = logits
        buf["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=self.n_vocab, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._shape, ctypes.byref(arr))
        kept = buf[: arr.size]
        out = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        out[kept["id"]] = kept["logit"]
        return out

    def close(self) -> None:
        for s in ("_draw", "_shape"):
            ptr = getattr(self, s, None)
            if ptr:
                llama_cpp.llama_sampler_free(ptr)
                setattr(self, s, None)

    def __del__(self) -> None:
        self.close()
