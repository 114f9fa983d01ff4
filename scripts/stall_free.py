#!/usr/bin/env python3
"""Answers beside a long prompt: a 32-token completion and a 256-token answer (streamed, greedy),
each alone and while a long prompt is evaluated, and the long prompt alone and beside them, for
`specdeck serve` in the modes asked (default: decode first, its default, `--tbt-budget 1.5` with
`--mixed-batch auto`, and prompts first, `--tbt-budget 0`; `unmixed`: decode first with
`--mixed-batch off`), and llama-server `-np 4` where it is built. `--f32-target` serves the preset's
target rewritten as F32 (whose decode is memory-bound, as a card's is) with the same draft, and
gives llama-server the same file.

    python scripts/stall_free.py [--preset coder-1.5b] [--long 16384] [--rounds 2] [--modes decode_first,prompts_first]
                                 [--at TOKENS] [--f32-target] [--flash-attn off|on] [--no-anchor | --anchor-rounds N] [--json]

`--rounds` per mode, in ABBA order (A B, then B A, ...; llama-server after them). A round is two
halves, each on a server started alone (never two llama.cpp processes at once), so the pool holds the
same cells in both: on `/completion` with token ids, two short prompts read once; alone, the
completion (TTFT and total) and the answer, each a resent prompt, then the long prompt (to its one
token); beside, on a new server, the same two short prompts read once, the same long prompt, and
once its first progress chunk shows it is being read (`--at`: once it shows that many of its tokens
read), the completion and then the answer again (their TTFT and totals beside it; their text against
alone's), and the long prompt's time beside.
(With flash attention off a decode's attention spans every cell in use, another sequence's too: with
another long prompt's cells cached beside the answers in one half and not the other, what the pool
held moved every ratio more than the scheduler did.)
The answers are drafted from their own text only (`"speculative": {"cross_request": false}`); a text
beside unlike alone's is a greedy near-tie that the verify batches' shape tipped (`specdeck verify` on
the prompt names it). What the issue asks: completion total beside / alone <= 1.5 by default; the
long prompt's time beside <= its time alone + the answers' time alone, +5 %. Medians with min-max over
the rounds (a round's halves run minutes apart, and a VM's speed moves between them: compare rounds,
not one); loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prefill_fairness import LongPrompt, ids, start, stop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from app.commands.anchors import find_llama_server  # noqa: E402
from app.commands.standin import f32_standin  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.fetch import Fetcher  # noqa: E402
from app.settings import hub_settings, paths  # noqa: E402

SHORT = 64  # tokens of the completion's and the answer's prompts
MODES = {"decode_first": ["--tbt-budget", "1.5", "--mixed-batch", "auto"],
         "unmixed": ["--tbt-budget", "1.5", "--mixed-batch", "off"],
         "prompts_first": ["--tbt-budget", "0"]}


def pair(fetcher: Fetcher, preset: str) -> tuple[Path, Path]:
    """The preset's target and draft files, as `specdeck pull` left them."""
    catalog = load_catalog()
    p = catalog.preset(preset)
    files = [fetcher.existing(catalog.model(name)) for name in (p.target, p.draft)]
    if None in files:
        raise SystemExit(f"the preset's files are not here: run `specdeck pull {preset}` first")
    return files[0].path, files[1].path


def stream(url: str, prompt: list[int], n: int) -> dict:
    """A greedy streamed /completion: its TTFT, total seconds and tokens."""
    t = time.perf_counter()
    first, tokens, text = None, 0, []
    # each answer drafted from its own text only: the one beside would otherwise copy the same prompt's
    # answer alone from the suffix index (llama-server, with no draft here, ignores the field)
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True, "cache_prompt": True,
            "speculative": {"cross_request": False}}
    with httpx.stream("POST", url + "/completion", json=body, timeout=3600) as r:
        if r.status_code != 200:
            raise SystemExit(f"{url}: refused: {r.status_code} {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content"):
                first = first or time.perf_counter() - t
                tokens += 1
                text.append(chunk["content"])
    return {"ttft_s": first, "total_s": time.perf_counter() - t, "tokens": tokens, "text": "".join(text)}


def long_alone(url: str, prompt: list[int]) -> float:
    t = time.perf_counter()
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0}, timeout=7200)
    if r.status_code != 200:
        raise SystemExit(f"{url}: the long prompt was refused: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t


@contextmanager
def served(command: list[str]) -> Iterator[str]:
    """A server started alone for one half of a round, stopped after it; yields its URL."""
    url, proc = start(command)
    try:
        yield url
    finally:
        stop(proc)


def read_once(url: str, short: tuple[list[int], list[int]]) -> None:
    """The short prompts read once: alone and beside, each is then a prompt resent (cached alike)."""
    for p in short:
        stream(url, p, 1)


def alone(url: str, short: tuple[list[int], list[int]], long: list[int]) -> dict:
    """The first half of a round: the answers alone, then the long prompt alone."""
    read_once(url, short)
    completion, answer = stream(url, short[0], 32), stream(url, short[1], 256)
    return {"completion_alone": completion, "answer_alone": answer, "long_alone_s": long_alone(url, long)}


def read_to(lp: LongPrompt, at: int) -> int:
    """Waits until the long prompt's progress shows `at` of its tokens read (or it ends); how many it shows."""
    while lp.thread.is_alive() and lp.progress[-1]["processed"] < at:
        time.sleep(0.1)
    return lp.progress[-1]["processed"]


def beside(url: str, short: tuple[list[int], list[int]], long: list[int], at: int) -> dict:
    """The second half, on a new server: the same long prompt, and the answers once it is being read
    (and `at` of its tokens are)."""
    read_once(url, short)
    lp = LongPrompt(url, long)
    t0 = time.perf_counter()
    lp.evaluating.wait(3600)
    if lp.error or not lp.progress:
        raise SystemExit(f"{url}: the long prompt was refused or sent no progress: {lp.error}")
    read = read_to(lp, at)
    completion, answer = stream(url, short[0], 32), stream(url, short[1], 256)
    lp.thread.join(7200)
    took = time.perf_counter() - t0
    lp.close()
    return {"completion_beside": completion, "answer_beside": answer, "long_beside_s": took, "answers_at": read}


def measure(command: list[str], seed: int, long_n: int, at: int, specdeck: bool) -> dict:
    """One round: each half on its own server (see the module's docstring)."""
    with served(command) as url:
        short, long = (ids(url, SHORT, seed), ids(url, SHORT, seed + 1)), ids(url, long_n, seed + 2)
        r = alone(url, short, long)
    with served(command) as url:
        r |= beside(url, short, long, at)
        if specdeck:  # whether the answers' steps carried the prompt (the last try's verdict)
            r["mixed_batch"] = httpx.get(url + "/v1/status", timeout=30).json().get("mixed_batch")
    r["same_text"] = {k: r[f"{k}_alone"]["text"] == r[f"{k}_beside"]["text"] for k in ("completion", "answer")}
    return r


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--long", type=int, default=16384, help="tokens of the long prompt (default 16,384)")
    ap.add_argument("--at", type=int, default=0, help="the answers start once this many of the long prompt's tokens "
                    "are read (default 0: at its first progress)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each mode, in ABBA order")
    ap.add_argument("--modes", default="decode_first,prompts_first", help=f"specdeck's modes, of {', '.join(MODES)}")
    ap.add_argument("--f32-target", action="store_true", help="the target as F32 (a card's cost ratio on a CPU)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--flash-attn", choices=("off", "on"), default="off",
                    help="for both servers (default off: the planner's choice on a CPU)")
    ap.add_argument("--no-anchor", action="store_true", help="leave llama-server out")
    ap.add_argument("--anchor-rounds", type=int, help="rounds of llama-server (default: --rounds)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: a list of {', '.join(MODES)}")
    if not 0 <= args.at < args.long:
        raise SystemExit(f"--at: a number of tokens from 0 to under --long ({args.long})")
    ctx = args.long + 2048
    fetcher = Fetcher(paths(), hub_settings(), Console(stderr=True))
    target, draft = pair(fetcher, args.preset)
    if args.f32_target:
        target = f32_standin(target, fetcher.paths.store, fetcher.records, args.threads, say=print)
    base = [sys.executable, "-m", "app.cli", "serve", "--target", str(target), "--draft", str(draft), "--parallel", "4",
            "--ctx", str(ctx), "--threads", str(args.threads), "--flash-attn", args.flash_attn, "--request-timeout", "7200"]
    commands = {m: base + MODES[m] for m in modes}
    order = [m for i in range(args.rounds) for m in (modes if i % 2 == 0 else modes[::-1])]
    server = None if args.no_anchor else find_llama_server()
    if server is not None:
        commands["llama_server_np4"] = [str(server), "-m", str(target), "--host", "127.0.0.1", "-np", "4", "-kvu",
                                        "-c", str(ctx), "-t", str(args.threads), "-tb", str(args.threads), "-fa", args.flash_attn]
        order += ["llama_server_np4"] * (args.rounds if args.anchor_rounds is None else args.anchor_rounds)
    rounds: dict[str, list[dict]] = {name: [] for name in commands}
    for i, name in enumerate(order):
        rounds[name].append(measure(commands[name], 1000 * (i + 1), args.long, args.at, specdeck=name in MODES))
        r = rounds[name][-1]
        print(f"round {i + 1} {name}: completion {r['completion_alone']['total_s']:.1f} s alone, "
              f"{r['completion_beside']['total_s']:.1f} s beside (from {r['answers_at']:,} read); "
              f"answer {r['answer_alone']['total_s']:.1f} / {r['answer_beside']['total_s']:.1f} s; "
              f"long {r['long_alone_s']:.0f} / {r['long_beside_s']:.0f} s",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"long_tokens": args.long, "at": args.at, "rounds": rounds}, indent=2))
        return 0
    print(f"long prompt {args.long:,} tokens (the answers from {args.at:,} read), completion 32 tokens, "
          f"answer 256 tokens ({SHORT}-token prompts), seconds: median (min-max) over the rounds")
    for name, rs in rounds.items():
        c = [r["completion_beside"]["total_s"] / r["completion_alone"]["total_s"] for r in rs]
        a = [r["answer_beside"]["total_s"] / r["answer_alone"]["total_s"] for r in rs]
        ct = [r["completion_beside"]["ttft_s"] / r["completion_alone"]["ttft_s"] for r in rs]
        lost = [(r["long_beside_s"] - r["long_alone_s"]) / (r["completion_alone"]["total_s"] + r["answer_alone"]["total_s"])
                for r in rs]
        budget = [r["long_beside_s"] / (r["long_alone_s"] + r["completion_alone"]["total_s"] + r["answer_alone"]["total_s"])
                  for r in rs]
        print(f"{name} ({len(rs)} rounds): completion total beside / alone {spread(c)} (TTFT {spread(ct)}); "
              f"answer {spread(a)}; long prompt alone {spread([r['long_alone_s'] for r in rs], '{:.0f}')} s, "
              f"beside {spread([r['long_beside_s'] for r in rs], '{:.0f}')} s: lost / the answers' time alone "
              f"{spread(lost)}, beside / (alone + answers) {spread(budget, '{:.3f}')}; "
              f"same text beside as alone: completion {sum(r['same_text']['completion'] for r in rs)}, "
              f"answer {sum(r['same_text']['answer'] for r in rs)} of {len(rs)}"
              + (f"; mixed batch paid: {[r['mixed_batch']['pays'] for r in rs]}" if name in MODES else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
