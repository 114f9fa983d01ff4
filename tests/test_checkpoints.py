"""Context checkpoints (app/engine/checkpoints.py): a recurrent or sliding-window cache goes back to
an earlier prefix through a saved partial state, and the logits after it are a cold evaluation's.

Models: Qwen3.6's hybrid architecture (Gated DeltaNet + attention) at a small shape with random
weights (app/gguf/synthetic.py), and Gemma 3 270M (real weights, a 512-token sliding window)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.engine import kv
from app.engine.checkpoints import TAIL, Checkpoints
from app.engine.drafters.model import ModelDrafter
from app.engine.engine import Engine, Request, SpecParams
from app.engine.text import Tokenizer
from app.llama.context import Context, Model
from app.llama.params import ModelParams

ROOT = Path(__file__).resolve().parents[1]


def params(n_ctx=4096, n_seq=2, n_rs_seq=0, ubatch=256, swa_full=False):
    return ModelParams(n_ctx, ubatch, ubatch, n_seq, True, "f16", "f16", False, swa_full, n_rs_seq, 0)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Model:
    from app.gguf.synthetic import SHAPES, small, write_random

    path = write_random(tmp_path_factory.mktemp("hybrid") / "h.gguf", small(SHAPES["qwen3.6-27b"]), seed=3)
    return Model(path)


@pytest.fixture(scope="module")
def gemma(gemma_270m) -> Model:
    return Model(gemma_270m)


@pytest.fixture(scope="module")
def text_tokens(gemma) -> list[int]:
    """Real text in Gemma's tokens (random tokens make a real model's logits nearly flat)."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "ENGINE.md").read_text()
    return Tokenizer(gemma, None).encode(text)


def logits_after(ctx: Context, tokens: list[int], start: int) -> np.ndarray:
    return ctx.logits(kv.evaluate(ctx, 0, tokens, start, logits_last=True)).copy()


def cold(ctx: Context, tokens: list[int]) -> np.ndarray:
    ctx.seq_rm(0, 0, -1)
    return logits_after(ctx, tokens, 0)


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(x):
        x = x.astype(np.float64) - x.max()
        return x - np.log(np.exp(x).sum())
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def resent(ctx: Context, ckpts: Checkpoints, first: list[int], second: list[int]) -> tuple[int, np.ndarray]:
    """Evaluate `first` (checkpointed as the engine does), then `second` on the same sequence: the
    tokens reused, and the logits of second's last token."""
    ctx.seq_rm(0, 0, -1)
    ckpts.drop(0)
    cached: list[int] = []
    ckpts.evaluate(0, first, 0, logits_last=False)
    cached.extend(first)
    n = kv.sync(ctx, 0, cached, second, ctx.model.swa_window, need_logits=True, checkpoints=ckpts)
    return n, logits_after(ctx, second, n)


def test_a_hybrid_cache_goes_back_through_a_checkpoint_with_exactly_the_cold_logits(hybrid):
    ctx = Context(hybrid, params(), 1)
    ckpts = Checkpoints(ctx, 8, 512)
    rng = np.random.default_rng(0)
    first = list(rng.integers(10, 4000, 1500))
    second = first[:1400] + list(rng.integers(10, 4000, 200))  # departs 100 tokens before first's end
    assert ctx.needs_checkpoints
    n, warm = resent(ctx, ckpts, first, second)
    # checkpoints at 512 and 1024 (min_step), 1500 - 4 - 256 and 1500 - 4 (the prompt's end)
    assert [c.n for c in ckpts.of(0)] == [512, 1024, 1240]
    assert n == 1240 and ckpts.restored == 1
    assert np.array_equal(warm, cold(ctx, second))  # the same logits, not just the same argmax


def test_without_checkpoints_a_hybrid_cache_is_evaluated_again(hybrid):
    ctx = Context(hybrid, params(), 1)
    rng = np.random.default_rng(1)
    first = list(rng.integers(10, 4000, 600))
    n, _ = resent(ctx, Checkpoints(ctx, 0, 512), first, first[:500] + [7, 8, 9])
    assert n == 0


def test_a_sliding_window_cache_goes_back_through_a_checkpoint_within_what_batching_moves(gemma, text_tokens):
    """Gemma 3 270M (window 512): a departure 800 tokens before the cache's end lies behind what
    the window's cells still hold, where llama.cpp's seq_rm says yes and leaves wrong logits
    (FACTS.md's trap); through a checkpoint the logits are a cold evaluation's, within what another
    batch size moves them."""
    ctx = Context(gemma, params(n_seq=1), 2)  # the window's cells: 512 + a ubatch, padded to 768
    first = text_tokens[:1400]
    second = text_tokens[:600] + text_tokens[3000:3100]
    truth = cold(ctx, second)
    n, warm = resent(ctx, Checkpoints(ctx, 8, 512), first, second)
    assert n == 512  # the checkpoint at 512 tokens (the departure is at 600)
    other = Context(gemma, params(ubatch=64), 1)
    noise = kl(logits_after(other, second, 0), truth)
    assert warm.argmax() == truth.argmax()
    assert kl(warm, truth) <= max(noise, 1e-6) * 2, (kl(warm, truth), noise)
    # without checkpoints the window's check refuses the cut and the sequence is evaluated again
    n0, _ = resent(ctx, Checkpoints(ctx, 0, 512), first, second)
    assert n0 == 0


def test_the_store_keeps_its_bound_evicting_too_close_ones_first_then_the_oldest(hybrid):
    ctx = Context(hybrid, params(), 1)
    rng = np.random.default_rng(2)
    tokens = list(rng.integers(10, 4000, 900))
    ckpts = Checkpoints(ctx, 4, 200)
    kv.evaluate(ctx, 0, tokens, 0, logits_last=False, end=100)
    at = 100
    for n in (100, 150, 400, 700):  # an earlier prompt's: 150 is within 200 of 100
        kv.evaluate(ctx, 0, tokens, at, logits_last=False, end=n)
        at = n
        ckpts.take(0, n)
    ckpts.new_prompt(0)
    kv.evaluate(ctx, 0, tokens, at, logits_last=False, end=800)
    ckpts.take(0, 800)
    assert [c.n for c in ckpts.of(0)] == [100, 400, 700, 800]
    kv.evaluate(ctx, 0, tokens, 800, logits_last=False, end=850)
    ckpts.take(0, 850)  # the current prompt's own stay, however close: the oldest goes
    assert [c.n for c in ckpts.of(0)] == [400, 700, 800, 850]
    one = ckpts.of(0)[0].nbytes
    small = Checkpoints(ctx, 4, 200, max_bytes=one - 1)  # a checkpoint larger than the bound is skipped
    assert small.take(0, 850) is None and small.skipped == 1 and small.nbytes == 0


def test_a_checkpoint_llama_cpp_refuses_falls_back_to_evaluating(hybrid):
    ctx = Context(hybrid, params(), 1)
    ckpts = Checkpoints(ctx, 8, 256)
    rng = np.random.default_rng(3)
    first = list(rng.integers(10, 4000, 700))
    second = first[:600] + [11, 12, 13]
    ctx.seq_rm(0, 0, -1)
    ckpts.evaluate(0, first, 0, logits_last=False)
    for c in ckpts.of(0):  # damaged: cut short
        object.__setattr__(c, "data", c.data[: len(c.data) // 2])
    cached = list(first)
    n = kv.sync(ctx, 0, cached, second, 0, need_logits=True, checkpoints=ckpts)
    assert n == 0 and cached == [] and ckpts.of(0) == []
    assert np.array_equal(logits_after(ctx, second, 0), cold(ctx, second))


def _agent_turns(rng, n_turns=3, size=700) -> list[list[int]]:
    """Prompts as a template that drops the last answer's reasoning renders them: each turn's
    prompt departs from the previous one a few tokens before its end, then goes on."""
    prompts, history = [], list(rng.integers(10, 4000, size))
    for _ in range(n_turns):
        prompts.append(history + [5, 6, 7])  # the generation prompt (an opening the next turn drops)
        history = history + list(rng.integers(10, 4000, 120))
    return prompts


def test_agent_turns_on_a_hybrid_engine_reuse_up_to_a_checkpoint_and_answer_as_a_cold_engine(hybrid):
    ctx = Context(hybrid, params(n_rs_seq=4), 1)
    draft = Context(hybrid, params(n_rs_seq=4), 1)
    ckpts = Checkpoints(ctx, 8, 4096)
    warm = Engine(ctx, ModelDrafter(draft, checkpoints=Checkpoints(draft, 8, 4096)), 2, checkpoints=ckpts)
    prompts = _agent_turns(np.random.default_rng(4))
    answers, reused = [], []
    for p in prompts:
        steps = list(warm.generate(Request(prompt=p, max_tokens=12, speculative=SpecParams(n_max=4))))
        answers.append([t for s in steps for t in s.tokens])
        reused.append(warm.slots[0].record.reused_tokens)
    # each turn departs 3 tokens before the last prompt's end: the checkpoint TAIL tokens before it
    assert reused[1:] == [len(p) - TAIL for p in prompts[:-1]]
    assert ckpts.restored == 2 and warm.drafter.checkpoints.restored >= 1
    coldctx = Context(hybrid, params(n_rs_seq=4), 1)
    plain = Engine(coldctx, None, 1)
    for p, a in zip(prompts, answers):
        coldctx.clear()
        plain.slots[0].cached = []
        steps = list(plain.generate(Request(prompt=p, max_tokens=12, speculative=SpecParams(enabled=False))))
        assert [t for s in steps for t in s.tokens] == a


def test_a_saved_prompt_keeps_its_checkpoints(hybrid):
    """One slot, two conversations taking turns: the first's cache goes to host memory with its
    checkpoints, and its next turn goes back to one of them."""
    ctx = Context(hybrid, params(), 1)
    eng = Engine(ctx, None, 1, saved_bytes=1 << 30, checkpoints=Checkpoints(ctx, 8, 4096))
    rng = np.random.default_rng(5)
    a1, a2 = _agent_turns(rng, 2)
    b = list(rng.integers(10, 4000, 400))
    for p in (a1, b, a2):
        list(eng.generate(Request(prompt=p, max_tokens=4, speculative=SpecParams(enabled=False))))
    assert eng.slots[0].record.reused_tokens == len(a1) - TAIL
    assert eng.cache.saved.entries and eng.cache.saved.entries[0].checkpoints
    assert eng.cache.host_bytes() >= eng.cache.saved.nbytes > sum(c.nbytes for c in eng.cache.saved.entries[0].checkpoints)


def test_a_plain_attention_cache_keeps_no_checkpoints(tiny):
    ctx = Context(Model(tiny.target), replace(params(1024), swa_full=False), 1)
    ckpts = Checkpoints(ctx, 8, 64)
    assert not ckpts.enabled
    ckpts.evaluate(0, [5 + i % 290 for i in range(400)], 0, logits_last=False)
    assert ckpts.of(0) == [] and ckpts.stops(400, 0, 400) == []


@pytest.mark.parametrize("which", ["hybrid", "gemma"])
def test_the_plan_counts_the_bytes_llama_cpp_saves_for_a_checkpoint(which, request):
    from app.gguf.info import read_model_info
    from app.plan import terms

    model = request.getfixturevalue(which)
    ctx = Context(model, params(n_seq=1), 1)
    kv.evaluate(ctx, 0, [5 + i % 3000 for i in range(1200)], 0, logits_last=False)
    saved = len(ctx.save_partial(0))
    planned = terms.checkpoint_bytes(read_model_info(model.path), terms.context_shape(4096, 1, "f16", "f16", n_ubatch=256))
    assert saved <= planned <= saved * 1.01, (saved, planned)


def test_nothing_replaces_or_frees_a_context_under_a_decode(hybrid):
    """A restore or a saved prompt's load asked from another thread while a decode runs is refused
    (the engine's thread does them between its decodes). One decode of 2,000 tokens: whatever the
    moment, the worker makes no llama.cpp call after it."""
    import threading

    from app.llama.context import DecodeRunning

    ctx = Context(hybrid, params(ubatch=2048), 1)
    kv.evaluate(ctx, 0, list(range(10, 300)), 0, logits_last=False)
    ck, state = ctx.save_partial(0), ctx.save_seq(0)
    ctx.seq_rm(0, 0, -1)
    worker = threading.Thread(target=kv.evaluate, args=(ctx, 0, [5 + i % 3000 for i in range(2000)], 0, False))
    worker.start()
    refused = []
    while worker.is_alive():
        for call in (lambda: ctx.load_partial(0, ck), lambda: ctx.load_seq(0, state)):
            if ctx.decoding:
                try:
                    call()
                except DecodeRunning as e:
                    refused.append(str(e))
    worker.join()
    assert refused and all("while a decode runs" in r for r in refused)
    assert ctx.decodes == 2


def test_a_draft_longer_than_the_rollback_snapshots_is_verified_from_a_checkpoint(hybrid):
    """Two snapshots, drafts of 6: where the target keeps fewer than 4 of them, the state from
    before the verify is put back and the kept tokens evaluated again; the answer is plain
    decoding's, and the cache holds exactly what was emitted."""
    from app.engine.drafters.fixed import ListDrafter

    prompt = [5 + i % 3000 for i in range(300)]
    plain_ctx = Context(hybrid, params(n_rs_seq=2), 1)
    truth = [t for s in Engine(plain_ctx, None, 1).generate(Request(prompt=prompt, max_tokens=24,
                                                                    speculative=SpecParams(enabled=False))) for t in s.tokens]
    class ThirdWrong(ListDrafter):  # the answer, but every draft's third token wrong: 2 of 6 kept
        def propose(self, seq, history, k, sampling=None, rng=None):
            d = super().propose(seq, history, k, sampling, rng)
            if len(d.tokens) > 2:
                d.tokens[2] = (d.tokens[2] + 1) % 4000 + 8
            return d

    drafts = [prompt + truth]
    ctx = Context(hybrid, params(n_rs_seq=2), 1)
    eng = Engine(ctx, ThirdWrong(drafts), 1, draft_limit=6, checkpoints=Checkpoints(ctx, 4, 4096))
    assert eng.draft_limit == 6  # not capped at the 2 snapshots
    replays = []
    original = eng._replay
    eng._replay = lambda: (replays.append(len(eng._replays)), original())[1]
    steps = list(eng.generate(Request(prompt=prompt, max_tokens=24, speculative=SpecParams(n_max=6))))
    assert [t for s in steps for t in s.tokens] == truth
    assert max(s.drafted for s in steps) == 6 and sum(replays) >= 2
    slot = eng.slots[0]
    assert ctx.pos_max(0) == len(slot.cached) - 1 and slot.cached == (prompt + truth)[: len(slot.cached)]
    no_ckpt = Engine(Context(hybrid, params(n_rs_seq=2), 1), ListDrafter(drafts), 1, draft_limit=6)
    assert no_ckpt.draft_limit == 2  # without checkpoints: capped at the snapshots
