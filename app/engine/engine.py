"""The speculative decoding engine: one target context, one drafter, several slots.

A step, for every active slot at once:
    draft     the drafter proposes up to k tokens after the slot's history
    verify    one target decode of [last token + drafts] for all slots, logits at those positions
    accept    keep the agreeing prefix (greedy / sample-and-match / rejection, see accept.py),
              plus one token of the target's own
    roll back drop the target's cache past what was kept; the drafter follows on its next call
With k = 0 the same step is plain decoding and the drafter does no work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, Field

from app.engine import kv
from app.engine.accept import (
    Accepted,
    accept_by_match,
    accept_by_rejection,
    accept_greedy,
    draw,
)
from app.engine.checkpoints import Checkpoints
from app.engine.drafters.base import Ask, Draft, Drafter
from app.engine.logprobs import MAX_TOP, token_logprob
from app.engine.records import RequestRecord, StepRecord
from app.engine.sampling import SamplingParams, TokenSampler
from app.engine.saved import Saved, SavedPrompts
from app.errors import SpecdeckError
from app.llama.context import Context


class ContextOverflow(SpecdeckError):
    """The prompt (plus what must be generated) does not fit the context."""


class PoolBusy(SpecdeckError):
    """The shared KV pool is held by requests in flight: this one must wait."""


class Interrupted(SpecdeckError):
    """The prompt's evaluation was stopped between two chunks (the engine halting, or the request
    cancelled); what was evaluated stays in the slot's cache as a reusable prefix."""


class SpecParams(BaseModel):
    enabled: bool = True
    n_max: int = Field(8, ge=0, le=64)
    mode: Literal["match", "rejection"] = "match"

    @property
    def k(self) -> int:
        return self.n_max if self.enabled else 0


class Request(BaseModel):
    prompt: list[int]
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

    @property
    def total(self) -> int:
        return len(self.request.prompt)

    @property
    def left(self) -> int:
        return self.total - self.done


def _top2(logits: np.ndarray) -> tuple[int, float]:
    i = int(np.argmax(logits))
    top = float(logits[i])
    second = float(np.partition(logits, -2)[-2])
    return i, top - second


class CostObserver(Protocol):
    """Told the time of each verify decode (n tokens in the batch): the controller's cost model."""

    def observe_verify(self, n: int, seconds: float) -> None: ...


class Engine:
    def __init__(self, target: Context, drafter: Drafter | None, n_slots: int, draft_limit: int | None = None,
                 costs: CostObserver | None = None, saved_bytes: int = 0, halt: threading.Event | None = None,
                 checkpoints: Checkpoints | None = None) -> None:
        self.target = target
        # set when the engine must stop: a prompt being evaluated stops at its next chunk (the drafter
        # built with the same event stops catching up), so its thread leaves llama.cpp within a chunk
        self.halt = halt or threading.Event()
        self.drafter = drafter
        self.costs = costs  # told the time of every verify decode (the controller's cost model learns from them)
        self.n_vocab = target.model.n_vocab
        self.window = target.model.swa_window
        self.slots = [Slot(i) for i in range(n_slots)]
        # prompts whose slot was taken by another request, kept in host memory (0 bytes: none): a
        # conversation that comes back gets its cache back with one copy
        self.saved = SavedPrompts(saved_bytes)
        # partial states of a recurrent / sliding-window cache that let a slot go back to an earlier
        # prefix (none kept for a cache that can simply be cut back)
        self.checkpoints = checkpoints or Checkpoints(target, 0, 0)
        target.clear()  # the engine owns the context from here: its slots' records are the truth
        # recurrent / hybrid models can roll back only as many tokens as they keep snapshots for
        self.draft_limit = draft_limit if draft_limit is not None else 64
        if target.model.is_recurrent:
            self.draft_limit = min(self.draft_limit, target.params.n_rs_seq)
        if drafter is not None and target.model.is_recurrent and not can_roll_back(target):
            raise SpecdeckError(
                f"{target.model.path.name} has recurrent layers and this context cannot roll them back "
                f"(n_rs_seq {target.params.n_rs_seq}; llama.cpp keeps rollback snapshots only for some "
                f"architectures): serve it without speculation")

    def host_cache_bytes(self) -> int:
        """Host memory the bounded caches hold: saved prompts and the drafter's index. Designed growth,
        up to their bounds, that a memory alert must not take for a leak."""
        return self.saved.nbytes + self.checkpoints.nbytes + (self.drafter.host_bytes() if self.drafter is not None else 0)

    # -- a request's life ---------------------------------------------------------------------

    def start(self, slot: Slot, req: Request, cancelled: Callable[[], bool] | None = None) -> StepRecord:
        """Evaluate the prompt (reusing the cached prefix) and sample the first token; returns the
        first step's record (which may already finish the request). Between the prompt's chunks the
        evaluation stops with Interrupted when the engine halts or `cancelled()` says so."""
        p = self.begin(slot, req)
        while True:
            if self.halt.is_set() or (cancelled is not None and cancelled()):
                raise self.abandon(p)
            rec = self.advance(p, self.target.params.n_ubatch)
            if rec is not None:
                return rec

    def begin(self, slot: Slot, req: Request) -> Prefill:
        """Make the slot's cache a prefix of the prompt (its own, another slot's, a saved copy) and hold
        room for the rest; the evaluation then goes `advance` by `advance`. PoolBusy: requests in
        flight hold the pool (see `fits`)."""
        if not req.prompt:
            raise SpecdeckError("empty prompt")
        if len(req.prompt) >= self.target.n_ctx:
            raise ContextOverflow(f"prompt of {len(req.prompt):,} tokens does not fit the context of {self.target.n_ctx:,}")
        t0 = time.perf_counter()
        if slot.owner != req.owner:  # another owner's cache: never a prefix for this request
            self._save(slot, [])
            self._drop(slot)
            slot.owner = req.owner
        else:
            self._save(slot, req.prompt)
        self._reuse(slot, req.prompt)
        self._make_room(slot, len(req.prompt) - slot.shared)
        n = kv.sync(self.target, slot.id, slot.cached, req.prompt, self.window, need_logits=True,
                    checkpoints=self.checkpoints)
        self.checkpoints.new_prompt(slot.id)
        self._shrunk(slot)
        slot.prefill = Prefill(slot, req, n, n, t0)
        return slot.prefill

    def fits(self, slot: Slot, req: Request) -> bool:
        """Could the prompt start on this slot now? No, where the requests in flight (generating or
        evaluating a prompt) hold so much of the pool that the rest is too small for it, even with
        every idle cache moved out; cells it could share with a busy slot's prefix count as held."""
        busy = [s for s in self.slots if s is not slot and (s.request is not None or s.prefill is not None)]
        held = sum(self._cells(s) for s in busy)
        shared = 0
        if self.target.shares_cells:
            shared = max((kv.common_prefix(s.cached, req.prompt) for s in busy if s.owner == req.owner), default=0)
        return self.target.n_ctx - held >= len(req.prompt) - min(shared, len(req.prompt) - 1)

    def advance(self, p: Prefill, budget: int) -> StepRecord | None:
        """Evaluate up to `budget` more tokens of the prompt (in chunks of n_ubatch); once it is all in,
        sample the first token and return the first step's record, else None."""
        slot, prompt = p.slot, p.request.prompt
        end = min(p.total, p.done + max(1, budget))
        t = time.perf_counter()
        try:
            idx = self.checkpoints.evaluate(slot.id, prompt, p.done, logits_last=True, end=end)
        except BaseException:  # llama.cpp refused a chunk (or worse): the cache back to slot.cached, the slot free
            slot.cached = prompt[: kv.truncate(self.target, slot.id, p.done, self.window, self.checkpoints)]
            self._shrunk(slot)
            slot.prefill = None
            raise
        slot.cached.extend(prompt[p.done: end])
        p.done, p.t_eval = end, p.t_eval + time.perf_counter() - t
        if self.drafter is not None and p.request.speculative.k > 0:
            self.drafter.prefill(slot.id, prompt, end)
        return self._started(p, idx) if end == p.total else None

    def abandon(self, p: Prefill) -> Interrupted:
        """Stop a prompt between its chunks: the slot is free, and what was evaluated stays in its cache
        as a reusable prefix. Returns the error that says how far it got."""
        p.slot.prefill = None
        return Interrupted(f"the prompt's evaluation stopped after {p.done:,} of {p.total:,} tokens")

    def _started(self, p: Prefill, idx: int) -> StepRecord:
        """The prompt is in: the request starts generating with its first token."""
        slot, req = p.slot, p.request
        slot.prefill = None
        sampler = TokenSampler(req.sampling, self.n_vocab, self.target.model.vocab)  # a bad grammar: the slot stays free
        if slot.sampler is not None:
            slot.sampler.close()
        slot.sampler = sampler
        slot.request, slot.generated = req, 0
        if self.drafter is not None:
            self.drafter.begin_request(slot.id, req.partition)
        slot.record = RequestRecord(prompt_tokens=len(req.prompt), reused_tokens=p.reused)
        slot.rng = np.random.default_rng(req.sampling.seed)
        slot.tokens = list(req.prompt)
        if req.max_tokens == 0:  # only the prompt: its cache stays for the request that follows
            slot.record.t_prompt, slot.record.ttft = p.t_eval, time.perf_counter() - p.t0
            return StepRecord.undrafted(slot.id, [], slot.record.t_prompt, "length")
        first = self._first_token(slot, idx)
        trace = _top2(self.target.logits(idx)) if req.trace else None
        slot.tokens = list(req.prompt) + [first]
        slot.generated = 1
        slot.record.t_prompt, slot.record.ttft = p.t_eval, time.perf_counter() - p.t0
        slot.record.completion.append(first)
        rec = StepRecord.undrafted(slot.id, [first], slot.record.t_prompt)
        if trace:
            rec.target_argmax, rec.top2_gap = [trace[0]], [trace[1]]
        if req.logprobs is not None:
            rec.logprobs = [token_logprob(self.target.logits(idx), first, req.logprobs)]
            slot.record.logprobs += rec.logprobs
        if first in req.stop_tokens:
            rec.finish_reason = "stop"
        elif req.max_tokens <= 1:
            rec.finish_reason = "length"
        return rec

    BORROW_MIN = 32  # tokens: sharing a shorter prefix than this is not worth dropping the slot's own

    def _reuse(self, slot: Slot, prompt: list[int]) -> None:
        """Where another slot of the same owner (busy or idle) or a saved copy holds a longer prefix of
        this prompt than the slot's own cache (a coding tool resends the file while its last request
        still streams; a conversation comes back after its slot served others), start from the one
        holding the most."""
        own = kv.common_prefix(slot.cached, prompt)
        donor = self._donor(slot, prompt, own)
        saved = self._saved_prefix(prompt, slot.owner, max(own, donor[1] if donor else 0))
        if saved is not None:
            self._restore(slot, saved)
        elif donor is not None:
            self._borrow(slot, prompt, *donor)

    def _donor(self, slot: Slot, prompt: list[int], own: int) -> tuple[Slot, int] | None:
        """The other slot of the same owner holding the longest prefix of the prompt, and how much,
        where that beats the slot's own cache by BORROW_MIN tokens (only where cells can be shared)."""
        if not self.target.shares_cells:
            return None
        donor, n = max(((s, kv.common_prefix(s.cached, prompt)) for s in self.slots
                        if s is not slot and s.owner == slot.owner), key=lambda x: x[1], default=(None, 0))
        n = min(n, len(prompt) - 1)
        if donor is None or n < max(own + 1, self.BORROW_MIN):
            return None
        return donor, n

    def _saved_prefix(self, prompt: list[int], owner: str, beat: int) -> Saved | None:
        """The saved copy of this owner's that holds the longest prefix of the prompt, where that beats
        `beat` tokens by BORROW_MIN. Sliding-window and recurrent state cannot go back into a copy:
        there only a copy the prompt extends whole (or but for its last token) is worth loading."""
        hit = self.saved.best(owner, prompt)
        if hit is None:
            return None
        entry, n = hit
        n = min(n, len(prompt) - 1)
        if not self.target.shares_cells and n < len(entry.tokens) - 1:  # only as far back as a checkpoint
            n = max((c.n for c in entry.checkpoints if c.n <= n), default=0) if self.checkpoints.enabled else 0
        if n < beat + self.BORROW_MIN:
            return None
        return entry

    def _save(self, slot: Slot, prompt: list[int]) -> None:
        """Before this prompt replaces what the slot's cache holds (all of it but the common prefix),
        keep a copy in host memory, unless another slot or a saved copy holds it already."""
        n = len(slot.cached)
        if not self.saved.max_bytes or n - kv.common_prefix(slot.cached, prompt) < self.BORROW_MIN:
            return
        if self.target.shares_cells and any(s is not slot and s.owner == slot.owner
                                            and kv.common_prefix(s.cached, slot.cached) == n for s in self.slots):
            return
        if not self.saved.covers(slot.owner, slot.cached):
            self.saved.add(slot.owner, slot.cached, self.target.save_seq(slot.id), slack=self.BORROW_MIN,
                           checkpoints=self.checkpoints.of(slot.id))

    def _restore(self, slot: Slot, entry: Saved) -> None:
        """The slot's cache becomes a saved copy (one copy into free cells of the pool); where the pool
        has no room for it, the slot starts empty."""
        self.saved.touch(entry)
        self._drop(slot)
        need = len(entry.tokens)
        if self._free_cells(need, keep={slot.id}, mine=slot) >= need and self.target.load_seq(slot.id, entry.data):
            slot.cached = list(entry.tokens)
            self.checkpoints.give(slot.id, entry.checkpoints)

    def _drop(self, slot: Slot) -> None:
        """Empty a slot's cache (the target's, and the drafter's state for it)."""
        self.target.seq_rm(slot.id, 0, -1)
        self.checkpoints.drop(slot.id)
        slot.cached = []
        self._shrunk(slot)
        if self.drafter is not None:
            self.drafter.release(slot.id)

    def _borrow(self, slot: Slot, prompt: list[int], donor: Slot, n: int) -> None:
        """The slot shares the donor's cells for the prompt's first n tokens. In a unified KV cache the
        cells are only tagged with both sequences, nothing is copied, and a later rollback of either
        sequence leaves the other's tags alone."""
        self.target.seq_rm(slot.id, 0, -1)
        self.target.seq_cp(donor.id, slot.id, 0, n)
        slot.cached = list(prompt[:n])
        slot.lender, slot.shared = donor.id, n
        if self.drafter is not None:
            self.drafter.release(slot.id)
            self.drafter.share_prefix(donor.id, slot.id, prompt[:n])

    def _shrunk(self, slot: Slot) -> None:
        """The slot's cache was cut back: the cells it shared with a lender, or lent to others, go no
        further than what it still holds (cells evaluated again later are its own)."""
        n = len(slot.cached)
        slot.shared = min(slot.shared, n)
        if slot.shared == 0:
            slot.lender = None
        for s in self.slots:
            if s.lender == slot.id:
                s.shared = min(s.shared, n)
                if s.shared == 0:
                    s.lender = None

    def _cells(self, s: Slot) -> int:
        """The pool cells a slot holds that no other slot counts: its cache (a prompt being evaluated
        holds its whole length), less the prefix it shares with its lender."""
        held = len(s.prefill.request.prompt) if s.prefill is not None else len(s.cached)
        return held - s.shared

    def _make_room(self, slot: Slot, need: int) -> None:
        """Room for `need` cells on `slot` (besides what the other slots hold), else PoolBusy."""
        if self._free_cells(need, keep={slot.id}, mine=slot) < need:
            raise PoolBusy(f"the context pool ({self.target.n_ctx:,} tokens) is held by requests in flight")

    def _free_cells(self, need: int, keep: set[int], mine: Slot | None = None) -> int:
        """The slots share one KV pool: idle slots' cached prompts (never those in `keep`, nor a prompt
        being evaluated) go to host memory, in slot order, until `need` cells are free; returns the
        cells free (not counting `mine`'s own cache; a prefix two slots share counts once)."""
        def free() -> int:
            return self.target.n_ctx - sum(self._cells(s) for s in self.slots if s is not mine)

        for s in self.slots:
            if free() >= need:
                break
            if s.id not in keep and s.request is None and s.prefill is None and s.cached:
                self._save(s, [])
                self._drop(s)
        return free()

    def _budget(self, slots: Sequence[Slot], ks: dict[int, int]) -> list[Slot]:
        """Fit this step in the shared pool: each slot needs one cell for its next token and one per
        drafted token. Drafts shrink first; slots that cannot get a single cell are returned (their
        requests end at the context limit) and ks is cut to what fits."""
        free = self._free_cells(sum(1 + k for k in ks.values()), keep={s.id for s in slots})
        starved = list(slots[max(0, free):])
        left = max(0, free) - (len(slots) - len(starved))
        for s in slots:
            if s in starved:
                ks[s.id] = 0
                continue
            ks[s.id] = min(ks[s.id], left)
            left -= ks[s.id]
        return starved

    def _first_token(self, slot: Slot, idx: int) -> int:
        req = slot.request
        assert req is not None and slot.sampler is not None
        if req.sampling.plain_argmax:
            token = int(np.argmax(self.target.logits(idx)))
            slot.sampler.accept(token)
            return token
        if req.speculative.mode == "rejection" and req.speculative.k > 0:
            token = draw(slot.sampler.probs(self.target.logits(idx)), slot.rng)
            slot.sampler.accept(token)
            return token
        return slot.sampler.sample(self.target.ptr, idx)

    def finish(self, slot: Slot, reason: str) -> RequestRecord:
        assert slot.record is not None
        slot.record.finish_reason = reason
        if self.drafter is not None:
            self.drafter.finish_request(slot.id, slot.tokens)
        record, slot.request = slot.record, None
        return record

    # -- one step for several slots -----------------------------------------------------------

    def _k_for(self, slot: Slot) -> int:
        req = slot.request
        assert req is not None
        room = self.target.n_ctx - len(slot.tokens) - 1
        left = req.max_tokens - slot.generated - 1
        return max(0, min(req.speculative.k, self.draft_limit, room, left)) if self.drafter else 0

    def step(self, slots: Sequence[Slot]) -> list[StepRecord]:
        """One speculative step for every slot given: draft, one batched verify, accept, roll back."""
        ks = {s.id: self._k_for(s) for s in slots}
        ended, slots = self._drop_starved(slots, ks)
        drafts, t_draft = self._draft(slots, ks)
        if not slots:
            return ended
        rows, t_verify = self._verify_decode(slots, drafts)
        return ended + [self._keep(s, drafts[s.id], rows[s.id], ks[s.id], t_draft[s.id], t_verify) for s in slots]

    def _drop_starved(self, slots: Sequence[Slot], ks: dict[int, int]) -> tuple[list[StepRecord], list[Slot]]:
        """Slots the KV pool has no room for end with "context"; the others go on."""
        starved = self._budget(slots, ks)
        ended = [StepRecord.undrafted(s.id, [], finish_reason="context") for s in starved]
        return ended, [s for s in slots if s not in starved]

    def _verify_decode(self, slots: Sequence[Slot], drafts: dict[int, Draft]) -> tuple[dict[int, list[int]], float]:
        """Every slot's last token and draft in one target decode: the logits rows of each, and the
        decode's time per slot."""
        t = time.perf_counter()
        batch = self.target.batch
        batch.clear()
        rows: dict[int, list[int]] = {}
        for s in slots:
            if len(s.tokens) + len(drafts[s.id].tokens) > self.target.n_ctx:
                raise ContextOverflow(f"slot {s.id} is out of context ({self.target.n_ctx:,} tokens)")
            base = len(s.tokens) - 1
            seq = [s.tokens[-1]] + drafts[s.id].tokens
            rows[s.id] = [batch.add(tok, base + j, s.id, True) for j, tok in enumerate(seq)]
        self.target.decode(batch)
        t_verify = time.perf_counter() - t
        if self.costs is not None:  # costs follow real steps (n tokens, any slots)
            self.costs.observe_verify(len(batch), t_verify)
        return rows, t_verify / max(1, len(slots))

    def _keep(self, s: Slot, d: Draft, rows: list[int], k: int, t_draft: float, t_verify: float) -> StepRecord:
        """Accept the agreeing prefix of one slot's draft, roll the cache back past it, record the step."""
        t = time.perf_counter()
        acc, argmax, gaps = self._accept(s, d, rows)
        base = len(s.tokens) - 1
        keep = base + 1 + acc.n_accepted  # positions [0, keep) stay in the cache
        if not self.target.seq_rm(s.id, keep, -1):
            raise SpecdeckError(f"llama.cpp could not roll slot {s.id} back to {keep}")
        # the cache now holds tokens[:base] (as before the step), the last token and the kept
        # drafts; updated in place: a copy of the whole context each step is milliseconds at 110K
        del s.cached[base:]
        s.cached.append(s.tokens[-1])
        s.cached.extend(d.tokens[: acc.n_accepted])
        if self.drafter is not None and d.tokens:
            self.drafter.accepted(s.id, d, acc.n_accepted)
        rec = StepRecord(slot=s.id, tokens=acc.tokens, drafted=len(d.tokens), accepted=acc.n_accepted, k=k,
                         drafter=(d.source or self.drafter.name) if (self.drafter and d.tokens) else "none",
                         t_draft=t_draft, t_verify=t_verify, t_sample=time.perf_counter() - t,
                         target_argmax=argmax, top2_gap=gaps)
        if d.why is not None:
            rec.alpha_est, rec.expected_gain, rec.reason = d.why.alpha, d.why.gain, d.why.reason
        if s.request.logprobs is not None:  # token i was chosen from row i of the verify decode
            rec.logprobs = [token_logprob(self.target.logits(rows[i]), tok, s.request.logprobs)
                            for i, tok in enumerate(acc.tokens)]
        self._emit(s, rec)
        return rec

    def _draft(self, slots: Sequence[Slot], ks: dict[int, int]) -> tuple[dict[int, Draft], dict[int, float]]:
        """Each slot's draft (up to ks[id] tokens) and the seconds it took. Drafters that choose the
        lengths of all slots together (they share one verify decode) time the step as a whole."""
        asks = []
        for s in slots:
            req = s.request
            assert req is not None
            rejection = req.speculative.mode == "rejection" and not req.sampling.greedy
            asks.append(Ask(s.id, s.tokens, ks[s.id], req.sampling if rejection else None, s.rng))
        if self.drafter is None or not any(a.k > 0 for a in asks):
            return {s.id: Draft([]) for s in slots}, {s.id: 0.0 for s in slots}
        t = time.perf_counter()
        out = self.drafter.propose_all(asks)
        each = (time.perf_counter() - t) / len(asks)  # drafts chosen together share the time
        return ({a.seq: d for a, d in zip(asks, out)},
                {a.seq: d.seconds if d.seconds is not None else each for a, d in zip(asks, out)})

    def _accept(self, s: Slot, d: Draft, rows: list[int]) -> tuple[Accepted, list[int] | None, list[float] | None]:
        """The accept rule's verdict on the draft, and the trace of the kept tokens when asked."""
        req = s.request
        assert req is not None
        argmax, gaps = self._argmax(req, rows)
        acc = self._rule(s, d, rows, argmax)
        if not req.trace:
            return acc, None, None
        n = len(acc.tokens)
        return acc, argmax[:n], gaps[:n]

    def _argmax(self, req: Request, rows: list[int]) -> tuple[list[int] | None, list[float] | None]:
        """The target's argmax at each row where greedy acceptance or a trace needs it, and the top-two
        gaps where traced (a partial sort of the vocabulary: only when asked)."""
        if req.trace:
            pairs = [_top2(self.target.logits(i)) for i in rows]
            return [p[0] for p in pairs], [p[1] for p in pairs]
        if req.sampling.plain_argmax:
            return [int(np.argmax(self.target.logits(i))) for i in rows], None
        return None, None

    def _rule(self, s: Slot, d: Draft, rows: list[int], argmax: list[int] | None) -> Accepted:
        """Which drafted tokens the target keeps, by the request's rule (greedy, rejection sampling,
        sample-and-match); the slot's sampler is told every kept token."""
        req = s.request
        assert req is not None and s.sampler is not None
        if req.sampling.plain_argmax:
            acc = accept_greedy(d.tokens, argmax)
            for tok in acc.tokens:
                s.sampler.accept(tok)
            return acc
        if req.speculative.mode == "rejection" and d.q is not None and d.tokens:
            fed = 0  # drafts already given to the sampler: p(i) must see the kept prefix (grammar, penalties)

            def p(i: int) -> np.ndarray:
                nonlocal fed
                while fed < i:
                    s.sampler.accept(d.tokens[fed])
                    fed += 1
                return s.sampler.probs(self.target.logits(rows[i]))

            acc = accept_by_rejection(d.tokens, d.q, p, s.rng)
            for tok in acc.tokens[fed:]:
                s.sampler.accept(tok)
            return acc
        return accept_by_match(d.tokens, lambda i: s.sampler.sample(self.target.ptr, rows[i]))

    def _emit(self, s: Slot, rec: StepRecord) -> None:
        """Append the step's tokens to the slot, cut at a stop token or at max_tokens."""
        req = s.request
        assert req is not None and s.record is not None
        kept = []
        for tok in rec.tokens:
            kept.append(tok)
            s.generated += 1
            if tok in req.stop_tokens:
                rec.finish_reason = "stop"
                break
            if s.generated >= req.max_tokens:
                rec.finish_reason = "length"
                break
        rec.tokens = kept
        if rec.target_argmax is not None:
            rec.target_argmax, rec.top2_gap = rec.target_argmax[: len(kept)], rec.top2_gap[: len(kept)]
        if rec.logprobs is not None:
            rec.logprobs = rec.logprobs[: len(kept)]
        s.tokens += kept
        if rec.finish_reason is None and len(s.tokens) >= self.target.n_ctx:
            rec.finish_reason = "context"
        s.record.add(rec)

    # -- one request, start to finish -----------------------------------------------------------

    def generate(self, req: Request, slot_id: int = 0) -> Iterator[StepRecord]:
        """Yield one StepRecord per step (the first holds the first token). The caches stay
        consistent whenever the consumer stops (a closed generator runs the `finally`)."""
        slot = self.slots[slot_id]
        t0 = time.perf_counter()
        try:
            rec = self.start(slot, req)
            yield rec
            finish = rec.finish_reason
            while finish is None:
                (rec,) = self.step([slot])
                yield rec
                finish = rec.finish_reason
            slot.record.t_generate = time.perf_counter() - t0 - slot.record.t_prompt
            self.finish(slot, finish)
        finally:
            if slot.request is not None:  # stopped early (client gone, error): keep what is consistent
                slot.record.t_generate = time.perf_counter() - t0 - slot.record.t_prompt
                self.finish(slot, "cancelled")
            if self.target.pos_max(slot.id) >= len(slot.cached):  # a step broke off mid-way
                n = kv.truncate(self.target, slot.id, len(slot.cached), self.window, self.checkpoints)
                del slot.cached[n:]
                self._shrunk(slot)


def can_roll_back(ctx: Context) -> bool:
    """Can this context drop the last token of a sequence? (Recurrent state needs snapshots.)"""
    batch = ctx.batch
    batch.clear()
    batch.add(0, 0, 0, False)
    batch.add(0, 1, 0, True)
    ctx.decode(batch)
    ok = ctx.seq_rm(0, 1, -1)
    ctx.seq_rm(0, 0, -1)
    return ok

