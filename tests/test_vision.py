"""Images in the engine: a projector stand-in written with gguf (app.gguf.synthetic.write_mmproj),
loaded by libmtmd itself, in front of a tiny target of the same width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine.drafters.model import ModelDrafter
from app.engine import kv
from app.engine.engine import Engine, RequestImages
from app.engine.slots import Request, SpecParams
from app.gguf.synthetic import write_mmproj
from app.llama import media
from app.llama.context import Context, Model
from app.llama.media import Picture
from app.llama.params import ModelParams
from app.llama.vision import Projector


def params(n_ctx=2048, n_seq=2, ubatch=64):
    return ModelParams(n_ctx, ubatch, ubatch, n_seq, True, "f16", "f16", False, False, 0, 0)


def picture(seed: int, w: int = 48, h: int = 40) -> Picture:
    return Picture(w, h, np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes())


@pytest.fixture(scope="module")
def seeing(tiny, tmp_path_factory):
    model = Model(tiny.target)
    proj = Projector(write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", model.n_embd_inp), model, 2)
    yield model, proj
    proj.close()


def prompt(proj: Projector, text: str, pics: list[Picture]) -> Request:
    ids = proj.tokenize(text, pics, add_special=True)
    return Request(prompt=ids, pictures={p.key: p for p in pics}, max_tokens=8,
                   speculative=SpecParams(enabled=False))


def first_logits(model, proj, req: Request) -> np.ndarray:
    ctx = Context(model, params(), 1)
    idx = kv.evaluate(ctx, 0, req.prompt, 0, True, images=RequestImages(proj, req.pictures))
    return ctx.logits(idx).copy()


def test_the_projector_makes_media_ids_where_the_marker_stands(seeing):
    model, proj = seeing
    pic = picture(1)
    ids = proj.tokenize(f"look {proj.marker} at this", [pic], add_special=True)
    images = [i for i, t in enumerate(ids) if media.is_media(t)]
    assert len(images) == proj.tokens_per_image == 16
    assert images == list(range(images[0], images[0] + 16))
    assert [media.row_of(ids[i]) for i in images] == list(range(16))
    assert {media.key_of(ids[i]) for i in images} == {pic.key}
    assert all(t >= 0 for t in ids[:images[0]] + ids[images[-1] + 1:])


def test_different_images_give_different_logits_and_the_same_image_the_same(seeing):
    model, proj = seeing
    a, b = picture(1), picture(2)
    text = f"what is in {proj.marker}?"
    la, la2, lb = (first_logits(model, proj, prompt(proj, text, [p])) for p in (a, a, b))
    assert np.array_equal(la, la2)
    assert np.abs(la - lb).max() > 1e-3
    rows = proj.rows(a)
    assert rows.shape == (16, model.n_embd_inp) and np.array_equal(rows, proj.rows(Picture(a.width, a.height, a.rgb)))


def test_a_resent_image_reuses_its_cached_prefix_and_a_changed_one_departs_there(seeing):
    model, proj = seeing
    ctx = Context(model, params(), 1)
    eng = Engine(ctx, None, 1, vision=proj)
    shot = picture(3)
    first = prompt(proj, f"screenshot: {proj.marker} what is wrong?", [shot])
    answer = [t for s in eng.generate(first) for t in s.tokens]
    encoded = proj.encoded
    again = prompt(proj, f"screenshot: {proj.marker} what is wrong?", [shot])
    again.prompt = again.prompt + answer + [5, 6, 7]
    list(eng.generate(again))
    assert eng.slots[0].record.reused_tokens >= len(first.prompt) - 1
    assert proj.encoded == encoded  # not encoded again
    changed = prompt(proj, f"screenshot: {proj.marker} what is wrong?", [picture(4)])
    list(eng.generate(changed))
    start = next(i for i, t in enumerate(changed.prompt) if media.is_media(t))
    assert eng.slots[0].record.reused_tokens == start
    assert proj.encoded == encoded + 1


def test_speculation_after_an_image_keeps_the_greedy_answer(seeing, tiny):
    """A draft model cannot read the target's image rows: it gets zeros at their positions (as
    llama-server's draft does) and drafts the text; the answer is the target's own."""
    model, proj = seeing
    pics = [picture(5), picture(6)]
    text = f"one {proj.marker} two {proj.marker} compare them"
    plain = Engine(Context(model, params(), 1), None, 1, vision=proj)
    want = [t for s in plain.generate(prompt(proj, text, pics)) for t in s.tokens]
    draft = Context(Model(tiny.draft), params(), 1)
    eng = Engine(Context(model, params(), 1), ModelDrafter(draft), 1, vision=proj)
    req = prompt(proj, text, pics)
    req.speculative = SpecParams(n_max=4)
    steps = list(eng.generate(req))
    assert [t for s in steps for t in s.tokens] == want
    assert sum(s.drafted for s in steps) > 0


def _mtmd_sizes(model: Model, path: Path) -> tuple[float, float]:
    """(weights, compute buffer) in MiB as libmtmd logs them when it loads the projector."""
    import re

    from app.llama.backend import capture_llama_log

    with capture_llama_log() as lines:
        Projector(path, model, 1).close()
    text = "".join(lines)
    weights = float(re.search(r"model size:\s+([\d.]+) MiB", text).group(1))
    compute = float(re.findall(r"compute buffer size =\s+([\d.]+) MiB", text)[-1])
    return weights, compute


@pytest.mark.parametrize("shape", [dict(width=64, n_ff=128, image_size=64), dict(width=128, n_ff=512, image_size=64),
                                   dict(width=256, n_ff=1024, n_layer=4, n_head=8, image_size=128),
                                   dict(width=128, n_ff=256, image_size=224, patch_size=14)])
def test_the_plans_projector_rows_match_what_mtmd_allocates(seeing, tmp_path, shape):
    from app.gguf.projector import read_projector

    model, _ = seeing
    path = write_mmproj(tmp_path / "p.gguf", model.n_embd_inp, **shape)
    info = read_projector(path)
    weights, compute = _mtmd_sizes(model, path)
    assert info.weights_bytes / 2**20 == pytest.approx(weights, abs=0.01)
    assert compute <= info.compute_bytes / 2**20 <= 1.45 * compute  # an upper bound (app/gguf/projector.py)
    assert info.tokens_per_image == (shape["image_size"] // shape.get("patch_size", 8)) ** 2


def test_the_plan_counts_the_projector_and_says_what_images_cost(seeing, tmp_path, tiny):
    from app.gguf.info import read_model_info
    from app.gguf.projector import fits, read_projector
    from app.plan.hardware import detect
    from app.plan.planner import PlanRequest, make_plan

    model, _ = seeing
    info = read_projector(write_mmproj(tmp_path / "p.gguf", model.n_embd_inp, image_size=64))
    target = read_model_info(tiny.target)
    req = PlanRequest(ctx=1024, ctx_is_user_choice=True, parallel=1)
    plain = make_plan(target, None, req, detect(), 1024)
    seen = make_plan(target, None, req, detect(), 1024, projector=info)
    rows = {t.name: t.bytes for t in seen.terms}
    assert rows["vision projector weights"] == info.weights_bytes and rows["vision projector compute"] == info.compute_bytes
    assert seen.used - plain.used == info.weights_bytes + info.compute_bytes
    assert (seen.vision.tokens_per_image, seen.vision.images_per_request, seen.vision.largest_image) == (64, 16, 64)
    assert fits(info, target.n_embd) is None
    other = read_projector(write_mmproj(tmp_path / "q.gguf", model.n_embd_inp * 2))
    assert "a projector made for another model" in fits(other, target.n_embd)


def test_a_resent_conversation_with_an_image_on_a_hybrid_model_goes_back_to_a_checkpoint(tmp_path):
    """A hybrid (recurrent) target cannot cut its state back: a turn that departs from the cached one
    near its end goes back to a context checkpoint, never one inside an image, and answers as a cold
    engine does."""
    from app.engine.checkpoints import TAIL, Checkpoints
    from app.gguf.synthetic import SHAPES, small, write_random

    model = Model(write_random(tmp_path / "h.gguf", small(SHAPES["qwen3.6-27b"]), seed=3))
    proj = Projector(write_mmproj(tmp_path / "mm.gguf", model.n_embd_inp), model, 1)
    rng = np.random.default_rng(8)
    words = lambda n: [int(t) for t in rng.integers(10, 4000, n)]  # noqa: E731
    pic = picture(21)
    image = proj.tokenize(proj.marker, [pic], add_special=False)
    head = words(150) + image + words(300)
    first, second = head + [5, 6, 7], head + words(40)  # the second departs TAIL tokens before the first's end
    p = ModelParams(2048, 64, 64, 1, True, "f16", "f16", False, False, 4, 0)
    ckpts = Checkpoints(Context(model, p, 1), 8, 160)  # every 160 tokens: the first would fall inside the image
    eng = Engine(ckpts.ctx, None, 1, checkpoints=ckpts, vision=proj)
    req = lambda ids: Request(prompt=ids, pictures={pic.key: pic}, max_tokens=8, speculative=SpecParams(enabled=False))  # noqa: E731
    list(eng.generate(req(first)))
    answer = [t for s in eng.generate(req(second)) for t in s.tokens]
    assert ckpts.restored >= 1 and eng.slots[0].record.reused_tokens == len(first) - TAIL
    starts = {c.n for c in ckpts.of(0)}
    assert 150 + len(image) in starts and not any(150 < n < 150 + len(image) for n in starts)  # moved past the image
    cold = Engine(Context(model, p, 1), None, 1, vision=proj)
    assert [t for s in cold.generate(req(second)) for t in s.tokens] == answer
    proj.close()
