#!/usr/bin/env python3
"""Python time per engine step (wall time minus time inside llama_decode), at a short and a long
context, on the tiny test models, so that per-step work that grows with the context shows; and the
suffix index's costs: a step with 100K tokens of other requests indexed, indexing a 100K-token
prompt, and its memory per indexed token.

    python scripts/step_overhead.py [--context 32768] [--steps 200] [--indexed 100000]

The tiny models decode fast, so what is left is the engine's own bookkeeping. On a 24 GB card a 27B
step takes tens of milliseconds, and anything here that grows with 110K tokens competes with it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.tinymodels import write_tiny_model  # noqa: E402

from app.engine.controller import CostModel  # noqa: E402
from app.engine.drafters.adaptive import AdaptiveDrafter, adaptive_controller  # noqa: E402
from app.engine.drafters.lookup import LookupDrafter  # noqa: E402
from app.engine.drafters.model import ModelDrafter  # noqa: E402
from app.engine.drafters.suffix import SuffixDrafter, SuffixIndex  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402


def python_ms_per_step(engine: Engine, contexts: list[Context], prompt: list[int], steps: int) -> float:
    slot = engine.slots[0]
    rec = engine.start(slot, Request(prompt=prompt, max_tokens=steps + 2, speculative=SpecParams(n_max=4)))
    rec = engine.step([slot])[0]  # the first step indexes the prompt for lookup (once per request)
    d0, t, n = sum(c.decode_seconds for c in contexts), time.perf_counter(), 0
    while rec.finish_reason is None:
        rec = engine.step([slot])[0]
        n += 1
    wall, decode = time.perf_counter() - t, sum(c.decode_seconds for c in contexts) - d0
    engine.finish(slot, "done")
    engine.drafter.release(slot.id)
    contexts[0].seq_rm(slot.id, 0, -1)
    slot.cached = []
    return (wall - decode) / max(1, n) * 1e3


class Sweep:
    """After every decode, read `mib` MiB of memory (timed as decode): what a long-context CPU decode
    does to the caches the Python that follows runs in. Run at a short context, it tells Python work
    that grows with the context from Python slowed by caches the decode emptied (a GPU decode leaves
    the host's caches alone)."""

    def __init__(self, contexts: list[Context], mib: int) -> None:
        self.contexts, self.buf = contexts, np.ones(mib * 2**18, dtype=np.float32)

    def __enter__(self) -> Sweep:
        for c in self.contexts:
            c.decode = self._after(c, c.decode)
        return self

    def _after(self, ctx: Context, decode):
        def swept(batch) -> None:
            decode(batch)
            t = time.perf_counter()
            self.buf.sum()
            ctx.decode_seconds += time.perf_counter() - t
        return swept

    def __exit__(self, *exc) -> None:
        for c in self.contexts:
            del c.decode  # the class's method again


def code_like(rng: np.random.Generator, n: int) -> list[int]:
    """Token text with the repeats code has: blocks copied from earlier in it, with small edits."""
    out: list[int] = []
    while len(out) < n:
        if len(out) > 200 and rng.random() < 0.5:
            a = int(rng.integers(0, len(out) - 100))
            block = out[a: a + int(rng.integers(20, 100))]
            out += [t if rng.random() > 0.05 else int(rng.integers(5, 200)) for t in block]
        else:
            out += [int(x) for x in rng.integers(5, 200, int(rng.integers(10, 60)))]
    return out[:n]


def fill(index: SuffixIndex, rng: np.random.Generator, tokens: int, per_doc: int = 2000) -> None:
    """Other requests: documents of `per_doc` tokens, prompt half and output half."""
    for i in range(max(1, tokens // per_doc)):
        text = code_like(rng, per_doc)
        doc = index.open(f"key{i % 3}" if i % 4 else "", text[: per_doc // 2])
        index.extend(doc, text[per_doc // 2:])


def index_costs(rng: np.random.Generator, indexed: int) -> None:
    import tracemalloc

    prompt = code_like(rng, indexed)
    times = []
    for _ in range(3):
        index = SuffixIndex(max_tokens=2 * indexed)
        t = time.perf_counter()
        index.open("", prompt)
        times.append(time.perf_counter() - t)
    tracemalloc.start()
    index = SuffixIndex(max_tokens=2 * indexed)
    fill(index, rng, indexed)
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    ts = sorted(times)
    print(f"suffix index: a {indexed:,}-token prompt indexed in {ts[1]:.3f} s (median of 3, {ts[0]:.3f}-{ts[-1]:.3f}); "
          f"{index.tokens:,} tokens of {len(index.docs)} requests take {size / 2**20:.1f} MiB "
          f"({size / max(1, index.tokens):.0f} bytes a token)")
    history = code_like(rng, 32_768)
    n = 2000
    t = time.perf_counter()
    for i in range(n):
        index.propose("key1", history[: 30_000 + i], 16)
    print(f"suffix index: a proposal for a 32K-token request takes {(time.perf_counter() - t) / n * 1e3:.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--indexed", type=int, default=100_000, help="other requests' tokens in the suffix index")
    ap.add_argument("--sweep-mib", type=int, default=32,
                    help="memory read after each decode in the control row (a 32K-token decode of the tiny pair reads ~25 MiB of KV)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    index_costs(rng, args.indexed)
    with tempfile.TemporaryDirectory() as d:
        target = write_tiny_model(Path(d) / "target.gguf", seed=0)
        draft = write_tiny_model(Path(d) / "draft.gguf", seed=1, n_layers=1)
        params = ModelParams(args.context + 1024, 2048, 512, 2, True, "f16", "f16", True, False, 0, 0)
        tc, dc = Context(Model(target), params, 2), Context(Model(draft), params, 2)
        costs = CostModel({1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014}, 0.001)  # drafting pays
        index = SuffixIndex(max_tokens=2 * args.indexed + 2 * args.context)
        fill(index, rng, args.indexed)
        drafters = {"draft model": ModelDrafter(dc),
                    "adaptive": AdaptiveDrafter(adaptive_controller(costs, learn_costs=False), LookupDrafter(), ModelDrafter(dc)),
                    "adaptive+suffix": AdaptiveDrafter(adaptive_controller(costs, learn_costs=False), LookupDrafter(),
                                                       ModelDrafter(dc), SuffixDrafter(index))}
        print(f"\n{'drafter':<16} {'context':>8} {'Python ms/step':>15}   (adaptive+suffix: {index.tokens:,} "
              f"tokens of other requests indexed)")
        for name, drafter in drafters.items():
            engine = Engine(tc, drafter, 2, draft_limit=4)
            for n in (100, args.context):
                prompt = [int(x) for x in rng.integers(5, 200, n)]
                ms = python_ms_per_step(engine, [tc, dc], prompt, args.steps)
                print(f"{name:<16} {n:>8,} {ms:>15.3f}", flush=True)
            prompt = [int(x) for x in rng.integers(5, 200, 100)]
            with Sweep([tc, dc], args.sweep_mib):
                ms = python_ms_per_step(engine, [tc, dc], prompt, args.steps)
            print(f"{name:<16} {100:>8,} {ms:>15.3f}   caches emptied after each decode ({args.sweep_mib} MiB read)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
