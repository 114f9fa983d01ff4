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
The states the head can pair a position with are the last kept one, the last decode's rows and the
one its first row was paired with: a replay after a recurrent rollback evaluates again from the
verify's first position, and finds the state before it there. A prompt saved to host memory
(`--cache-ram`) keeps the head's cells and last state with the target's (`saved_state`), as
llama-server saves the draft context with the slot's. Where the state before a position is not
known (a cache the head did not follow), zeros stand in, as llama.cpp's do: the drafts are weaker
there, never wrong (the target verifies every token).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.engine.drafters.base import Ask, Draft, DrafterBase
from app.engine.drafters.model import DraftSamplers, below_p_min, pick
from app.engine.drafters.worth import SURE, DraftWorth
from app.engine.sampling import SamplingParams
from app.errors import SpecdeckError
from app.llama import nextn
from app.llama.context import Batch, Context, DecodeError, RowBatch

# the token the head reads at an image's positions (an image has no token ids; llama.cpp's own
# draft-mtp skips images, and its head then loses the history before them)
IMAGE_TOKEN = 0
VERIFY_ROWS = 65  # a run of at most this many tokens is a verify batch: its states are kept for `accepted`
log = logging.getLogger("specdeck.engine")


@dataclass
class HeadState:
    """What a saved prompt keeps of the head: its cells for the sequence (llama.cpp's sequence
    state) and the target state its next evaluation pairs with (position, row)."""

    cells: np.ndarray
    last: tuple[int, np.ndarray] | None

    @property
    def nbytes(self) -> int:
        return len(self.cells) + (self.last[1].nbytes if self.last is not None else 0)


class NoMtpHead(SpecdeckError):
    """The target has no nextn (MTP) layers to draft with."""


@dataclass
class _Chain:
    """One sequence's draft in progress: the token to decode next, where, with which state."""

    i: int  # its ask's index
    seq: int
    pos: int  # the draft's first position (the history's last token)
    token: int
    state: np.ndarray
    k: int
    sampler: object | None
    rng: np.random.Generator | None
    worth: DraftWorth | None
    row: int = -1  # its row in the head's last batch


# where an MTP head's acceptance is measured apart: below 4K tokens of context, then up to 16K, 48K,
# and beyond (the published acceptance falls from 80-91 % near empty to ~53 % at 34K)
MTP_DEPTH_BANDS = (4096, 16384, 49152)


class MtpDrafter(DrafterBase):
    """Drafts with the target's MTP head; `mtp` is the head's context, made with `mtp_of=target`."""

    name = "mtp"
    depth_bands = MTP_DEPTH_BANDS  # its acceptance is measured per band of context depth (see AdaptiveDrafter)

    def __init__(self, target: Context, mtp: Context, p_min: float = SURE) -> None:
        """`p_min`: a greedy draft not priced by the controller (`worth`) ends before its first token
        below this probability among the head's 10 likeliest, as llama.cpp's draft-mtp ends it
        (`--spec-draft-p-min`); 0: drafts always run to k."""
        if mtp.model.n_nextn <= 0:
            raise NoMtpHead(f"{mtp.model.path.name} has no MTP (nextn) layers")
        nextn.check_available()
        self.target, self.mtp = target, mtp
        self.p_min = p_min
        self.decodes = 0  # the head decodes the last `propose` ran
        self.n_embd = target.model.n_embd_out
        self.batch = nextn.EmbdBatch(mtp.ptr, self.n_embd)
        self.zeros = np.zeros(self.n_embd, np.float32)
        self.last: dict[int, tuple[int, np.ndarray]] = {}  # per sequence: (position, target hidden state there)
        self.rows: dict[int, tuple[int, np.ndarray]] = {}  # per sequence: its last verify batch's (first position, states)
        self.before: dict[int, tuple[int, np.ndarray]] = {}  # per sequence: the state its last run started from
        self._samplers = DraftSamplers(mtp.model.n_vocab)
        self.draft_seconds = 0.0  # in llama.cpp drafting (its evaluation after each target decode not counted)
        target.emit_hidden(masked=False)
        mtp.emit_hidden(masked=True)
        self.follow(True)

    @property
    def context(self):
        """The head's own context (of the target's model): closed with the target's."""
        return self.mtp

    def time_token(self, seq: int, prefix: int, reps: int) -> float:
        """The median time of one drafted token after the target's prefix on `seq` (calibration)."""
        history = [pos % 100 + 5 for pos in range(prefix + 1)]
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            self.propose(seq, history, 1)
            self.mtp.synchronize()
            times.append(time.perf_counter() - t)
        self.release(seq)
        return statistics.median(times)

    def follow(self, on: bool) -> None:
        """Follow the target's decodes (from now on), or stop: a benchmark's modes that do not draft
        with the head do not pay for its evaluation. Stopping empties the head's cache (what the
        target decodes meanwhile will not be in it)."""
        self.target.after_decode = self._follow if on else None
        if not on and self.mtp.ptr:
            self.mtp.clear()
            self.last.clear()
            self.rows.clear()
            self.before.clear()

    # -- following the target -----------------------------------------------------------------

    def _state_before(self, seq: int, pos: int) -> np.ndarray:
        """The target's hidden state at pos - 1, where it is known (the last kept state, a row of the
        last decode, the state that decode started from); zeros otherwise."""
        want = pos - 1
        last = self.last.get(seq)
        if last is not None and last[0] == want:
            return last[1]
        rows = self.rows.get(seq)
        if rows is not None and rows[0] <= want < rows[0] + len(rows[1]):
            return rows[1][want - rows[0]]
        before = self.before.get(seq)
        return before[1] if before is not None and before[0] == want else self.zeros

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
        the position before (the batch's runs of one sequence are consecutive positions). It never
        raises: the target's decode is done, and a head that could not follow starts again (its
        cache for those sequences emptied, zeros for the state it lost)."""
        raw, n = batch.raw, len(batch)
        if n == 0:
            return
        runs = _runs([int(raw.seq_id[i][0]) for i in range(n)])
        try:
            self._evaluate(batch, n, runs)
        except Exception as e:  # noqa: BLE001 - the head is advice: the target's step goes on without it
            log.warning("the MTP head could not follow the target's decode (%s): its cache starts again", e)
            for seq, _, _ in runs:
                self.mtp.seq_rm(seq, 0, -1)
                self._forget(seq)

    def _evaluate(self, batch: Batch | RowBatch, n: int, runs: list[tuple[int, int, int]]) -> None:
        """An image's rows (no token ids) go in with IMAGE_TOKEN beside the target's states: the head
        keeps its history across the picture and drafts the text after it as after any text."""
        raw = batch.raw
        h = nextn.hidden_rows(self.target.ptr, n, self.n_embd)

        def token(i: int) -> int:
            t = batch.token(i)
            return IMAGE_TOKEN if t is None else t

        self.batch.clear()
        starts = {}
        for seq, r0, r1 in runs:
            p0 = int(raw.pos[r0])
            self._align(seq, p0)
            starts[seq] = self._state_before(seq, p0)
            self.batch.add(token(r0), p0, seq, starts[seq], False)
            for i in range(r0 + 1, r1):
                self.batch.add(token(i), int(raw.pos[i]), seq, h[i - 1], False)
        try:
            self.mtp.process(self.batch)
        except DecodeError:  # the head's pool is full: it starts again from the next positions
            for seq, _, _ in runs:
                self.mtp.seq_rm(seq, 0, -1)
        for seq, r0, r1 in runs:
            p0 = int(raw.pos[r0])
            self.before[seq] = (p0 - 1, starts[seq].copy())
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
        not worth verifying, one without it before its first token below `p_min`."""
        return self.propose_many([Ask(seq, history, k, sampling, rng)], [worth])[0]

    def propose_all(self, asks: Sequence[Ask]) -> list[Draft]:
        return self.propose_many(asks)

    def propose_many(self, asks: Sequence[Ask], worths: Sequence[DraftWorth | None] | None = None) -> list[Draft]:
        """Every sequence's draft with one head decode per draft step, a row for each sequence still
        drafting (as llama.cpp's draft-mtp batches its slots): each head decode reads the head's
        block and the whole output matrix, so a row more costs far less than a decode more.
        `decodes` counts the head decodes it ran."""
        drafts = [Draft([], [] if a.sampling is not None else None, source=self.name) for a in asks]
        self.decodes = 0
        chains = [c for i, a in enumerate(asks) if (c := self._chain(i, a, worths[i] if worths else None))]
        step = 0
        while chains:
            self.batch.clear()
            for c in chains:
                c.row = self.batch.add(c.token, c.pos + step, c.seq, c.state, True)
            before = self.mtp.decode_seconds
            self.decodes += 1
            try:
                self.mtp.process(self.batch)
            except DecodeError:  # the head's pool is full: shorter drafts (the target goes on alone)
                break
            finally:
                self.draft_seconds += self.mtp.decode_seconds - before
            chains = [c for c in chains if self._extend(c, drafts[c.i])]
            step += 1
        return drafts

    def _chain(self, i: int, a: Ask, worth: DraftWorth | None) -> _Chain | None:
        """Where ask i's draft starts: its last token (which the target evaluates in the verify batch)
        at its position, with the state before it; None where it drafts nothing."""
        if a.k <= 0 or not a.history:
            return None
        pos = len(a.history) - 1
        self._align(a.seq, pos)
        sampler = self._samplers.get(a.seq, a.sampling) if a.sampling is not None else None
        return _Chain(i, a.seq, pos, int(a.history[-1]), self._state_before(a.seq, pos), a.k, sampler, a.rng,
                      worth if sampler is None else None)

    def _extend(self, c: _Chain, draft: Draft) -> bool:
        """The token the last head decode gives chain c, appended to its draft; does the chain go on?"""
        logits = self.mtp.logits(c.row)
        if c.sampler is None and c.worth is None and self.p_min > 0 and below_p_min(logits, self.p_min):
            return False
        token = pick(logits, draft, c.sampler, c.rng, c.worth)
        if token is None or len(draft.tokens) >= c.k or (c.worth is not None and not c.worth.go_on(draft.tokens)):
            return False
        # a view of the head's output: every chain's row goes into the next batch before its decode
        c.token, c.state = token, nextn.hidden_row(self.mtp.ptr, c.row, self.n_embd)
        return True

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

    def saved_state(self, seq: int) -> HeadState:
        """The head's part of a prompt saved to host memory: its cells and the state it goes on from."""
        last = self.last.get(seq)
        return HeadState(self.mtp.save_seq(seq), (last[0], last[1].copy()) if last is not None else None)

    def restore_state(self, seq: int, state: HeadState) -> None:
        """A saved prompt came back on `seq` (its target state loaded): the head's with it, or, where
        llama.cpp refuses the cells, an empty head cache (it follows from the next decode on)."""
        self.release(seq)
        if self.mtp.load_seq(seq, state.cells) and state.last is not None:
            self.last[seq] = state.last

    def release(self, seq: int) -> None:
        self._forget(seq)
        self._samplers.forget(seq)
        self.mtp.seq_rm(seq, 0, -1)

    def _forget(self, seq: int) -> None:
        self.last.pop(seq, None)
        self.rows.pop(seq, None)
        self.before.pop(seq, None)

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
