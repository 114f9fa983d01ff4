"""The slots' prompt caches in the target's one KV pool, apart from the engine's speculative step
(as nano-vllm keeps its block manager apart from its engine step).

What a slot's cache holds (`Slot.cached`, exactly the target's cache for its sequence) and how a new
prompt gets the longest prefix it can: the slot's own cache, cut back where llama.cpp can cut it or
through a context checkpoint where it cannot (checkpoints.py); cells borrowed from another slot
holding the same prefix (a unified pool tags cells with both sequences, nothing is copied); a copy
saved in host memory when its slot was taken (saved.py). And the pool's free cells: idle slots'
caches go to host memory, in slot order, when a prompt needs their room.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.engine import kv
from app.engine.checkpoints import Checkpoints
from app.engine.drafters.base import Drafter
from app.engine.saved import Saved, SavedPrompts
from app.engine.slots import Request, Slot
from app.errors import SpecdeckError
from app.llama.context import Context


class PoolBusy(SpecdeckError):
    """The shared KV pool is held by requests in flight: this one must wait."""


class PromptCache:
    """The slots' caches: what each holds, what it reuses for a new prompt, and the pool's room."""

    BORROW_MIN = 32  # tokens: sharing a shorter prefix than this is not worth dropping the slot's own

    def __init__(self, target: Context, slots: Sequence[Slot], drafter: Drafter | None, saved: SavedPrompts,
                 checkpoints: Checkpoints) -> None:
        self.target = target
        self.window = target.model.swa_window
        self.slots = slots
        self.drafter = drafter
        # prompts whose slot was taken by another request, kept in host memory (0 bytes: none): a
        # conversation that comes back gets its cache back with one copy
        self.saved = saved
        # partial states of a recurrent / sliding-window cache that let a slot go back to an earlier
        # prefix (none kept for a cache that can simply be cut back)
        self.checkpoints = checkpoints

    def prepare(self, slot: Slot, req: Request) -> int:
        """Make the slot's cache the longest prefix of the prompt it can hold (its own, another slot's,
        a saved copy, cut back directly or through a checkpoint) with room held for the rest of the
        prompt; returns that prefix's length. PoolBusy: requests in flight hold the pool."""
        if slot.owner != req.owner:  # another owner's cache: never a prefix for this request
            self._save(slot, [])
            self.drop(slot)
            slot.owner = req.owner
        else:
            self._save(slot, req.prompt)
        self._reuse(slot, req.prompt)
        self.make_room(slot, len(req.prompt) - slot.shared)
        n = kv.sync(self.target, slot.id, slot.cached, req.prompt, self.window, need_logits=True,
                    checkpoints=self.checkpoints)
        self.checkpoints.new_prompt(slot.id)
        self.shrunk(slot)
        return n

    def truncate(self, slot: Slot, n: int) -> None:
        """The slot's cache back to its first n tokens (after a decode that broke off): directly, or
        through a checkpoint (then shorter), or cleared."""
        del slot.cached[kv.truncate(self.target, slot.id, n, self.window, self.checkpoints):]
        self.shrunk(slot)

    def host_bytes(self) -> int:
        """Host memory the bounded caches hold: saved prompts, checkpoints and the drafter's (its
        checkpoints, an index of earlier requests). Designed growth,
        up to their bounds, that a memory alert must not take for a leak."""
        return self.saved.nbytes + self.checkpoints.nbytes + (self.drafter.host_bytes() if self.drafter is not None else 0)

    def fits(self, slot: Slot, req: Request) -> bool:
        """Could the prompt start on this slot now? No, where the requests in flight (generating or
        evaluating a prompt) hold so much of the pool that the rest is too small for it, even with
        every idle cache moved out; cells it could share with a busy slot's prefix count as held."""
        busy = [s for s in self.slots if s is not slot and (s.request is not None or s.prefill is not None)]
        held = sum(self.cells(s) for s in busy)
        shared = 0
        if self.target.shares_cells:
            shared = max((kv.common_prefix(s.cached, req.prompt) for s in busy if s.owner == req.owner), default=0)
        return self.target.n_ctx - held >= len(req.prompt) - min(shared, len(req.prompt) - 1)

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
        keep a copy in host memory, unless another slot or a saved copy holds it already, or the
        prompt keeps at least half of it (as llama-server: the same conversation's next turn, which
        drops only the last answer's tail; a copy of the whole cache each turn is gigabytes on a 27B)."""
        n = len(slot.cached)
        keep = kv.common_prefix(slot.cached, prompt)
        if not self.saved.max_bytes or n - keep < self.BORROW_MIN or 2 * keep >= n:
            return
        if self.target.shares_cells and any(s is not slot and s.owner == slot.owner
                                            and kv.common_prefix(s.cached, slot.cached) == n for s in self.slots):
            return
        if not self.saved.covers(slot.owner, slot.cached):
            drafter = self.drafter.saved_state(slot.id) if self.drafter is not None else None
            self.saved.add(slot.owner, slot.cached, self.target.save_seq(slot.id), slack=self.BORROW_MIN,
                           checkpoints=self.checkpoints.of(slot.id), drafter=drafter)

    def _restore(self, slot: Slot, entry: Saved) -> None:
        """The slot's cache becomes a saved copy (one copy into free cells of the pool); where the pool
        has no room for it, the slot starts empty."""
        self.saved.touch(entry)
        self.drop(slot)
        need = len(entry.tokens)
        if self.free_cells(need, keep={slot.id}, mine=slot) >= need and self.target.load_seq(slot.id, entry.data):
            slot.cached = list(entry.tokens)
            self.checkpoints.give(slot.id, entry.checkpoints)
            if self.drafter is not None and entry.drafter is not None:
                self.drafter.restore_state(slot.id, entry.drafter)

    def drop(self, slot: Slot) -> None:
        """Empty a slot's cache (the target's, and the drafter's state for it)."""
        self.target.seq_rm(slot.id, 0, -1)
        self.checkpoints.drop(slot.id)
        slot.cached = []
        self.shrunk(slot)
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

    def shrunk(self, slot: Slot) -> None:
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

    def cells(self, s: Slot) -> int:
        """The pool cells a slot holds that no other slot counts: its cache (a prompt being evaluated
        holds its whole length), less the prefix it shares with its lender."""
        held = len(s.prefill.request.prompt) if s.prefill is not None else len(s.cached)
        return held - s.shared

    def make_room(self, slot: Slot, need: int) -> None:
        """Room for `need` cells on `slot` (besides what the other slots hold), else PoolBusy."""
        if self.free_cells(need, keep={slot.id}, mine=slot) < need:
            raise PoolBusy(f"the context pool ({self.target.n_ctx:,} tokens) is held by requests in flight")

    def free_cells(self, need: int, keep: set[int], mine: Slot | None = None) -> int:
        """The slots share one KV pool: idle slots' cached prompts (never those in `keep`, nor a prompt
        being evaluated) go to host memory, in slot order, until `need` cells are free; returns the
        cells free (not counting `mine`'s own cache; a prefix two slots share counts once)."""
        def free() -> int:
            return self.target.n_ctx - sum(self.cells(s) for s in self.slots if s is not mine)

        for s in self.slots:
            if free() >= need:
                break
            if s.id not in keep and s.request is None and s.prefill is None and s.cached:
                self._save(s, [])
                self.drop(s)
        return free()
