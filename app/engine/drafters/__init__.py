"""Drafters, one module per kind: anything that proposes up to k next tokens for a sequence.

One explicit interface (`base.Drafter`), so the verify / accept / rollback code never changes when
a drafter does: `propose(seq, history, k, ...)` returns a Draft, `accepted` says how much of it the
target kept, and the next call carries the sequence's new history, so the drafter brings its own
state in step. The engine also calls `begin_request(seq)` when a request starts, `share_prefix`
when a slot borrows another's cached prefix, and `propose_all(asks)` once per step for every
sequence (they share one verify decode); `base.DrafterBase` gives the defaults.

- `model`: a small GGUF model with its own context
- `lookup`: prompt lookup (n-gram matches in the sequence itself)
- `adaptive`: both behind the controller, which picks the drafter and the lengths per step
- `fixed`: fixed continuations, for tests

May import what the engine may (they are part of it).
"""
