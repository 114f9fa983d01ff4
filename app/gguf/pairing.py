"""Can this draft serve this target? llama.cpp's own compatibility rules, on plain data.

The rules (as `common/speculative.cpp` applies them), checked in this order; the first that fails
is reported:
  vocab-type   both vocabularies are of the same type (SPM, BPE, ...)
  add-bos      both add a BOS token, or neither; if they do, with the same id (bos-id)
  add-eos      likewise for EOS (eos-id)
  vocab-size   the vocabulary sizes differ by at most 128
  token-text   every token id from 5 up to the smaller vocabulary has the same text
Speed warnings do not block: llama.cpp would run the pair, only slower than it could.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.gguf.info import ModelInfo
from app.gguf.vocab_probe import VocabFacts

MAX_VOCAB_SIZE_DIFF = 128
FIRST_CHECKED_TOKEN = 5
DRAFT_SIZE_WARN_RATIO = 0.25  # a draft should be a small fraction of the target to pay off


@dataclass(frozen=True)
class PairVocab:
    """One side's vocabulary, with llama.cpp's defaults already applied."""

    type: str
    add_bos: bool
    add_eos: bool
    bos: int | None
    eos: int | None
    tokens: Sequence[str]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Incompatibility:
    rule: str
    message: str


def resolve_vocab(info: ModelInfo, facts: VocabFacts | None) -> PairVocab:
    """The header's vocabulary, with implicit flags taken from llama.cpp's `vocab_only` load."""
    v = info.vocab
    if facts is not None:
        return PairVocab(facts.type, facts.add_bos, facts.add_eos, facts.bos, facts.eos, v.tokens)
    # Without llama.cpp: llama.cpp's defaults are add-BOS for SPM/WPM vocabularies, not for BPE.
    add_bos = v.add_bos if v.add_bos is not None else v.model in ("llama", "bert")
    add_eos = bool(v.add_eos)
    return PairVocab(v.model, add_bos, add_eos, v.bos_id, v.eos_id, v.tokens)


def _first_token_difference(t: Sequence[str], d: Sequence[str]) -> int | None:
    for i in range(FIRST_CHECKED_TOKEN, min(len(t), len(d))):
        if t[i] != d[i]:
            return i
    return None


def first_incompatibility(target: PairVocab, draft: PairVocab) -> Incompatibility | None:
    """The first of llama.cpp's rules that the pair breaks, or None if the draft can serve the target."""
    if target.type != draft.type:
        return Incompatibility("vocab-type", f"vocabulary types differ: target {target.type}, draft {draft.type}")
    if target.add_bos != draft.add_bos:
        return Incompatibility("add-bos", f"add-BOS differs: target {target.add_bos}, draft {draft.add_bos}")
    if target.add_bos and target.bos != draft.bos:
        return Incompatibility("bos-id", f"BOS token ids differ: target {target.bos}, draft {draft.bos}")
    if target.add_eos != draft.add_eos:
        return Incompatibility("add-eos", f"add-EOS differs: target {target.add_eos}, draft {draft.add_eos}")
    if target.add_eos and target.eos != draft.eos:
        return Incompatibility("eos-id", f"EOS token ids differ: target {target.eos}, draft {draft.eos}")
    diff = abs(target.n_tokens - draft.n_tokens)
    if diff > MAX_VOCAB_SIZE_DIFF:
        return Incompatibility(
            "vocab-size",
            f"vocabulary sizes differ by {diff} (target {target.n_tokens}, draft {draft.n_tokens}; "
            f"at most {MAX_VOCAB_SIZE_DIFF} allowed)",
        )
    i = _first_token_difference(target.tokens, draft.tokens)
    if i is not None:
        return Incompatibility(
            "token-text", f"token {i} differs: target {target.tokens[i]!r}, draft {draft.tokens[i]!r}"
        )
    return None


def speed_warnings(target: ModelInfo, draft: ModelInfo) -> list[str]:
    """What llama.cpp would accept but that costs speed."""
    out = []
    ratio = draft.n_params / target.n_params if target.n_params else 1.0
    if ratio > DRAFT_SIZE_WARN_RATIO:
        out.append(
            f"the draft has {ratio:.0%} of the target's parameters: a draft pays off when it is "
            f"much smaller (a few percent)"
        )
    t_tpl, d_tpl = target.vocab.chat_template, draft.vocab.chat_template
    if t_tpl and d_tpl and t_tpl != d_tpl:
        out.append("the chat templates differ: the draft sees the target's template and may predict it less well")
    if draft.context_length and target.context_length and draft.context_length < target.context_length:
        out.append(
            f"the draft was trained on {draft.context_length:,} tokens, the target on "
            f"{target.context_length:,}: acceptance may fall at long range"
        )
    if draft.architecture != target.architecture:
        out.append(f"different architectures ({target.architecture} vs {draft.architecture}): acceptance may be low")
    return out
