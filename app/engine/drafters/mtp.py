"""The target's own MTP (nextn) head as the drafter, as llama.cpp's `draft-mtp` runs it for qwen35.

The head is one more decoder block in the target's file. Its context (made from the same model)
holds only that block's cache, and each of its positions is fed a token with the target's hidden
state at the position before: (x_j, h_{j-1}) predicts x_{j+1}. So:
- after every target decode (a prompt's chunk, a verify batch, a replay), the head evaluates the
  same tokens paired with the hidden states that decode produced, shifted by one (`_follow`): its
  cache stays in step with the target's, and the last state is kept for the next draft;
- a draft starts from the last token, which the target has not evaluated yet, paired with the last
  kept state; each drafted token is fed back with the head's own hidden state (chained over its one
  head, as llama.cpp does for qwen35);
- after verification the kept state is the one of the last token kept (`accepted`), and whatever the
  head cached past it is cut before it next decodes.
Where the state before a position is not known (a prompt restored from host memory, a cache the
head did not follow), zeros stand in, as llama.cpp's do: the drafts are weaker there, never wrong
(the target verifies every token).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.engine.drafters.base import Draft, DrafterBase
from app.engine.drafters.model import DraftSamplers, pick
from app.engine.drafters.worth import DraftWorth
from app.engine.sampling import SamplingParams
from app.errors import SpecdeckError
from app.llama import nextn
from app.llama.context import Batch, Context, DecodeError

VERIFY_ROWS = 65  # a run of at most this many tokens is a verify batch: its states are kept for `accepted`


class NoMtpHead(SpecdeckError):
    """The target has no nextn (MTP) layers to draft with."""


class MtpDrafter(DrafterBase):
    """Drafts with the target's MTP head; `mtp` is the head's context, made with `mtp_of=target`."""

    name = "mtp"

    def __init__(self, target: Context, mtp: Context) -> None:
        if mtp.model.n_nextn <= 0:
            raise NoMtpHead(f"{mtp.model.path.name} has no MTP (nextn) layers")
        nextn.check_available()
        self.target, self.mtp = target, mtp
        self.decodes = 0  # the head decodes the last `propose` ran
        self.n_embd = target.model.n_embd_out
        self.batch = nextn.EmbdBatch(mtp.ptr, self.n_embd)
        self.zeros = np.zeros(self.n_embd, np.float32)
        self.last: dict[int, tuple[int, np.ndarray]] = {}  # per sequence: (position, target hidden state there)
        self.rows: dict[int, tuple[int, np.ndarray]] = {}  # per sequence: its last verify batch's (first position, states)
        self._samplers = DraftSamplers(mtp.model.n_vocab)
        self.draft_seconds = 0.0  # in llama.cpp drafting (its evaluation after each target decode not counted)
        nextn.emit_hidden(target.ptr, masked=False)
        nextn.emit_hidden(mtp.ptr, masked=True)
        self.follow(True)

    def follow(self, on: bool) -> None:
        """Follow the target's decodes (from now on), or stop: a benchmark's modes that do not draft
        with the head do not pay for its evaluation. Stopping empties the head's cache (what the
        target decodes meanwhile will not be in it)."""
        self.target.after_decode = self._follow if on else None
        if not on and self.mtp.ptr:
            self.mtp.clear()
            self.last.clear()
            self.rows.clear()

    # -- following the target -----------------------------------------------------------------

    def _state_before(self, seq: int, pos: int) -> np.ndarray:
        """The target's hidden state at pos - 1, where it is known; zeros otherwise."""
        last = self.last.get(seq)
        return last[1] if last is not None and last[0] == pos - 1 else self.zeros

    def _align(self, seq: int, pos: int) -> None:
        """Make the head's cache for `seq` end right before `pos`: cut what lies at or past it (drafts,
        rejected tokens, a departed prompt); a cache that stops short of it holds another history
        (it did not follow the target there) and is cleared."""
        end = self.mtp.pos_max(seq)
        if end >= pos:
            self.mtp.seq_rm(seq, pos, -1)
        elif 0 <= end < pos - 1:
            self.mtp.seq_rm(seq, 0, -1)

    def _follow(self, batch: Batch) -> None:
        """After a target decode: the head evaluates the same tokens, each with the target's state at
        the position before (the batch's runs of one sequence are consecutive positions)."""
        raw, n = batch.raw, len(batch)
        if n == 0:
            return
        h = nextn.hidden_rows(self.target.ptr, n, self.n_embd)
        runs = _runs([int(raw.seq_id[i][0]) for i in range(n)])
        self.batch.clear()
        for seq, r0, r1 in runs:
            p0 = int(raw.pos[r0])
            self._align(seq, p0)
            self.batch.add(int(raw.token[r0]), p0, seq, self._state_before(seq, p0), False)
            for i in range(r0 + 1, r1):
                self.batch.add(int(raw.token[i]), int(raw.pos[i]), seq, h[i - 1], False)
        try:
            self.mtp.process(self.batch)
        except DecodeError:  # the head's pool is full: it starts again from the next positions
            for seq, _, _ in runs:
                self.mtp.seq_rm(seq, 0, -1)
        for seq, r0, r1 in runs:
            p0 = int(raw.pos[r0])
            self.last[seq] = (p0 + r1 - r0 - 1, h[r1 - 1].copy())
            if r1 - r0 <= VERIFY_ROWS:
                self.rows[seq] = (p0, h[r0:r1].copy())
            else:
                self.rows.pop(seq, None)

    def accepted(self, seq: int, draft: Draft, n_accepted: int) -> None:
        """The target kept n_accepted drafts: the state to draft from next is the last kept token's."""
        rows = self.rows.get(seq)
        if rows is not None and n_accepted < len(rows[1]):
            self.last[seq] = (rows[0] + n_accepted, rows[1][n_accepted])

    # -- drafting -----------------------------------------------------------------------------

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None, worth: DraftWorth | None = None) -> Draft:
        """Up to k tokens chained over the head; a greedy draft given `worth` ends at its first token
        not worth verifying."""
        draft = Draft([], [] if sampling is not None else None, source=self.name)
        self.decodes = 0
        if k <= 0 or not history:
            return draft
        pos = len(history) - 1  # the last token: the target evaluates it in the verify batch
        self._align(seq, pos)
        sampler = self._samplers.get(seq, sampling) if sampling is not None else None
        worth = worth if sampler is None else None
        token, state = int(history[-1]), self._state_before(seq, pos)
        for j in range(k):
            if j and worth is not None and not worth.go_on(draft.tokens):
                break
            self.batch.clear()
            self.batch.add(token, pos + j, seq, state, True)
            before = self.mtp.decode_seconds
            self.decodes += 1
            try:
                self.mtp.process(self.batch)
            except DecodeError:  # the head's pool is full: a shorter draft (the target goes on alone)
                break
            finally:
                self.draft_seconds += self.mtp.decode_seconds - before
            token = pick(self.mtp.logits(0), draft, sampler, rng, worth)
            if token is None:
                break
            state = nextn.hidden_row(self.mtp.ptr, 0, self.n_embd)  # read before the next decode replaces it
        return draft

    def behind(self, seq: int, history: Sequence[int]) -> int:
        """The head never catches up: it evaluated the prompt with the target."""
        return 0

    def share_prefix(self, src: int, dst: int, prefix: Sequence[int]) -> None:
        """`dst` starts from `src`'s cached prefix: the head's cells are shared as the target's are."""
        if not self.mtp.shares_cells:
            return
        n = min(len(prefix), self.mtp.pos_max(src) + 1)
        self.mtp.seq_rm(dst, 0, -1)
        if n > 0:
            self.mtp.seq_cp(src, dst, 0, n)

    def release(self, seq: int) -> None:
        self.last.pop(seq, None)
        self.rows.pop(seq, None)
        self._samplers.forget(seq)
        self.mtp.seq_rm(seq, 0, -1)

    def close(self) -> None:
        self.follow(False)
        self.batch.close()


def _runs(seqs: list[int]) -> list[tuple[int, int, int]]:
    """(sequence, first row, end row) of each run of equal sequence ids in a batch."""
    out, start = [], 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i] != seqs[start]:
            out.append((seqs[start], start, i))
            start = i
    return out
