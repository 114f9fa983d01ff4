"""Drafters, one module per kind: anything that proposes up to k next tokens for a sequence.

One explicit interface (`base.Drafter`), so the verify / accept / rollback code never changes when
a drafter does. The engine calls, per sequence (a slot):
- `begin_request(seq, partition)` when a request starts on it, `finish_request(seq, history)` when it ends;
- `propose_all(asks)` once per step for every sequence (they share one verify decode), which by
  default calls `propose(seq, history, k, sampling, rng)` for each; a `Draft` holds the tokens (and
  their distributions for rejection sampling) and, where the drafter estimated, `Why` it chose that
  many;
- `accepted(seq, draft, n)` after verification: how much of the draft the target kept (the next
  call carries the sequence's new history, so a drafter brings its own state in step then);
- `share_prefix(src, dst, prefix)` when a slot borrows another's cached prefix;
- `release(seq)` when the slot's cache is dropped.
`base.DrafterBase` gives every optional part its default (nothing to do).

- `model`: a small GGUF model with its own context
- `lookup`: prompt lookup (n-gram matches in the sequence itself)
- `suffix`: the suffix index over recent requests' prompts and answers, per API key
- `resume`: a copy picked up again right after the answer parted from it (used by adaptive)
- `adaptive`: text first (lookup, suffix, resume), the draft model second, behind the controller,
  which picks each step's drafter and length (`adaptive_controller` makes that controller)
- `fixed`: fixed continuations, for tests

May import what the engine may (they are part of it).
"""
