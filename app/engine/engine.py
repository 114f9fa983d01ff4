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
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine import kv
from app.engine.accept import (
    Accepted,
    accept_by_match,
    accept_by_rejection,
    accept_greedy,
    draw,
)
from app.engine.cache import PoolBusy, PromptCache
from app.engine.checkpoints import Checkpoints
from app.engine.drafters.base import Ask, Draft, Drafter
from app.engine.logprobs import token_logprob
from app.engine.records import RequestRecord, StepRecord
from app.engine.sampling import TokenSampler
from app.engine.saved import SavedPrompts
from app.engine.slots import Prefill, Request, Slot, SpecParams
from app.errors import SpecdeckError
from app.llama import media
from app.llama.context import Context, DecodeAborted
from app.llama.media import Picture
from app.llama.vision import Projector

__all__ = ["ContextOverflow", "CostObserver", "Engine", "Interrupted", "PoolBusy", "Prefill", "Request", "Slot",
           "SpecParams", "can_roll_back"]


class ContextOverflow(SpecdeckError):
    """The prompt (plus what must be generated) does not fit the context."""


class Interrupted(SpecdeckError):
    """The prompt's evaluation was stopped between two chunks (the engine halting, or the request
    cancelled); what was evaluated stays in the slot's cache as a reusable prefix."""


def _top2(logits: np.ndarray) -> tuple[int, float]:
    i = int(np.argmax(logits))
    top = float(logits[i])
    second = float(np.partition(logits, -2)[-2])
    return i, top - second


@dataclass
class RequestImages:
    """One request's images by key, their rows from the projector (kv.ImageRows)."""

    vision: Projector
    pictures: dict[int, Picture]

    @property
    def non_causal(self) -> bool:
        return self.vision.non_causal

    def rows(self, key: int) -> np.ndarray:
        return self.vision.rows(self.pictures[key])

    def width(self, key: int) -> int:
        return self.vision.width(self.pictures[key])


class CostObserver(Protocol):
    """Told the time of each verify decode (n tokens in the batch): the controller's cost model."""

    def observe_verify(self, n: int, seconds: float) -> None: ...

    def verify_cost(self, n: int) -> float: ...


class Engine:
    def __init__(self, target: Context, drafter: Drafter | None, n_slots: int, draft_limit: int | None = None,
                 costs: CostObserver | None = None, saved_bytes: int = 0, halt: threading.Event | None = None,
                 checkpoints: Checkpoints | None = None, vision: Projector | None = None) -> None:
        self.target = target
        self.vision = vision  # the target's projector: images' embedding rows (None: a text-only model)
        # set when the engine must stop: a prompt being evaluated stops at its next chunk (the drafter
        # built with the same event stops catching up), so its thread leaves llama.cpp within a chunk
        self.halt = halt or threading.Event()
        self.drafter = drafter
        self.costs = costs  # told the time of every verify decode alone (the controller's cost model learns from them)
        self.n_vocab = target.model.n_vocab
        self.slots = [Slot(i) for i in range(n_slots)]
        # the slots' prompt caches in the one KV pool (reuse, saved prompts, checkpoints, free cells)
        self.cache = PromptCache(target, self.slots, drafter, SavedPrompts(saved_bytes),
                                 checkpoints or Checkpoints(target, 0, 0))
        target.clear()  # the engine owns the context from here: its slots' records are the truth
        # recurrent / hybrid models can roll back only as many tokens as they keep snapshots for;
        # with checkpoints, a draft longer than that is verified from a checkpoint taken before it
        self.draft_limit = draft_limit if draft_limit is not None else 64
        if target.params.n_outputs_max:  # every slot's last token and draft fit the context's logits rows
            self.draft_limit = min(self.draft_limit, max(0, target.params.n_outputs_max // n_slots - 1))
        self.snapshots = target.params.n_rs_seq if target.model.is_recurrent else None
        if self.snapshots is not None and not self.cache.checkpoints.enabled:
            self.draft_limit = min(self.draft_limit, self.snapshots)
        self._replays: list[tuple[Slot, int, object]] = []  # rollbacks past the snapshots, after a verify
        if drafter is not None and target.model.is_recurrent and not self.cache.checkpoints.enabled \
                and not can_roll_back(target):
            raise SpecdeckError(
                f"{target.model.path.name} has recurrent layers and this context cannot roll them back "
                f"(n_rs_seq {target.params.n_rs_seq}; llama.cpp keeps rollback snapshots only for some "
                f"architectures): serve it without speculation")

    # -- a request's life ---------------------------------------------------------------------

    def images_of(self, req: Request) -> RequestImages | None:
        """The rows of the request's images, from the target's projector (None: no images)."""
        if not req.pictures:
            return None
        if self.vision is None:
            raise SpecdeckError("this model has no vision projector: serve it with --mmproj")
        return RequestImages(self.vision, req.pictures)

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
        n = self.cache.prepare(slot, req)
        slot.prefill = Prefill(slot, req, n, n, t0)
        return slot.prefill

    def advance(self, p: Prefill, budget: int, give_way: Callable[[], bool] | None = None) -> StepRecord | None:
        """Evaluate up to `budget` more tokens of the prompt (in chunks of n_ubatch); once it is all in,
        sample the first token and return the first step's record, else None. `give_way`: asked while
        the chunk is computed, where it can stop part way (`can_give_way`); when it says so, the chunk
        stops within milliseconds and DecodeAborted is raised with the prompt where it was."""
        slot, prompt = p.slot, p.request.prompt
        end = media.image_end(prompt, min(p.total, p.done + max(1, budget)))  # an image goes in whole
        ask = give_way if give_way is not None and self.can_give_way(p, end) else None
        t = time.perf_counter()
        try:
            with self.target.giving_way(ask):
                idx = self.cache.checkpoints.evaluate(slot.id, prompt, p.done, logits_last=True, end=end,
                                                      images=self.images_of(p.request))
        except DecodeAborted:  # it gave way: llama.cpp took the chunk's cells back; the prompt goes on later
            self.cache.truncate(slot, p.done)
            raise
        except BaseException:  # llama.cpp refused a chunk (or worse): the cache back to slot.cached, the slot free
            self._refuse_chunk(p)
            raise
        slot.cached.extend(prompt[p.done: end])
        p.done, p.t_eval = end, p.t_eval + time.perf_counter() - t
        if self.drafter is not None and p.request.speculative.k > 0:
            self.drafter.prefill(slot.id, prompt, end)
        return self._started(p, idx) if end == p.total else None

    def can_give_way(self, p: Prefill, end: int) -> bool:
        """May the prompt's chunk up to `end` stop part way? Where it is text with no checkpoint
        inside, and the cache can be cut back to where the chunk began (no recurrent state or sliding
        window, which llama.cpp cannot take back): `truncate` then undoes whatever of it went in."""
        if self.target.needs_checkpoints or self.cache.checkpoints.stops(p.total, p.done, end):
            return False
        return not media.has_media(p.request.prompt, p.done, end)

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

    def _budget(self, slots: Sequence[Slot], ks: dict[int, int]) -> list[Slot]:
        """Fit this step in the shared pool: each slot needs one cell for its next token and one per
        drafted token. Drafts shrink first; slots that cannot get a single cell are returned (their
        requests end at the context limit) and ks is cut to what fits."""
        free = self.cache.free_cells(sum(1 + k for k in ks.values()), keep={s.id for s in slots})
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
        """The slot's request ends; its cache is left holding exactly `slot.cached` (a step that broke
        off after its verify decode left more: a server closing the failed request's job, or a
        consumer that stopped, leaves no advanced recurrent state or head cache behind)."""
        assert slot.record is not None
        slot.record.finish_reason = reason
        if self.drafter is not None:
            self.drafter.finish_request(slot.id, slot.tokens)
        record, slot.request = slot.record, None
        if self.target.pos_max(slot.id) >= len(slot.cached):
            self.cache.truncate(slot, len(slot.cached))
        return record

    # -- one step for several slots -----------------------------------------------------------

    def _k_for(self, slot: Slot) -> int:
        req = slot.request
        assert req is not None
        room = self.target.n_ctx - len(slot.tokens) - 1
        left = req.max_tokens - slot.generated - 1
        return max(0, min(req.speculative.k, self.draft_limit, room, left)) if self.drafter else 0

    def step(self, slots: Sequence[Slot], ride: tuple[Prefill, int] | None = None) -> list[StepRecord]:
        """One speculative step for every slot given: draft, one batched verify, accept, roll back.
        `ride`: a prompt being evaluated and how many of its next tokens go in the same target decode
        as the verify (a mixed batch, as Sarathi-Serve's; at most `rider_room`); where that prompt is
        then all in, `ridden` gives its first record."""
        ks = {s.id: self._k_for(s) for s in slots}
        ended, slots = self._drop_starved(slots, ks)
        drafts, t_draft = self._draft(slots, ks)
        if not slots:
            return ended
        before = self._before_verify(slots, drafts)
        end = ride[0].done + ride[1] if ride is not None else 0
        try:
            rows, t_verify, last = self._verify_decode(slots, drafts, ride[0] if ride else None, end)
            kept = [self._keep(s, drafts[s.id], rows[s.id], ks[s.id], t_draft[s.id], t_verify, before.get(s.id))
                    for s in slots]
            self._replay()
        except BaseException:  # the slots' requests end (`finish` cuts each cache back to its record)
            self._replays = []
            if ride is not None:
                self._refuse_chunk(ride[0])
            raise
        if ride is not None:
            self._rode(ride[0], end, last, t_verify * len(slots))
        return ended + kept

    def unmixed_cost(self, records: Sequence[StepRecord]) -> float | None:
        """What the step that gave `records` would have cost alone, with no prompt's tokens in its batch
        nor its cells beside it: its drafting as timed, and a verify of its tokens at the cost model's
        figure. None without a cost model."""
        if self.costs is None or not records:
            return None
        return sum(r.t_draft for r in records) + self._verify_alone(records)

    def excess_cost(self, records: Sequence[StepRecord]) -> float:
        """What the (unmixed) step that gave `records` cost beyond its verify's figure alone: the part a
        prompt being read beside it added (with flash attention off, the step's attention spans the
        prompt's cells too). 0 without a cost model, and where it cost less (so a figure too high never
        gives a prompt more of the answers' time than the step's own)."""
        if self.costs is None or not records:
            return 0.0
        return max(0.0, sum(r.t_verify for r in records) - self._verify_alone(records))

    def _verify_alone(self, records: Sequence[StepRecord]) -> float:
        """The cost model's figure for a verify of the records' tokens (learnt from steps alone)."""
        return self.costs.verify_cost(sum(r.drafted + 1 for r in records))

    def reading(self) -> bool:
        """A prompt is being evaluated (its chunks go between the steps, or ride in them)."""
        return any(s.prefill is not None for s in self.slots)

    def rider_room(self, slots: Sequence[Slot], p: Prefill) -> int:
        """How many of the prompt's next tokens may go in the next step's verify decode of `slots`:
        text (an image goes through `advance`), up to the next checkpoint, and within one ubatch
        beside the verify tokens (the most the slots may draft). None on a model with recurrent
        layers: llama.cpp splits a batch by sequence for them, so nothing would be shared."""
        if self.target.model.is_recurrent or not slots:
            return 0
        room = self.target.params.n_ubatch - sum(1 + self._k_for(s) for s in slots)
        end = min(p.total, p.done + max(0, room))
        stops = self.cache.checkpoints.stops(p.total, p.done, end)
        if stops:
            end = stops[0]
        first = next(media.runs(p.request.prompt, p.done, end), None)
        return 0 if first is None or first.media else first.end - p.done

    def _before_verify(self, slots: Sequence[Slot], drafts: dict[int, Draft]) -> dict[int, object]:
        """Where a draft is longer than the recurrent state's rollback snapshots (with checkpoints on),
        the slot's partial state before the verify, to go back to if the target keeps too little."""
        if self.snapshots is None:
            return {}
        return {s.id: self.target.save_partial(s.id) for s in slots if len(drafts[s.id].tokens) > self.snapshots}

    def _replay(self) -> None:
        """Roll back past the snapshots: put the state from before the verify back, cut the attention
        cells there, and evaluate the kept tokens again (after every slot's logits were read)."""
        replays, self._replays = self._replays, []
        for s, base, state in replays:
            if not (self.target.load_partial(s.id, state) and self.target.seq_rm(s.id, base, -1)):
                raise SpecdeckError(f"llama.cpp could not roll slot {s.id} back to {base}")
            kv.evaluate(self.target, s.id, s.cached, base, logits_last=False,
                        images=self.images_of(s.request) if s.request is not None else None)

    def _drop_starved(self, slots: Sequence[Slot], ks: dict[int, int]) -> tuple[list[StepRecord], list[Slot]]:
        """Slots the KV pool has no room for end with "context"; the others go on."""
        starved = self._budget(slots, ks)
        ended = [StepRecord.undrafted(s.id, [], finish_reason="context") for s in starved]
        return ended, [s for s in slots if s not in starved]

    def _verify_decode(self, slots: Sequence[Slot], drafts: dict[int, Draft], rider: Prefill | None = None,
                       end: int = 0) -> tuple[dict[int, list[int]], float, int]:
        """Every slot's last token and draft in one target decode, and the rider's prompt tokens up to
        `end`: the logits rows of each slot, the decode's time per slot, the rider's last row (-1)."""
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
        last = -1
        if rider is not None:
            prompt = rider.request.prompt
            for pos in range(rider.done, end):
                last = batch.add(prompt[pos], pos, rider.slot.id, pos == rider.total - 1)
        self.target.decode(batch)
        t_verify = time.perf_counter() - t
        if self.costs is not None and rider is None and not self.reading():  # costs are a step's alone (n tokens, any slots)
            self.costs.observe_verify(len(batch), t_verify)
        return rows, t_verify / max(1, len(slots)), last

    def _rode(self, p: Prefill, end: int, row: int, took: float) -> None:
        """A prompt's tokens up to `end` went in a step's decode: they are in its slot's cache."""
        p.slot.cached.extend(p.request.prompt[p.done: end])
        p.done, p.t_eval, p.row = end, p.t_eval + took, row
        if end in self.cache.checkpoints.stops(p.total, end - 1, end):
            self.cache.checkpoints.take(p.slot.id, end)

    def ridden(self, p: Prefill) -> StepRecord | None:
        """After a step that carried the prompt's tokens (and before any other decode): the drafter
        follows, as after `advance`'s chunk; once the prompt is all in, its first token's record."""
        if self.drafter is not None and p.request.speculative.k > 0:
            self.drafter.prefill(p.slot.id, p.request.prompt, p.done)
        return self._started(p, p.row) if p.done == p.total else None

    def _refuse_chunk(self, p: Prefill) -> None:
        """The decode that carried a prompt's tokens failed: its cache back to what it held, its slot free."""
        p.slot.cached = p.request.prompt[: p.done]
        self.cache.truncate(p.slot, p.done)
        p.slot.prefill = None

    def _keep(self, s: Slot, d: Draft, rows: list[int], k: int, t_draft: float, t_verify: float,
              before: object | None = None) -> StepRecord:
        """Accept the agreeing prefix of one slot's draft, roll the cache back past it, record the step.
        `before`: the slot's partial state before the verify, where the snapshots may not reach back."""
        t = time.perf_counter()
        acc, argmax, gaps = self._accept(s, d, rows)
        base = len(s.tokens) - 1
        keep = base + 1 + acc.n_accepted  # positions [0, keep) stay in the cache
        if not self.target.seq_rm(s.id, keep, -1):
            if before is None:
                raise SpecdeckError(f"llama.cpp could not roll slot {s.id} back to {keep}")
            self._replays.append((s, base, before))
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
                         target_argmax=argmax, top2_gap=gaps, depth=base)
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
        out = [_text_part(d) if s.request.pictures else d for s, d in zip(slots, out)]
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
            if slot.request is not None:  # stopped early (client gone, error): `finish` keeps what is consistent
                slot.record.t_generate = time.perf_counter() - t0 - slot.record.t_prompt
                self.finish(slot, "cancelled")


def _text_part(d: Draft) -> Draft:
    """A draft up to its first image position (a lookup drafter can copy one from the history; an
    image is never a token the target could emit)."""
    cut = next((i for i, t in enumerate(d.tokens) if media.is_media(t)), None)
    if cut is None:
        return d
    d.tokens = d.tokens[:cut]
    if d.q is not None:
        d.q = d.q[:cut]
    return d


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

