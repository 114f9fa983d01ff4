"""The target's own MTP head as the drafter, on a small Qwen3.6-27B-MTP-shaped model (hybrid trunk +
one nextn block, random weights arranged so the head's guesses are related to the target's, and its
projection weighs the target's hidden state as much as the token: a wrong state changes the drafts):
the mechanics, rollback with the target, losslessness (greedy and sampled), and the state the head
drafts from after every path that moves the caches (the adaptive controller's steps, a prompt
restored from host memory, a replay past the rollback snapshots, a step that broke off), each
checked against the head's logits computed from the primitives alone; not acceptance."""

import numpy as np
import pytest
from test_engine import N_SAMPLES, SAMPLING, _first_tokens, _p_value, run

from app.engine.controller import CostModel
from app.engine.drafters.adaptive import AdaptiveDrafter, adaptive_controller
from app.engine.drafters.lookup import LookupDrafter
from app.engine.checkpoints import Checkpoints
from app.engine.drafters.mtp import MtpDrafter, NoMtpHead
from app.engine.engine import Engine, Request, SpecParams
from app.gguf.synthetic import write_mtp_standin
from app.llama import nextn
from app.llama.context import Context, Model
from app.llama.params import ModelParams

ALPHA = 0.001
# measured 0.0 (the same numbers) here; each fault the tests below stand for moves them by far more
# (see the note of each: a zero state where the last kept one belongs, a head cache left empty ...)
LOGIT_TOLERANCE = 0.02


def params(n_rs_seq=0, n_ctx=1024, n_seq=2):
    return ModelParams(n_ctx, 512, 512, n_seq, True, "f16", "f16", True, False, n_rs_seq, 0)


@pytest.fixture(scope="module")
def mtp_file(tmp_path_factory):
    return write_mtp_standin(tmp_path_factory.mktemp("mtp") / "mtp.gguf")


@pytest.fixture(scope="module")
def model(mtp_file):
    return Model(mtp_file, load_mtp=True)


def rig(model, n_rs_seq=8, n_seq=2, p_min=0.0):
    """An engine drafting with the head alone (no p_min cut-off by default: every draft runs to k)."""
    tc = Context(model, params(n_rs_seq, n_seq=n_seq), 1)
    mc = Context(model, params(n_seq=n_seq), 1, mtp_of=tc)
    drafter = MtpDrafter(tc, mc, p_min=p_min)
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


def head_gap(model, drafter: MtpDrafter, seq: int, history: list[int]) -> float:
    """How far the head's next draft logits after `history` (drafting from its own cache and kept
    state) are from a fresh evaluation of that history as llama.cpp's draft-mtp pairs it."""
    drafter.propose(seq, history, 1)
    return float(np.max(np.abs(drafter.mtp.logits(0) - _reference_head_logits(model, history))))


def step_until(eng, slot, want, steps: int = 150):
    """Steps the slot until a step's record satisfies `want`; that record."""
    for _ in range(steps):
        (rec,) = eng.step([slot])
        if want(rec):
            return rec
        assert rec.finish_reason is None, "the answer ended first"
    pytest.fail(f"no such step in {steps}")


def partly_rejected(rec) -> bool:
    return rec.drafter == "mtp" and 0 < rec.accepted < rec.drafted


def test_under_the_adaptive_controller_the_head_drafts_from_the_last_kept_state(model):
    """The default drafter (the controller over the head): after a partly rejected head draft, the
    next draft starts from the last kept token's state, as llama.cpp's `accept` makes it. (The
    controller not passing the verdict on fails the first check; with the state also not found among
    the verify's rows the head drafted from zeros: 10.4 apart on this stand-in.)"""
    tc = Context(model, params(8), 1)
    mc = Context(model, params(), 1, mtp_of=tc)
    costs = CostModel({n: 0.01 + 0.0001 * n for n in range(1, 10)})  # a card's: drafts pay at low acceptance
    costs.draft = 0.0001
    head = MtpDrafter(tc, mc)
    eng = Engine(tc, AdaptiveDrafter(adaptive_controller(costs, learn_costs=False), None, head), 1)
    slot = eng.slots[0]
    eng.start(slot, Request(prompt=PROMPT, max_tokens=400, speculative=SpecParams(n_max=6)))
    step_until(eng, slot, partly_rejected)
    assert head.last[0][0] == len(slot.tokens) - 2  # the last kept token's state, not the verify's last row
    assert head_gap(model, head, 0, list(slot.tokens)) < LOGIT_TOLERANCE


def test_a_conversation_restored_from_host_memory_brings_the_heads_cache_back(model):
    """A conversation whose slot served another comes back from `--cache-ram` (its cache loaded, not
    evaluated again): the head's cells and state come back with the target's, as llama-server saves
    and restores the draft context with the slot. (Restoring the target's alone left the head with
    an empty cache and a zero state there: 0.75 apart.)"""
    tc = Context(model, params(8, n_seq=1), 1)
    mc = Context(model, params(n_seq=1), 1, mtp_of=tc)
    head = MtpDrafter(tc, mc, p_min=0.0)
    eng = Engine(tc, head, 1, saved_bytes=2**28)
    slot = eng.slots[0]
    run(eng, Request(prompt=PROMPT, max_tokens=24, speculative=SpecParams(n_max=4)))
    first = list(slot.tokens)
    other = [int(t) for t in np.random.default_rng(5).integers(3, 250, 50)]
    run(eng, Request(prompt=other, max_tokens=4, speculative=SpecParams(n_max=4)))
    assert len(eng.cache.saved) == 1 and eng.cache.saved.entries[0].drafter is not None
    back = first + [7, 8, 9]
    eng.start(slot, Request(prompt=back, max_tokens=40, speculative=SpecParams(n_max=4)))
    assert slot.record.reused_tokens == len(first) - 1  # loaded from host memory, not evaluated
    assert head_gap(model, head, 0, list(slot.tokens)) < LOGIT_TOLERANCE


def test_after_a_replay_past_the_rollback_snapshots_the_head_pairs_each_token_with_its_state(model):
    """Drafts longer than the recurrent state's snapshots (with checkpoints on): where the target
    keeps too few, its state goes back to before the verify and the kept tokens are evaluated again;
    the head evaluates them again too, the first with the state before the verify. (Zeros there
    before: 0.14 apart.)"""
    tc = Context(model, params(2, n_seq=1), 1)
    mc = Context(model, params(n_seq=1), 1, mtp_of=tc)
    head = MtpDrafter(tc, mc, p_min=0.0)
    eng = Engine(tc, head, 1, checkpoints=Checkpoints(tc, 4, 64))
    replays = []
    replay = eng._replay

    def counted():
        replays.append(len(eng._replays))
        replay()

    eng._replay = counted
    slot = eng.slots[0]
    eng.start(slot, Request(prompt=PROMPT, max_tokens=400, speculative=SpecParams(n_max=6)))
    step_until(eng, slot, lambda rec: partly_rejected(rec) and replays[-1] > 0)
    assert head_gap(model, head, 0, list(slot.tokens)) < LOGIT_TOLERANCE


def test_a_step_that_broke_off_after_its_verify_leaves_no_advanced_state_behind(model):
    """An error between a step's verify decode and its rollback (here the acceptance raising once, as
    a faulty grammar would) fails the request; the server closes it with `finish`. The slot's cache
    then holds what its record says: the same conversation resent goes on from it with the target's
    answer and the head's drafts of a fresh run. (Left advanced before: the cache held the verify's
    tokens past the record, and llama.cpp refused the resent conversation's decode: invalid batch.)"""
    eng, tc, mc, head = rig(model, n_seq=1)
    slot = eng.slots[0]
    eng.start(slot, Request(prompt=PROMPT, max_tokens=400, speculative=SpecParams(n_max=4)))
    step_until(eng, slot, lambda rec: rec.drafted > 0)
    accept = eng._accept

    def broken(*a):
        raise RuntimeError("the grammar failed")

    eng._accept = broken
    with pytest.raises(RuntimeError):
        eng.step([slot])
    eng._accept = accept
    eng.finish(slot, "error")
    assert tc.pos_max(0) == len(slot.cached) - 1
    history = list(slot.tokens)
    again, _ = run(eng, Request(prompt=history, max_tokens=12, speculative=SpecParams(enabled=False)))
    fresh, _, _, _ = rig(model, n_seq=1)
    want, _ = run(fresh, Request(prompt=history, max_tokens=12, speculative=SpecParams(enabled=False)))
    assert again == want
    assert head_gap(model, head, 0, list(eng.slots[0].tokens)) < LOGIT_TOLERANCE


def test_a_head_draft_ends_before_its_first_token_below_p_min(model):
    """Outside the controller, a greedy head draft ends as llama.cpp's draft-mtp ends it: before the
    first token whose probability among the head's 10 likeliest is below p_min. At 0 every draft runs
    to k; the answer is the same either way."""
    eng, *_ = rig(model, n_seq=1)
    plain, steps = run(eng, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=4)))
    assert all(s.drafted == s.k for s in steps[1:]) and max(s.k for s in steps) == 4
    cut, *_ = rig(model, n_seq=1, p_min=0.6)
    out, cut_steps = run(cut, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=4)))
    assert out == plain and any(s.drafted < s.k for s in cut_steps[1:])
    assert sum(s.drafted for s in cut_steps) < sum(s.drafted for s in steps)


@pytest.fixture(scope="module")
def likely_model(tmp_path_factory):
    """A stand-in whose head leans on the token (the state weighs 0.1): its drafts are kept often
    enough under sampling for the distribution tests to have power (measured: 0.14 of the sampled
    drafts kept, 0.45 of the greedy ones; 0.02 and 0.19 at weight 1)."""
    return Model(write_mtp_standin(tmp_path_factory.mktemp("mtp") / "likely.gguf", state_weight=0.1), load_mtp=True)


@pytest.fixture(scope="module")
def plain_samples(likely_model):
    eng, *_ = rig(likely_model)
    return _first_tokens(eng, SpecParams(enabled=False), N_SAMPLES, SAMPLING, prompt=PROMPT)


@pytest.mark.parametrize("mode", ["match", "rejection"])
def test_sampling_with_mtp_drafts_keeps_the_targets_distribution(likely_model, plain_samples, mode):
    eng, *_ = rig(likely_model)
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
    # the head's drafts were priced and measured in the band of a short context
    assert "mtp" in drafter.controller.acceptance and not any("@" in k for k in drafter.controller.acceptance)


def test_the_heads_draft_length_follows_its_acceptance_at_the_slots_depth(model):
    """The head's acceptance is measured per band of context depth (it falls as the context fills):
    a band met for the first time starts from the shallower band's figure, and where the deeper band's
    drafts are rejected the controller drafts shorter there while it drafts long near the start."""
    from app.engine.drafters.adaptive import head_key
    from app.engine.drafters.mtp import MTP_DEPTH_BANDS

    def mtp_key(band: int) -> str:
        return head_key("mtp", MTP_DEPTH_BANDS, band)

    tc = Context(model, params(8), 1)
    costs = CostModel({n: 0.01 + 0.001 * n for n in range(1, 10)})
    costs.draft = 0.001
    drafter = AdaptiveDrafter(adaptive_controller(costs, learn_costs=False), None, MtpDrafter(tc, Context(model, params(), 1, mtp_of=tc)))
    c = drafter.controller
    for _ in range(30):  # near the start the head is kept
        c.observe(mtp_key(0), 3, 3)
    deep = drafter._model_key(40_000)  # the first slot this deep: from 4K's figure, which is from the start's
    assert deep == "mtp@16k" and abs(c.alpha(deep) - c.alpha("mtp")) < 0.01 and c.alpha(deep) > 0.8
    assert [drafter._model_key(n) for n in (0, 4095, 4096, 16383, 16384, 49152, 110_000)] == \
        ["mtp", "mtp", "mtp@4k", "mtp@4k", "mtp@16k", "mtp@48k", "mtp@48k"]
    for _ in range(30):  # at 40K it is mostly not
        c.observe(deep, 3, 0)
    near, far = c.choose("mtp", 8, costs.draft), c.choose(deep, 8, costs.draft)
    assert near.k > far.k and c.alpha(deep) < 0.3, (near, far)


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
        # per slot, over the last 30 s: the head's acceptance on its own drafts, tokens per target decode
        slot = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=30).json()["slots"][0]
        assert 0 <= slot["recent_head_acceptance"] <= 1 and slot["recent_head_drafted"] > 0, slot
        assert slot["recent_tokens_per_decode"] >= 1, slot
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        assert 'specdeck_slot_mtp_head_acceptance{model="custom",slot="0"}' in metrics, metrics
        assert 'specdeck_slot_tokens_per_decode{model="custom",slot="0"}' in metrics, metrics
    finally:
        assert s.stop() == 0, s.output
    assert "Traceback" not in s.output

    plain = write_random(tmp_path / "no-head.gguf", small(SHAPES["qwen3.6-27b"]), seed=3)
    for command in ("plan", "check"):
        p = run_cli(command, "--target", str(plain), "--draft", "mtp", "--device", "cpu", "--ctx", "4096") \
            if command == "plan" else run_cli(command, "--target", str(plain), "--draft", "mtp")
        assert p.returncode != 0 and "no-head.gguf has no MTP (nextn) layers" in p.stdout + p.stderr, (p.stdout, p.stderr)
        assert "Traceback" not in p.stderr


def test_verify_draft_mtp_on_token_id_prompts_is_lossless_and_bad_ids_are_one_line(mtp_file, tmp_path):
    """`specdeck verify --draft mtp` with prompts given as token ids (a JSONL line {"tokens": [...]}:
    the stand-in's vocabulary makes no text): speculation with the head answers what plain decoding
    answers; an id past the vocabulary, a negative one or an empty list is one clear line."""
    import json

    from conftest import run_cli

    prompts = tmp_path / "ids.jsonl"
    prompts.write_text(json.dumps({"tokens": PROMPT, "kind": "ids"}) + "\n" + json.dumps({"tokens": PROMPT[:12]}) + "\n")
    p = run_cli("verify", "--target", str(mtp_file), "--draft", "mtp", "--prompts", str(prompts), "--max-tokens", "48",
                "--ctx", "1024", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["ok"] and [r["kind"] for r in j["prompts"]] == ["ids", "custom"]
    assert [r["prompt_tokens"] for r in j["prompts"]] == [len(PROMPT), 12]
    for r in j["prompts"]:
        assert r["invariant_violations"] == 0 and r["identical"], r
    for line, says in (('{"tokens": [5, 99999]}', "past the vocabulary"), ('{"tokens": [-1]}', '"tokens"'),
                       ('{"tokens": []}', '"tokens"')):
        prompts.write_text(line + "\n")
        p = run_cli("verify", "--target", str(mtp_file), "--draft", "mtp", "--prompts", str(prompts), "--ctx", "1024")
        assert p.returncode != 0 and says in p.stderr and "Traceback" not in p.stderr, (line, p.stderr)


def test_after_an_image_the_head_follows_the_targets_states_and_drafts_losslessly(model, tmp_path):
    """An image's rows decode in the target with their hidden states out; the head follows them
    (a placeholder token beside each state), so its cache stays contiguous and it drafts after the
    picture; the answer is the target's own."""
    from app.gguf.synthetic import write_mmproj
    from app.llama.media import Picture
    from app.llama.vision import Projector

    proj = Projector(write_mmproj(tmp_path / "mmproj.gguf", model.n_embd_inp), model, 1)
    pic = Picture(40, 30, np.random.default_rng(9).integers(0, 256, 40 * 30 * 3, dtype=np.uint8).tobytes())
    ids = PROMPT[:10] + [t for t in proj.tokenize(proj.marker, [pic], add_special=False)] + PROMPT[10:]
    eng, tc, mc, _ = rig(model)
    eng.vision = proj
    plain, _ = run(eng, Request(prompt=ids, pictures={pic.key: pic}, max_tokens=40,
                                speculative=SpecParams(enabled=False)))
    spec, steps = run(eng, Request(prompt=ids, pictures={pic.key: pic}, max_tokens=40,
                                   speculative=SpecParams(n_max=3)))
    assert spec == plain
    assert sum(s.accepted for s in steps) > 0
    assert mc.pos_max(0) == tc.pos_max(0)  # the head's cache covers the image's positions too
    proj.close()
