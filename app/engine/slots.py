"""What a request is (its prompt, sampling and speculation) and the slot that serves it: the data the
engine's step and the prompt cache (cache.py) share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from app.engine.logprobs import MAX_TOP
from app.engine.records import RequestRecord
from app.engine.sampling import SamplingParams, TokenSampler
from app.llama.media import Picture


class SpecParams(BaseModel):
    enabled: bool = True
    n_max: int = Field(8, ge=0, le=64)
    mode: Literal["match", "rejection"] = "match"

    @property
    def k(self) -> int:
        return self.n_max if self.enabled else 0


class Request(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt: list[int]  # text token ids, and media ids where images go (media.py)
    pictures: dict[int, Picture] = {}  # the prompt's images by key
    max_tokens: int = Field(256, ge=0)  # 0: evaluate and cache the prompt, generate nothing
    sampling: SamplingParams = SamplingParams()
    speculative: SpecParams = SpecParams()
    stop_tokens: set[int] = set()
    trace: bool = False  # record the target's argmax and top-2 gap at each emitted token
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)  # record log-probabilities (and this many alternatives)
    # whose text this is (the API key's name): drafters learn across requests within it; None: this
    # request neither drafts from earlier requests nor joins them
    partition: str | None = ""
    # whose prompt this is (the API key's name): a request reuses cached prefixes only of its owner's
    # earlier requests, so no client's time to first token reveals what another client sent
    owner: str = ""


@dataclass
class Slot:
    id: int
    cached: list[int] = field(default_factory=list)  # exactly what the target's cache holds
    owner: str = ""  # whose requests the cache holds (Request.owner): only theirs reuse it
    tokens: list[int] = field(default_factory=list)  # prompt + emitted; tokens[-1] is not in the cache yet
    request: Request | None = None
    record: RequestRecord | None = None
    sampler: TokenSampler | None = None
    rng: np.random.Generator | None = None
    generated: int = 0
    prefill: Prefill | None = None  # the prompt being evaluated into this slot, chunk by chunk
    # cells the cache's first `shared` tokens share with slot `lender`'s (a borrowed prefix): counted
    # once, at the lender, when the pool's free cells are reckoned
    lender: int | None = None
    shared: int = 0


@dataclass
class Prefill:
    """A prompt on its way into a slot's cache (`Engine.begin`, then `advance` a chunk at a time):
    the scheduler interleaves its chunks with other slots' steps and can stop between them."""

    slot: Slot
    request: Request
    done: int  # the prompt's first `done` tokens are in the cache
    reused: int  # of them, those the cache held already
    t0: float = field(default_factory=time.perf_counter)
    t_eval: float = 0.0  # seconds spent evaluating
    row: int = -1  # the batch row of its last token in the decode that carried it (a step's, see Engine.step)

    @property
    def total(self) -> int:
        return len(self.request.prompt)

    @property
    def left(self) -> int:
        return self.total - self.done
