"""The drafter interface: `Draft`, `Ask`, the `Drafter` protocol every drafter meets, `DrafterBase`'s defaults."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine.sampling import SamplingParams


@dataclass
class Why:
    """Why a drafter drafted as many tokens as it did, for the step record: the acceptance it
    expected, the speed it expected relative to plain decoding, in words."""

    alpha: float | None = None
    gain: float | None = None
    reason: str = ""


@dataclass
class Draft:
    tokens: list[int]
    q: list[np.ndarray] | None = None  # the distributions the tokens were drawn from (rejection sampling)
    source: str = ""  # which drafter proposed them
    match_len: int = 0  # prompt lookup: the n-gram length that matched; suffix: the match depth
    support: int = 0  # suffix: the earlier occurrences behind the first token
    why: Why | None = None  # the drafter's estimate behind the length, where it made one
    seconds: float | None = None  # the time proposing it took, when it was proposed alone


@dataclass
class Ask:
    """One sequence's request for a draft in a step (see Drafter.propose)."""

    seq: int
    history: Sequence[int]
    k: int
    sampling: SamplingParams | None = None
    rng: np.random.Generator | None = None


class Drafter(Protocol):
    """Everything the engine calls on a drafter. `DrafterBase` gives the optional parts defaults."""

    name: str

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        """A new request starts on this sequence (drafters that keep estimates per request reset
        them). `partition` names whose text it is (the API key): drafters that learn from earlier
        requests draw only on the same partition's; None: the request neither draws on nor joins them."""
        ...

    def finish_request(self, seq: int, history: Sequence[int]) -> None:
        """The sequence's request ended with this history (prompt and everything generated)."""
        ...

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None,
                rng: np.random.Generator | None) -> Draft:
        """Up to k tokens that may follow `history`. `sampling` is given for rejection sampling:
        then tokens are drawn from the drafter's own distribution, returned in `q`."""
        ...

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        """One step's drafts for every sequence, in the order asked (they share one verify decode, so
        a drafter may choose their lengths together)."""
        ...

    def prefill(self, seq: int, prompt: Sequence[int], done: int) -> None:
        """The target has evaluated the prompt's first `done` tokens for this sequence: a drafter with
        a cache of its own may evaluate them too, so its first draft need not catch up with the
        whole prompt at once (that would hold every other slot's step)."""
        ...

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        """Told after verification how many of the draft's tokens the target kept."""
        ...

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        """Sequence `dst` now starts with `src`'s first len(prefix) cached tokens."""
        ...

    def release(self, seq: int) -> None:
        """Forget a sequence (its slot is free)."""
        ...

    def saved_state(self, seq: int) -> object | None:
        """What the drafter keeps of a sequence when its prompt is saved to host memory (None: nothing;
        a drafter that catches up by itself keeps nothing). Its `nbytes` counts against the bound."""
        ...

    def restore_state(self, seq: int, state: object) -> None:
        """A saved prompt came back on `seq`, with what `saved_state` kept of it."""
        ...

    def host_bytes(self) -> int:
        """Host memory the drafter's bounded caches hold (an index of earlier requests)."""
        ...


class HeadDrafter(Drafter, Protocol):
    """A drafter that runs on the target's own model (its MTP head; EAGLE-3 and DFlash read the same
    hidden states): a context of its own, kept in step with the target's decodes."""

    draft_seconds: float  # in llama.cpp, drafting
    depth_bands: tuple[int, ...]  # context depths where its acceptance is measured apart (its fall with depth)

    @property
    def context(self):
        """Its own context (closed before the target's)."""
        ...

    def follow(self, on: bool) -> None:
        """Follow the target's decodes from now on, or stop (and forget what it followed)."""
        ...

    def time_token(self, seq: int, prefix: int, reps: int) -> float:
        """The median seconds of one drafted token after `prefix` tokens on `seq` (calibration)."""
        ...

    def propose_many(self, asks: Sequence[Ask], worths: Sequence | None = None) -> list[Draft]:
        """Every sequence's draft in one decode per draft step (the controller's `worths` may end
        each early)."""
        ...

    def close(self) -> None:
        ...


class DrafterBase:
    """Defaults for the optional parts of `Drafter`: nothing to reset or share, and each sequence's
    draft proposed on its own (and timed on its own)."""

    name = "drafter"

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        pass

    def finish_request(self, seq: int, history: Sequence[int]) -> None:
        pass

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        raise NotImplementedError

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        out = []
        for a in asks:
            t = time.perf_counter()
            d = self.propose(a.seq, a.history, a.k, a.sampling, a.rng) if a.k > 0 else Draft([])
            d.seconds = time.perf_counter() - t
            out.append(d)
        return out

    def prefill(self, seq: int, prompt: Sequence[int], done: int) -> None:
        pass

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        pass

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        pass

    def release(self, seq: int) -> None:
        pass

    def saved_state(self, seq: int) -> object | None:
        return None

    def restore_state(self, seq: int, state: object) -> None:
        pass

    def host_bytes(self) -> int:
        return 0
