#!/usr/bin/env python3
"""Log-probabilities with speculation on and off, on the real Qwen2.5-Coder pair served in-process:
for each prompt, greedy, the tokens must agree (up to a near-tie) and the log-probabilities differ
only by llama.cpp's batch numerics (a verify decode of k rows against one row at a time).

    python scripts/logprobs_spec.py [--tokens 64]

Prints per prompt: tokens compared, max and median |logprob difference|, and where the outputs
part, if they do."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import openai  # noqa: E402
from conftest import real_fetcher  # noqa: E402
from support.live import LiveServer, free_port  # noqa: E402

from app.models.catalog import load_catalog  # noqa: E402
from app.server.settings import ServeSettings  # noqa: E402

PROMPTS = ["Write a Python function that adds two numbers.", "Explain what a mutex is in two sentences.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Rewrite this loop as a list comprehension: for x in xs: if x > 0: out.append(x * 2)"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    cat = load_catalog()
    preset = cat.preset("coder-1.5b")
    f = real_fetcher()
    s = LiveServer(f.ensure(cat.model(preset.target)).path, f.ensure(cat.model(preset.draft or "")).path,
                   ServeSettings(port=free_port()), parallel=1, ctx=4096)
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=600)
    worst_all = 0.0
    try:
        print(f"{'prompt':<44} {'tokens':>6} {'max |d|':>8} {'median |d|':>10}  parted at")
        for p in PROMPTS:
            runs = []
            for spec in (True, False):
                r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": p}], max_tokens=args.tokens,
                                              temperature=0, logprobs=True, top_logprobs=5,
                                              extra_body={"speculative": {"enabled": spec}})
                runs.append(r.choices[0].logprobs.content)
            on, off = runs
            n = next((i for i, (a, b) in enumerate(zip(on, off)) if a.token != b.token), min(len(on), len(off)))
            d = [abs(a.logprob - b.logprob) for a, b in zip(on[:n], off[:n])]
            worst_all = max(worst_all, max(d))
            if n == min(len(on), len(off)):
                parted = "-"
            else:  # the plain run's top-two gap there: a near-tie flips under batch numerics
                top = off[n].top_logprobs
                parted = f"{n} (top-two gap {top[0].logprob - top[1].logprob:.3f})"
            print(f"{p[:44].replace(chr(10), ' '):<44} {n:>6} {max(d):>8.4f} {statistics.median(d):>10.5f}  {parted}")
    finally:
        s.close()
    print(f"largest difference: {worst_all:.4f} (tolerance 1.0, as `specdeck verify`)")
    return 0 if worst_all < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
