#!/usr/bin/env python3
"""Images on this CPU: the time to encode one image, and the time to first token of a conversation
with a screenshot, first turn against the same conversation resent with a new question.

    python scripts/vision_bench.py [--rounds 3] [--layers 6] [--json]

Target: Qwen2.5-Coder 1.5B Q4_K_M (real weights, from the model store; `specdeck pull coder-1.5b`).
Projectors (app/gguf/synthetic.write_mmproj, random F32 weights, made for the target's width 1536):
- `stand-in`: the tests' projector, 32x32 images, 16 tokens an image;
- `siglip-like`: a SigLIP-So400m-shaped encoder (width 1152, feed-forward 4304, 16 heads,
  patch 14) with --layers blocks (the real one has 27) at 448x448: 1,024 tokens an image.
Encode: libmtmd's own encode of one image (the projector's cache emptied first), median and
min-max of --rounds. TTFT: one slot, a chat-rendered prompt with one image and ~300 words of text;
`first` starts from an empty cache and an empty image cache, `resent` is the same conversation with
the answer and a new question appended (the image's positions come from the prompt cache, the image
is not encoded again). ABBA pairs, ratio resent / first per pair, median with min-max.
Nothing else may run on the machine meanwhile (llama.cpp's threads share the cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.commands.common import local_path, make_fetcher  # noqa: E402
from app.engine.engine import Engine  # noqa: E402
from app.engine.slots import Request, SpecParams  # noqa: E402
from app.engine.text import Tokenizer  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.gguf.synthetic import write_mmproj  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.media import Picture  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402
from app.llama.vision import Projector  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.refs import ModelRef  # noqa: E402

TEXT = ("The build fails after the last change to the parser. Here is what the terminal shows; the "
        "error is in the highlighted line. ") * 12


def picture(seed: int, side: int) -> Picture:
    return Picture(side, side, np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8).tobytes())


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def encode_times(proj: Projector, side: int, rounds: int) -> list[float]:
    out = []
    for i in range(rounds):
        pic = picture(100 + i, side)
        t = time.perf_counter()
        proj.rows(pic)
        out.append(time.perf_counter() - t)
    return out


def ttft_pairs(model: Model, proj: Projector, tok: Tokenizer, side: int, rounds: int) -> list[tuple[float, float]]:
    ctx = Context(model, ModelParams(8192, 512, 512, 1, True, "f16", "f16", False, False, 0, 0), 2)
    eng = Engine(ctx, None, 1, vision=proj)
    pic = picture(7, side)
    msgs = [{"role": "user", "content": proj.marker + "\n" + TEXT + " What is wrong?"}]
    first_ids = proj.tokenize(tok.render_chat(msgs), [pic], add_special=False)
    answer = tok.encode(" The parser reads the closing bracket twice.", add_special=False)
    turn2 = tok.encode("<|im_end|>\n<|im_start|>user\nAnd how do I fix it?<|im_end|>\n<|im_start|>assistant\n",
                       add_special=False)
    resent_ids = first_ids + answer + turn2

    def run(ids: list[int], cold: bool) -> float:
        if cold:
            ctx.clear()
            eng.slots[0].cached = []
            proj.forget_images()
        else:  # the first turn is in the cache, as a client's next request finds it
            run(first_ids, True)
        req = Request(prompt=ids, pictures={pic.key: pic}, max_tokens=1, speculative=SpecParams(enabled=False))
        t = time.perf_counter()
        eng.start(eng.slots[0], req)
        eng.finish(eng.slots[0], "length")
        return time.perf_counter() - t

    pairs = []
    for i in range(rounds):
        if i % 2 == 0:
            a = run(first_ids, True)
            b = run(resent_ids, False)
        else:
            b = run(resent_ids, False)
            a = run(first_ids, True)
        pairs.append((a, b))
    ctx.close()
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    catalog = load_catalog()
    path = local_path(make_fetcher(offline=True), ModelRef(spec=catalog.model("qwen2.5-coder-1.5b-q4_k_m")))
    model = Model(path)
    tok = Tokenizer(model, read_model_info(path).vocab.chat_template)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        shapes = {"stand-in": (dict(), 32),
                  "siglip-like": (dict(width=1152, n_ff=4304, n_layer=args.layers, n_head=16, image_size=448,
                                       patch_size=14), 448)}
        for name, (shape, side) in shapes.items():
            proj = Projector(write_mmproj(Path(d) / f"{name}.gguf", model.n_embd_inp, **shape), model, 2)
            enc = encode_times(proj, side, args.rounds)
            pairs = ttft_pairs(model, proj, tok, side, args.rounds)
            results[name] = {
                "tokens_per_image": proj.tokens_per_image,
                "encode_s": summary(enc),
                "ttft_first_s": summary([a for a, _ in pairs]), "ttft_resent_s": summary([b for _, b in pairs]),
                "resent_over_first": summary([b / a for a, b in pairs]),
            }
            proj.close()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, r in results.items():
            e, f, s, q = r["encode_s"], r["ttft_first_s"], r["ttft_resent_s"], r["resent_over_first"]
            print(f"{name}: {r['tokens_per_image']} tokens an image; encode {e['median'] * 1e3:.1f} ms "
                  f"({e['min'] * 1e3:.1f}-{e['max'] * 1e3:.1f}); TTFT first {f['median']:.2f} s, resent "
                  f"{s['median']:.3f} s; resent / first {q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
