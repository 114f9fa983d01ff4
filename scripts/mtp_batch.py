#!/usr/bin/env python3
"""The MTP head's drafts for several slots: one head decode per draft step with a row per slot
(`MtpDrafter.propose_many`, as llama.cpp's draft-mtp batches its slots) against one head decode per
slot per step (`propose`, slot after slot), on the MTP stand-in (`app.gguf.synthetic.write_mtp_standin`).

    python scripts/mtp_batch.py [--vocab 65536] [--slots 2 4] [--k 3] [--rounds 20]

Each round times both ways over the same slots' histories, in ABBA order; the ratio is one-by-one
over batched, per round, reported as the median with min-max. A head token reads the head's block
and the whole output matrix: `--vocab` sets the output matrix's rows (Qwen3.6's is 248,320; the
stand-in's width is 512, the real head's 5,120). Greedy drafts with no p_min cut-off, so both ways
decode the same k tokens for every slot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.ratios import paired  # noqa: E402
from app.engine.drafters.base import Ask  # noqa: E402
from app.engine.drafters.mtp import MtpDrafter  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.gguf.synthetic import write_mtp_standin  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402


def rig(model: Model, slots: int, threads: int) -> tuple[Engine, MtpDrafter]:
    p = ModelParams(4096, 512, 512, slots, True, "f16", "f16", True, False, 4, 0)
    target = Context(model, p, threads)
    head = MtpDrafter(target, Context(model, ModelParams(4096, 512, 512, slots, True, "f16", "f16", True, False, 0, 0),
                                      threads, mtp_of=target), p_min=0.0)
    return Engine(target, head, slots), head


def histories(engine: Engine, slots: int, vocab: int) -> list[list[int]]:
    """Each slot's prompt evaluated (the head follows it) and a first token: the histories drafts follow."""
    rng = np.random.default_rng(0)
    out = []
    for s in range(slots):
        prompt = [int(t) for t in rng.integers(3, vocab - 3, 200)]
        engine.start(engine.slots[s], Request(prompt=prompt, max_tokens=64, speculative=SpecParams(n_max=3)))
        out.append(list(engine.slots[s].tokens))
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--slots", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = Model(write_mtp_standin(Path(d) / "mtp.gguf", n_vocab=a.vocab), load_mtp=True)
        print(f"MTP stand-in: vocabulary {a.vocab:,}, width {model.n_embd_out}; k = {a.k}; {a.rounds} ABBA rounds")
        print(f"{'slots':>5}  {'batched ms':>10}  {'one-by-one ms':>13}  {'one-by-one / batched':>24}")
        for slots in a.slots:
            engine, head = rig(model, slots, a.threads)
            hs = histories(engine, slots, a.vocab)
            asks = [Ask(s, h, a.k) for s, h in enumerate(hs)]

            def batched() -> None:
                drafts = head.propose_many(asks)
                assert all(len(x.tokens) == a.k for x in drafts)

            def one_by_one() -> None:
                for x in asks:
                    assert len(head.propose(x.seq, x.history, x.k).tokens) == a.k

            batched(), one_by_one()  # warm
            tb, to = [], []
            for r in range(a.rounds):
                order = (batched, one_by_one) if r % 2 == 0 else (one_by_one, batched)
                got = {f.__name__: timed(f) for f in order}
                tb.append(got["batched"])
                to.append(got["one_by_one"])
            mid, lo, hi = paired(to, tb)
            print(f"{slots:>5}  {1e3 * statistics.median(tb):>10.2f}  {1e3 * statistics.median(to):>13.2f}  "
                  f"{mid:>8.2f} ({lo:.2f}-{hi:.2f})")
            head.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
