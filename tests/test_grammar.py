"""Grammar-constrained generation: the target samples under llama.cpp's grammar sampler, and a
drafted token the grammar forbids is rejected, so speculation stays lossless and valid."""

import json
import re

import pytest

from app.engine.drafters.base import Draft
from app.engine.drafters.fixed import ListDrafter
from app.engine.engine import Engine, Request, SpecParams
from app.engine.sampling import SamplingParams, TokenSampler, grammar_sampler
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.llama.context import Context, Model
from app.llama.params import ModelParams

AB = 'root ::= (" a" | " b")+'
PROMPT = [1, 300, 301, 302, 303]
FORBIDDEN = 264  # "▁def" in the tiny vocabulary


def _ctx(path):
    return Context(Model(path), ModelParams(512, 512, 512, 1, True, "f16", "f16", True, False, 0, 0), 1)


class Forbidden(ListDrafter):
    """Drafts only tokens the grammar forbids, whatever the history."""

    def __init__(self, q=None):
        super().__init__([], q)

    def propose(self, seq, history, k, sampling=None, rng=None):
        return Draft([FORBIDDEN] * k, [self.q] * k if (sampling is not None and self.q is not None) else None)


def _run(ctx, drafter, sampling, n=12):
    eng = Engine(ctx, drafter, 1)
    steps = list(eng.generate(Request(prompt=PROMPT, max_tokens=n, sampling=sampling, stop_tokens={2},
                                      speculative=SpecParams(enabled=drafter is not None, n_max=4))))
    return [t for s in steps for t in s.tokens], eng.slots[0].record


@pytest.fixture(scope="module")
def target(tiny):
    return _ctx(tiny.target)


def test_grammar_constrains_the_target(target):
    tok = Tokenizer(target.model, None)
    free, _ = _run(target, None, SamplingParams())
    out, _ = _run(target, None, SamplingParams(grammar=AB))
    assert not re.fullmatch(r"( a| b)+", tok.decode(free))  # unconstrained, it says something else
    assert re.fullmatch(r"( a| b)+", tok.decode(out)) and len(out) >= 2


@pytest.mark.parametrize("sampling", [SamplingParams(grammar=AB), SamplingParams(grammar=AB, temperature=0.9, seed=3)])
def test_forbidden_drafts_are_rejected_and_output_unchanged(target, sampling):
    tok = Tokenizer(target.model, None)
    plain, _ = _run(target, None, sampling)
    bad = Forbidden()  # every draft token breaks the grammar
    out, rec = _run(target, bad, sampling)
    assert out == plain and re.fullmatch(r"( a| b)+", tok.decode(out))
    assert rec.drafted > 0 and rec.accepted == 0
    good = ListDrafter([PROMPT + plain])  # the grammar's own answer, drafted: kept
    out2, rec2 = _run(target, good, sampling)
    assert out2 == plain and rec2.accepted > 0


def test_rejection_mode_respects_the_grammar(target, tiny):
    """Rejection sampling: the draft's q ignores the grammar; p is 0 on forbidden tokens, so they go."""
    import numpy as np

    n_vocab = target.model.n_vocab
    q = np.full(n_vocab, 1.0 / n_vocab)
    tok = Tokenizer(target.model, None)
    for seed in range(3):
        eng = Engine(target, Forbidden(q), 1)
        req = Request(prompt=PROMPT, max_tokens=10, sampling=SamplingParams(grammar=AB, temperature=1.0, seed=seed),
                      stop_tokens={2},
                      speculative=SpecParams(n_max=4, mode="rejection"))
        out = [t for s in eng.generate(req) for t in s.tokens]
        rec = eng.slots[0].record
        assert re.fullmatch(r"( a| b)+", tok.decode(out)) and rec.drafted > 0 and rec.accepted == 0


def test_bad_grammar_is_a_clear_error(target):
    with pytest.raises(SpecdeckError, match="grammar"):
        grammar_sampler(target.model.vocab, "root ::= (")
    with pytest.raises(SpecdeckError, match="grammar"):
        TokenSampler(SamplingParams(grammar="nonsense"), target.model.n_vocab, target.model.vocab)


def test_a_lazy_grammar_applies_from_its_trigger_and_speculation_stays_lossless(target):
    """llama.cpp's lazy grammar (as `auto` tool calls use it): free output until the trigger pattern
    matches, then constrained from the match on; drafts the grammar forbids are rejected, the
    grammar's own answer drafted is kept, and the output is the same with speculation and without."""
    tok = Tokenizer(target.model, None)
    free, _ = _run(target, None, SamplingParams())
    lead = tok.decode(free[:2])  # the unconstrained answer's first two tokens' text: the trigger
    grammar = f'root ::= {json.dumps(lead)} (" a" | " b")+'
    sampling = SamplingParams(grammar=grammar, grammar_triggers=(re.escape(lead),))
    plain, _ = _run(target, None, sampling)
    text = tok.decode(plain)
    assert plain[:2] == free[:2] and plain != free and re.fullmatch(re.escape(lead) + r"( a| b)+", text), text
    out, rec = _run(target, Forbidden(), sampling)
    assert out == plain and rec.drafted > 0
    out2, rec2 = _run(target, ListDrafter([PROMPT + plain]), sampling)
    assert out2 == plain and rec2.accepted > 0
