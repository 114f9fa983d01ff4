"""The target's own MTP head as the drafter, on a small Qwen3.6-27B-MTP-shaped model (hybrid trunk +
one nextn block, random weights arranged so the head's guesses are related to the target's): the
mechanics, rollback with the target, and losslessness (greedy and sampled); not acceptance."""

import numpy as np
import pytest
from support.tinymodels import write_mtp_model
from test_engine import N_SAMPLES, SAMPLING, _first_tokens, _p_value, run

from app.engine.controller import CostModel
from app.engine.drafters.adaptive import AdaptiveDrafter, adaptive_controller
from app.engine.drafters.lookup import LookupDrafter
from app.engine.drafters.mtp import MtpDrafter, NoMtpHead
from app.engine.engine import Engine, Request, SpecParams
from app.llama import nextn
from app.llama.context import Context, Model
from app.llama.params import ModelParams

ALPHA = 0.001
# measured 0.0 (the same numbers) here; pairing each token with its own state instead of the one before
# moved them 0.11, drafting from a stale state 1.4, rejected cells left in the cache 2.6
LOGIT_TOLERANCE = 0.02


def params(n_rs_seq=0, n_ctx=1024, n_seq=2):
    return ModelParams(n_ctx, 512, 512, n_seq, True, "f16", "f16", True, False, n_rs_seq, 0)


@pytest.fixture(scope="module")
def mtp_file(tmp_path_factory):
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "mtp.gguf")


@pytest.fixture(scope="module")
def model(mtp_file):
    return Model(mtp_file, load_mtp=True)


def rig(model, n_rs_seq=8, n_seq=2):
    tc = Context(model, params(n_rs_seq, n_seq=n_seq), 1)
    mc = Context(model, params(n_seq=n_seq), 1, mtp_of=tc)
    drafter = MtpDrafter(tc, mc)
    return Engine(tc, drafter, n_seq), tc, mc, drafter


PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 250, 40)]


def test_the_file_has_one_mtp_layer_and_a_hybrid_trunk(model):
    assert model.n_nextn == 1 and model.is_recurrent


def test_mtp_drafts_are_lossless_and_its_cache_rolls_back_with_the_target(model):
    eng, tc, mc, _ = rig(model)
    plain, _ = run(eng, Request(prompt=PROMPT, max_tokens=60, speculative=SpecParams(enabled=False)))
    spec, steps = run(eng, Request(prompt=PROMPT, max_tokens=60, speculative=SpecParams(n_max=4), trace=True))
    assert all(s.tokens == s.target_argmax for s in steps)  # every token is the target's own argmax
    drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
    assert drafted > 0 and 0 < accepted < drafted  # kept and rejected drafts: rollbacks happened
    assert all(s.drafter == "mtp" for s in steps if s.drafted)
    # the head's cache ends where the target's does: rejected drafts were cut from both
    assert mc.pos_max(0) == tc.pos_max(0) == len(eng.slots[0].cached) - 1
    assert spec == plain


def _reference_head_logits(model, history: list[int]) -> np.ndarray:
    """The head's logits for the draft after `history`, computed as llama.cpp's draft-mtp pairs its
    inputs, with the primitives alone: the target evaluates history[:-1] keeping every hidden state;
    the head evaluates (x_j, h_(j-1)) at each position j (zeros before the first), then the last token
    with the last state."""
    tc = Context(model, params(8), 1)
    mc = Context(model, params(), 1, mtp_of=tc)
    n_embd = model.n_embd_out
    nextn.emit_hidden(tc.ptr, masked=False)
    nextn.emit_hidden(mc.ptr, masked=True)
    b, eb = tc.batch, nextn.EmbdBatch(mc.ptr, n_embd)
    b.clear()
    for pos, tok in enumerate(history[:-1]):
        b.add(tok, pos, 0, False)
    tc.decode(b)
    h = nextn.hidden_rows(tc.ptr, len(b), n_embd).copy()
    eb.clear()
    for pos, tok in enumerate(history[:-1]):
        eb.add(tok, pos, 0, h[pos - 1] if pos else np.zeros(n_embd, np.float32), False)
    mc.process(eb)
    eb.clear()
    eb.add(history[-1], len(history) - 1, 0, h[-1], True)
    mc.process(eb)
    return mc.logits(0).copy()


def test_after_rollbacks_the_head_drafts_as_one_that_followed_only_the_kept_tokens(model):
    """Mid-answer, right after a step whose drafts were partly rejected, the head's next logits are a
    fresh evaluation's of the kept tokens: the rejected drafts' cells were cut, and the state it
    drafts from is the last kept token's."""
    eng, tc, mc, drafter = rig(model)
    slot = eng.slots[0]
    eng.start(slot, Request(prompt=PROMPT, max_tokens=200, speculative=SpecParams(n_max=6)))
    for _ in range(100):
        (rec,) = eng.step([slot])
        if 0 < rec.accepted < rec.drafted:
            break
    else:
        pytest.fail("no partly rejected draft in 100 steps")
    history = list(slot.tokens)
    drafter.propose(0, history, 1)
    diff = float(np.max(np.abs(mc.logits(0) - _reference_head_logits(model, history))))
    assert diff < LOGIT_TOLERANCE, diff


@pytest.fixture(scope="module")
def plain_samples(model):
    eng, *_ = rig(model)
    return _first_tokens(eng, SpecParams(enabled=False), N_SAMPLES, SAMPLING, prompt=PROMPT)


@pytest.mark.parametrize("mode", ["match", "rejection"])
def test_sampling_with_mtp_drafts_keeps_the_targets_distribution(model, plain_samples, mode):
    eng, *_ = rig(model)
    plain = plain_samples
    spec = _first_tokens(eng, SpecParams(n_max=3, mode=mode), N_SAMPLES, SAMPLING, seed0=10_000, prompt=PROMPT)
    assert eng.drafted >= N_SAMPLES and 0.1 < eng.accepted / eng.drafted < 1.0
    for position in (0, 1):
        assert _p_value([x[position] for x in plain], [x[position] for x in spec]) > ALPHA


def test_mtp_under_the_adaptive_controller_with_lookup(model):
    """Lookup copies where the text repeats, the head drafts elsewhere; the greedy invariant holds."""
    tc = Context(model, params(8), 1)
    mc = Context(model, params(), 1, mtp_of=tc)
    costs = CostModel({n: 0.01 + 0.001 * n for n in range(1, 10)})
    costs.draft = 0.001  # a head token at a tenth of a target decode: the head pays
    drafter = AdaptiveDrafter(adaptive_controller(costs, learn_costs=False), LookupDrafter(), MtpDrafter(tc, mc))
    eng = Engine(tc, drafter, 2)
    prompt = PROMPT + PROMPT[:20]  # a repeat for lookup to find
    out, steps = run(eng, Request(prompt=prompt, max_tokens=60, speculative=SpecParams(n_max=6), trace=True))
    assert all(s.tokens == s.target_argmax for s in steps)
    assert "mtp" in {s.drafter for s in steps}


def test_a_model_without_nextn_layers_is_refused(tmp_path):
    from app.gguf.synthetic import SHAPES, small, write_random

    m = Model(write_random(tmp_path / "plain.gguf", small(SHAPES["qwen3.6-27b"]), seed=3), load_mtp=True)
    tc = Context(m, params(8), 1)
    with pytest.raises(NoMtpHead, match="plain.gguf has no MTP"):
        MtpDrafter(tc, tc)


def test_serve_draft_mtp_answers_with_head_drafts_and_a_target_without_one_is_refused(mtp_file, tmp_path):
    """`specdeck serve --target FILE --draft mtp`: the start line says who drafts, an answer (token ids:
    the stand-in's placeholder vocabulary makes no tokens of text) carries the head's drafts; plan and
    check refuse a target without nextn layers in one line naming the file."""
    import httpx
    from conftest import run_cli
    from support.live import Serve, free_port

    from app.gguf.synthetic import SHAPES, small, write_random

    port = free_port()
    s = Serve("--target", str(mtp_file), "--draft", "mtp", "--port", str(port), "--ctx", "2048")
    try:
        assert s.wait_line("models loaded", 300), s.output
        assert "the target's MTP head drafting" in s.output
        r = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": PROMPT, "n_predict": 128, "ignore_eos": True},
                       timeout=120)
        assert r.status_code == 200 and r.json()["timings"]["predicted_n"] == 128, r.text
        # the controller drafts where it expects a gain, and probes an idle drafter every 32 steps
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        drafted = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("specdeck_draft_tokens_total"))
        assert drafted > 0, metrics
    finally:
        assert s.stop() == 0, s.output
    assert "Traceback" not in s.output

    plain = write_random(tmp_path / "no-head.gguf", small(SHAPES["qwen3.6-27b"]), seed=3)
    for command in ("plan", "check"):
        p = run_cli(command, "--target", str(plain), "--draft", "mtp", "--device", "cpu", "--ctx", "4096") \
            if command == "plan" else run_cli(command, "--target", str(plain), "--draft", "mtp")
        assert p.returncode != 0 and "no-head.gguf has no MTP (nextn) layers" in p.stdout + p.stderr, (p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
