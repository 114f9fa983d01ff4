"""The engine on real models: sliding-window rollback (Gemma 3 270M) and the Qwen pair."""

import numpy as np
import pytest

from app.engine import kv
from app.engine.drafters.model import ModelDrafter
from app.engine.engine import Engine, Request, SpecParams
from app.llama.context import Context, Model
from app.llama.params import ModelParams

TOL = 1.0  # llama.cpp batch-shape numerics (FACTS.md: up to ~0.8 measured)


def ctx_for(model, n_ctx=2048, n_seq=1, flash_attn=True):
    return Context(model, ModelParams(n_ctx, 512, 512, n_seq, True, "f16", "f16", flash_attn, False, 0, 0), 2)


def next_logits(ctx, tokens):
    """Logits after `tokens`, given the cache already holds tokens[:-1]."""
    b = ctx.batch
    b.clear()
    b.add(tokens[-1], len(tokens) - 1, 0, True)
    ctx.decode(b)
    return ctx.logits(0).copy()


def fresh_logits(model, tokens):
    c = ctx_for(model)
    kv.evaluate(c, 0, tokens, 0, logits_last=True)
    out = c.logits(c.batch.raw.n_tokens - 1).copy()
    c.close()
    return out


@pytest.fixture(scope="module")
def gemma(gemma_270m):
    return Model(gemma_270m)


def long_prompt(n, seed=0):
    rng = np.random.default_rng(seed)
    return [2] + [int(x) for x in rng.integers(1000, 20000, n - 1)]


def test_gemma_window_is_what_the_check_assumes(gemma):
    assert gemma.swa_window == 512


def test_swa_prefix_reuse_behind_the_window_reevaluates(gemma):
    """Reusing 300 of 1,500 cached positions reaches behind the 512-token window: the engine must
    evaluate again (the naive seq_rm 'succeeds' and gives wrong logits)."""
    a = long_prompt(1500)
    b = a[:300] + long_prompt(40, seed=1)[1:]
    want = fresh_logits(gemma, b)

    ctx = ctx_for(gemma)
    kv.evaluate(ctx, 0, a, 0, logits_last=False)
    assert ctx.pos_min(0) > 0  # the window cache has dropped early positions
    naive = ctx_for(gemma)
    kv.evaluate(naive, 0, a, 0, logits_last=False)
    assert naive.seq_rm(0, 300, -1)  # llama.cpp says yes...
    kv.evaluate(naive, 0, b[:-1], 300, logits_last=False)
    wrong = next_logits(naive, b)
    assert np.max(np.abs(wrong - want)) > TOL  # ...and the logits are off

    cached = list(a)
    n = kv.sync(ctx, 0, cached, b, gemma.swa_window, need_logits=True)
    assert n == 0  # the safe path starts again
    kv.evaluate(ctx, 0, b[:-1], n, logits_last=False)
    assert np.max(np.abs(next_logits(ctx, b) - want)) < TOL


def test_swa_prefix_reuse_inside_the_window_keeps_the_cache(gemma):
    a = long_prompt(1500)
    b = a[:1400] + long_prompt(20, seed=2)[1:]
    ctx = ctx_for(gemma)
    kv.evaluate(ctx, 0, a, 0, logits_last=False)
    cached = list(a)
    n = kv.sync(ctx, 0, cached, b, gemma.swa_window, need_logits=True)
    assert n == 1400
    kv.evaluate(ctx, 0, b[:-1], n, logits_last=False)
    assert np.max(np.abs(next_logits(ctx, b) - fresh_logits(gemma, b))) < TOL


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "no-fa"])  # no-fa: a CPU plan's default
def test_speculative_rollback_on_a_sliding_window_model(gemma, flash_attn):
    """Gemma as its own draft past the window: every rollback is short and the cache stays right."""
    tc, dc = ctx_for(gemma, flash_attn=flash_attn), ctx_for(gemma, flash_attn=flash_attn)
    eng = Engine(tc, ModelDrafter(dc), 1)
    prompt = long_prompt(700)
    steps = list(eng.generate(Request(prompt=prompt, max_tokens=40, speculative=SpecParams(n_max=4), trace=True)))
    assert all(s.tokens == s.target_argmax for s in steps)
    rec = eng.slots[0].record
    assert rec.drafted > 0 and rec.accepted / rec.drafted > 0.8
    tokens = eng.slots[0].tokens
    assert tc.pos_max(0) == len(tokens) - 2
    assert np.max(np.abs(next_logits(tc, tokens) - fresh_logits(gemma, tokens))) < TOL


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "no-fa"])
def test_qwen_pair_greedy_speculation(real_pair, flash_attn):
    tm, dm = Model(real_pair.target), Model(real_pair.draft)
    eng = Engine(ctx_for(tm, flash_attn=flash_attn), ModelDrafter(ctx_for(dm, flash_attn=flash_attn)), 1)
    prompt = [151644, 872, 198] + [750, 374, 264, 1273, 13, 9645, 264, 13027, 729, 429, 16211, 264, 1140, 13] + [151645, 198, 151644, 77091, 198]
    plain = [t for s in eng.generate(Request(prompt=prompt, max_tokens=48, speculative=SpecParams(enabled=False), stop_tokens={151645})) for t in s.tokens]
    steps = list(eng.generate(Request(prompt=prompt, max_tokens=48, speculative=SpecParams(n_max=6), stop_tokens={151645}, trace=True)))
    spec = [t for s in steps for t in s.tokens]
    assert all(s.tokens == s.target_argmax for s in steps)
    i = next((j for j, (x, y) in enumerate(zip(plain, spec)) if x != y), None)
    if i is not None:  # a flip needs a top-two gap within twice the batch-vs-single difference there
        from app.commands.equivalence import single_vs_batch_delta

        gaps = [g for s in steps for g in s.top2_gap]
        delta = single_vs_batch_delta(eng, prompt + plain, len(prompt) + i, len(prompt))
        assert gaps[i] <= 2 * delta, "outputs differ away from a near-tie"
    else:
        assert plain == spec
    assert eng.slots[0].record.accepted > 0


def test_a_sliding_window_conversation_comes_back_from_host_memory(gemma):
    """Gemma past its window: a conversation whose slot another took gets its cache back from the
    saved copy when it comes back extended (no token evaluated twice), and the answer equals a cold
    run. Where the next prompt leaves the copy behind the window, the copy is not loaded.

    Flash attention off: llama.cpp's CPU flash-attention kernel accumulates V in f16 over chunks of
    cells, and a loaded copy lies in other cells than the evaluated cache (compacted to the window),
    so its logits move by up to ~1.0 and a greedy answer can flip (measured on an AMD EPYC with
    AVX-512: 0.5-1.0; Intel did not flip). Without it a loaded copy's logits equal the cold run's
    exactly, so any fault in what was saved or loaded shows."""
    first = long_prompt(900)
    back = first + long_prompt(30, seed=3)[1:]
    req = lambda p: Request(prompt=p, max_tokens=6, speculative=SpecParams(enabled=False))  # noqa: E731
    eng = Engine(ctx_for(gemma, flash_attn=False), None, 1, saved_bytes=2**30)
    list(eng.generate(req(first)))
    list(eng.generate(req(long_prompt(600, seed=4))))
    assert [len(e.tokens) for e in eng.cache.saved.entries] == [len(first) + 5]
    cached = list(eng.cache.saved.entries[0].tokens)
    got = [t for s in eng.generate(req(cached + back[len(first):])) for t in s.tokens]
    assert eng.slots[0].record.reused_tokens == len(cached)
    cold_engine = Engine(ctx_for(gemma, flash_attn=False), None, 1)
    cold = [t for s in cold_engine.generate(req(cached + back[len(first):])) for t in s.tokens]
    assert got == cold
    list(eng.generate(req(first[:300] + back[len(first):])))  # 300 tokens in: behind the window
    assert eng.slots[0].record.reused_tokens == 0
