#!/usr/bin/env python3
"""Agent turns resent to a hybrid or sliding-window model: tokens evaluated again, and TTFT, side by
side with llama-server's context checkpoints (the same llama.cpp sources).

    python scripts/resent_turns.py [--model gemma|hybrid|both] [--sizes 2048,8192,16384] [--answer 128]
                                   [--rounds 2] [--without] [--json]
    (also: python scripts/serve_bench.py --turns ...)

Two conversations, rendered by Qwen3.5's real chat template (llama.cpp's models/templates, the
sdist this project pins; tests/support/templates.py fetches it):
- `reasoning`: four turns of an agent; the template drops each earlier answer's `<think>` block, so
  every turn's prompt departs from the last one where the last answer began (a few tokens before
  the last prompt's end) and goes on with the answer and a new request;
- `system`: the same first turn sent again with one line near the system prompt's start changed
  (a header with the time, as Claude Code changes one between requests).
The system prompt is this repository's docs, cut so the first turn holds --sizes tokens. Models:
Gemma 3 270M (real weights, a 512-token window; text in its own tokens) and a small hybrid qwen35
model (app/gguf/synthetic.py, random weights; the same token sequence mapped into its 4,096-token
vocabulary). Each request is a streamed `/completion` with the prompt's token ids and an answer of
--answer tokens (greedy, read to its end: the cache then holds it, past the rollback snapshots of
a hybrid model, as an agent's turn leaves it); TTFT at its first streamed token; both servers
report what they evaluated (`timings.prompt_n`) and reused (`timings.cache_n`). `--without` adds
specdeck with `--ctx-checkpoints 0` (what a resent turn costs without them).

Servers: `specdeck serve --parallel 1` (its default --ctx-checkpoints 8, --checkpoint-min-step
4096) and `llama-server -np 1 --ctx-checkpoints 8 --checkpoint-min-step 4096`, one at a time,
ABBA (each runs twice, who goes first alternating), the same context, threads and flash attention
(off). Figures: tokens evaluated per resent turn (the same in every run), and TTFT resent / cold
per run, then the median with its min-max. Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from app.commands.anchors import find_llama_server, free_port  # noqa: E402
from app.ops.client import wait_until_ready  # noqa: E402

HYBRID_VOCAB = 4096
ANSWER = ("I changed `{f}` as asked: the loop now stops at the first match and the error names the file. "
          "The tests in tests/test_{f}.py cover both cases.")
REASONING = ("The user wants {f} changed. I should read the module first, find where the loop runs, "
             "then keep the public names as they are and add a test for the empty case.")


def template() -> str:
    from support.templates import templates_dir

    return (templates_dir() / "Qwen3.5-4B.jinja").read_text()


def render(tmpl: str, messages: list[dict]) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(tmpl, "<|im_end|>", "", add_generation_prompt=True)(messages=messages).prompt


def docs_text() -> str:
    return "".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def system_prompt(case: str, size: int, encode, tmpl: str, base: list[dict]) -> str:
    """A system prompt of this repository's docs, cut so the first turn holds `size` tokens; its first
    line names the case, so no case starts from another's cached prefix."""
    words = docs_text()
    cut = len(words)
    while True:
        system = f"Session {case}-{size}.\nCurrent time: 10:01.\n" + words[:cut]
        first = encode(render(tmpl, [{"role": "system", "content": system}] + base))
        if len(first) <= size or cut < 100:
            return system
        cut = int(cut * size / len(first) * 0.98)


def conversations(size: int, encode, tmpl: str) -> dict[str, list[list[int]]]:
    """The token ids of each request: four turns of the reasoning conversation, and the system
    conversation's first turn then that turn again with its header changed."""
    base = [{"role": "user", "content": "Fix the loop in cache.py."}]
    system = system_prompt("reasoning", size, encode, tmpl, base)
    messages = [{"role": "system", "content": system}] + base
    turns = []
    for i, f in enumerate(["cache", "engine", "kv", "saved"]):
        turns.append(encode(render(tmpl, messages)))
        messages = messages + [{"role": "assistant", "content": ANSWER.format(f=f), "reasoning_content": REASONING.format(f=f)},
                               {"role": "user", "content": f"Now do the same for {['engine', 'kv', 'saved', 'loader'][i]}.py."}]
    system = system_prompt("system", size, encode, tmpl, base)
    first, changed = ([{"role": "system", "content": s}] + base for s in (system, system.replace("10:01", "10:02", 1)))
    return {"reasoning": turns, "system": [encode(render(tmpl, first)), encode(render(tmpl, changed))]}


ANSWER_TOKENS = {"n": 128}


def complete(url: str, ids: list[int]) -> dict:
    """One turn: the prompt's ids, an answer of ANSWER_TOKENS greedy tokens read to its end (the cache
    then holds it, as an agent's turn leaves it); TTFT at the first streamed token."""
    t, first, timings = time.perf_counter(), None, {}
    body = {"prompt": ids, "n_predict": ANSWER_TOKENS["n"], "temperature": 0, "cache_prompt": True, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", url + "/completion", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if first is None and (chunk.get("content") or chunk.get("tokens")):
                first = time.perf_counter() - t
            timings = chunk.get("timings", timings)
    return {"ttft_s": first if first is not None else time.perf_counter() - t,
            "evaluated": int(timings.get("prompt_n", -1)), "reused": int(timings.get("cache_n", -1)), "tokens": len(ids)}


def run_server(command, sizes: list[int], convs: dict) -> dict:
    port = free_port()
    proc = subprocess.Popen(command(port), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc)
        out = {}
        for size in sizes:
            for name, turns in convs[size].items():
                out[f"{name}@{size}"] = [complete(url, ids) for ids in turns]
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def model_inputs(which: str, tmp: Path, sizes: list[int]) -> tuple[Path, dict]:
    from app.engine.text import Tokenizer
    from app.llama.context import Model
    from app.models.catalog import load_catalog
    from app.models.fetch import Fetcher
    from app.settings import hub_settings, paths

    gemma = Fetcher(paths(), hub_settings(), __import__("rich.console").console.Console(quiet=True)).existing(
        load_catalog().model("gemma3-270m-q4_k_m")).path
    m = Model(gemma)
    tok = Tokenizer(m, None)
    encode = lambda text: tok.encode(text, add_special=True)  # noqa: E731
    if which == "hybrid":
        from app.gguf.synthetic import SHAPES, small, write_random

        path = write_random(tmp / "hybrid.gguf", small(SHAPES["qwen3.6-27b"], HYBRID_VOCAB), seed=3)
        encode = lambda text: [8 + t % (HYBRID_VOCAB - 16) for t in tok.encode(text, add_special=True)]  # noqa: E731
    else:
        path = gemma
    tmpl = template()
    convs = {s: conversations(s, encode, tmpl) for s in sizes}
    m.close()
    return path, convs


def measure(which: str, sizes: list[int], threads: int, rounds: int, without: bool = False, only_specdeck: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="resent-") as tmp:
        path, convs = model_inputs(which, Path(tmp), sizes)
        ctx = max(len(t) for c in convs.values() for ts in c.values() for t in ts) + ANSWER_TOKENS["n"] + 512
        ctx = (ctx + 255) // 256 * 256
        servers = {"specdeck": lambda port: [sys.executable, "-m", "app.cli", "serve", "--target", str(path), "--port", str(port),
                                             "--parallel", "1", "--ctx", str(ctx), "--threads", str(threads),
                                             "--flash-attn", "off", "--ctx-checkpoints", "8", "--checkpoint-min-step", "4096"]}
        if without:  # the same server with checkpoints off: what a resent turn costs without them
            servers["specdeck-no-checkpoints"] = lambda port: servers["specdeck"](port)[:-4] + ["--ctx-checkpoints", "0"]
        server = None if only_specdeck else find_llama_server()
        if server:
            servers["llama-server"] = lambda port: [str(server), "-m", str(path), "--port", str(port), "--host", "127.0.0.1",
                                                    "-np", "1", "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
                                                    "--no-warmup", "-fa", "off", "--ctx-checkpoints", "8",
                                                    "--checkpoint-min-step", "4096"]
        order = list(servers)
        runs: dict[str, list[dict]] = {name: [] for name in servers}
        for _ in range(rounds):
            for name in order:
                runs[name].append(run_server(servers[name], sizes, convs))
            order.reverse()
        report = {"model": which, "ctx": ctx, "cases": {}}
        for case in runs[order[0]][0]:
            size = int(case.split("@")[1])
            turns = convs[size][case.split("@")[0]]
            new = [len(turns[0])] + [len(t) - prefix(p, t) for p, t in zip(turns, turns[1:])]
            row = {"tokens": [len(t) for t in turns], "new_tokens": new}
            for name, rs in runs.items():
                row[name] = {"evaluated": [r["evaluated"] for r in rs[0][case]],
                             "ttft_cold_s": statistics.median(r[case][0]["ttft_s"] for r in rs),
                             "resent_vs_cold": [_median_range([r[case][i]["ttft_s"] / r[case][0]["ttft_s"] for r in rs])
                                                for i in range(1, len(turns))]}
            report["cases"][case] = row
        return report


def _median_range(xs: list[float]) -> list[float]:
    return [statistics.median(xs), min(xs), max(xs)]


def show(report: dict) -> None:
    print(f"\n{report['model']} (ctx {report['ctx']:,}): tokens evaluated per turn [new tokens]; TTFT resent / cold, median (min-max)")
    for case, row in report["cases"].items():
        print(f"  {case}: tokens {row['tokens']}, new {row['new_tokens']}")
        for name in ("specdeck", "specdeck-no-checkpoints", "llama-server"):
            if name in row:
                r = row[name]
                ratios = ", ".join(f"{m:.3f} ({lo:.3f}-{hi:.3f})" for m, lo, hi in r["resent_vs_cold"])
                print(f"    {name:23s} evaluated {r['evaluated']}, cold {r['ttft_cold_s']:.2f} s, resent/cold {ratios}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["gemma", "hybrid", "both"], default="both")
    ap.add_argument("--sizes", default="2048,8192,16384")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="runs per server, alternating (ABBA with 2)")
    ap.add_argument("--answer", type=int, default=128, help="tokens generated per turn")
    ap.add_argument("--without", action="store_true", help="also specdeck with --ctx-checkpoints 0")
    ap.add_argument("--no-llama-server", action="store_true", help="specdeck alone")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    ANSWER_TOKENS["n"] = args.answer
    reports = [measure(m, sizes, args.threads, args.rounds, args.without, args.no_llama_server) for m in (["gemma", "hybrid"] if args.model == "both" else [args.model])]
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        for r in reports:
            show(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
