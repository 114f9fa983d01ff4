#!/usr/bin/env python3
"""The server under load, side by side with llama-server built from the same llama.cpp sources.

    python scripts/serve_bench.py [--preset coder-1.5b] [--tokens 128] [--rounds 2] [--workload W]
                                  [--steady SECONDS] [--ttft-only] [--ttft-copies N] [--json]

Both servers (`specdeck serve --parallel 4`, `llama-server -np 4`, same models, context, threads
and flash attention: off by default, as specdeck plans a CPU, so both decode with the same numerics)
run at once, and measurements alternate between them: aggregate generated tokens/s with
1, 2 and 4 concurrent clients (greedy, --tokens each, `ignore_eos`, so both servers generate the
same count; with `--until-eos` each answer ends at the model's end of answer, --tokens a cap).
Workloads: `helpers` (default) gives each client its own short code prompt; `coding` sends the
speed issue's four prompts (code completion, code edit, code question, prose; chat rendered with
the model's template) n at a time; `agent` sends the agent workload's turns
(app/commands/workloads.py) in session order, n at a time. Every measurement sends its own API key
to specdeck, so its suffix index starts empty for it (the index is partitioned by key): no
measurement drafts from an earlier measurement's answers to the same prompts. specdeck's prompt
cache is per key too, so before each measurement the new key sends the measurement's prompts to
`/completion` with `n_predict` 0 (untimed: the prompts cached, nothing generated, no answer indexed), as llama-server's
cache holds them from the warm-up both servers get. Each ratio is taken per
round (the two servers measured back to back, who goes first alternating), then the median of the
rounds with its min and max; the same for the requests' mean latency (llama-server's over
specdeck's: a server that finishes one request early shortens it, while tokens/s counts until the
last request ends). With `--steady SECONDS` each measurement instead keeps n requests under way
for that long, each client sending its prompts again and again, and counts the tokens that arrive
in the window: the server's rate at n concurrent streams, where a request that ends early is
followed by the next rather than leaving its client idle until the last one ends (specdeck's
requests then keep out of the suffix index: a resent prompt would draft from its own last answer).
Then time to first token for a ~2.3K-token prompt sent cold and then
again with a new turn at its end (the prompt cache; `--ttft-copies N` sets its length, ~290 tokens a
copy, `--ttft-only` measures nothing else). Loopback only; bounded counts; stops by itself.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import find_llama_server, free_port  # noqa: E402
from app.commands.equivalence import CODE_EDIT_MODULE  # noqa: E402
from app.commands.ratios import paired  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.fetch import Fetcher  # noqa: E402
from app.ops.client import wait_until_ready  # noqa: E402
from app.settings import hub_settings, paths  # noqa: E402

DRAFTS: dict[str, list[int]] = {}  # url -> [drafted, accepted] over the timed requests (specdeck's timings)
KEYS = {f"m{i}": f"sk-bench-{i:03d}-{os.urandom(4).hex()}" for i in range(64)}  # one per measurement
CURRENT = {"key": "m0"}
IGNORE_EOS = {"on": True}  # off with --until-eos: each answer ends where the model ends it


def complete(url: str, prompt: str, tokens: int) -> int:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": IGNORE_EOS["on"]}
    headers = {"Authorization": f"Bearer {KEYS[CURRENT['key']]}"}  # llama-server ignores it
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=600).json()
    count_drafts(url, r.get("timings") or {})
    return int(r["usage"]["completion_tokens"])


def count_drafts(url: str, timings: dict) -> None:
    """Add a request's drafted and kept tokens (its llama.cpp-style timings) to the server's totals."""
    totals = DRAFTS.setdefault(url, [0, 0])
    totals[0] += int(timings.get("draft_n") or 0)
    totals[1] += int(timings.get("draft_n_accepted") or 0)


def helper_prompts(streams: int) -> list[str]:
    return [f"# file {i}\n# a small utility, number {i}\ndef helper_{i}(values):\n" for i in range(streams)]


def coding_prompts(target: Path, items: list[dict] | None = None) -> list[str]:
    """The speed issue's four prompts (or `items`) as text: chat messages rendered with the model's
    own template, sent to both servers as the same raw prompt (llama-server's own chat formatting
    may differ)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from app.commands.equivalence import BUILTIN_PROMPTS
    from app.gguf.info import read_model_info

    vocab = read_model_info(target).vocab
    name = lambda i: vocab.tokens[i] if i is not None else ""  # noqa: E731
    fmt = Jinja2ChatFormatter(vocab.chat_template, name(vocab.eos_id), name(vocab.bos_id))
    return [item["prompt"] if "prompt" in item else fmt(messages=item["messages"]).prompt
            for item in (BUILTIN_PROMPTS if items is None else items)]


def aggregate(url: str, streams: int, tokens: int, prompts: list[str] | None = None) -> tuple[float, float]:
    """Generated tokens per second over all requests, `streams` of them at a time (by default one
    short code prompt per client), and the requests' mean latency in seconds. Tokens/s counts until
    the last request ends; the mean latency counts each request's own wait, so a request that a
    server finishes early shortens it even where the others still run."""
    prompts = helper_prompts(streams) if prompts is None else prompts

    def timed(p: str) -> tuple[int, float]:
        t = time.perf_counter()
        return complete(url, p, tokens), time.perf_counter() - t

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        done = list(pool.map(timed, prompts))
    return sum(n for n, _ in done) / (time.perf_counter() - t), statistics.mean(s for _, s in done)


def steady(url: str, streams: int, tokens: int, prompts: list[str], seconds: float,
           extra: dict | None = None) -> tuple[float, float]:
    """Tokens/s at a constant `streams` requests under way: each client sends its prompts (client i:
    prompts i, i + streams, ... of the list, in turn) again and again, the next as soon as the last
    answer ends, for `seconds`. Each answer is streamed (llama.cpp's /completion, token ids in every
    chunk) and only the tokens that arrive within the window count, so no request's tail, and no
    client left alone at the end, weighs on it. Requests under way at the end are read to their end
    (uncounted) before the next measurement. Also the mean latency of all the requests. `extra` is
    added to every request's body."""
    deadline = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {KEYS[CURRENT['key']]}"}

    def client(i: int) -> tuple[int, list[float]]:
        mine = prompts[i::streams] or [prompts[i % len(prompts)]]
        counted, waits, j = 0, [], 0
        while time.perf_counter() < deadline:
            body = {"prompt": mine[j % len(mine)], "n_predict": tokens, "temperature": 0, "stream": True,
                    "cache_prompt": True, "ignore_eos": IGNORE_EOS["on"], **(extra or {})}
            j += 1
            t = time.perf_counter()
            with httpx.stream("POST", url + "/completion", json=body, headers=headers, timeout=600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if time.perf_counter() <= deadline:
                        counted += len(chunk.get("tokens") or [])
                    if chunk.get("stop"):
                        count_drafts(url, chunk.get("timings") or {})
            waits.append(time.perf_counter() - t)
        return counted, waits

    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        done = list(pool.map(client, range(streams)))
    return sum(n for n, _ in done) / seconds, statistics.mean(w for _, ws in done for w in ws)


def prime(url: str, prompts: list[str]) -> None:
    """The current key's prompt cache holds these prompts (evaluated, nothing generated)."""
    headers = {"Authorization": f"Bearer {KEYS[CURRENT['key']]}"}
    for p in prompts:  # llama.cpp's /completion: n_predict 0 evaluates the prompt only
        httpx.post(url + "/completion", json={"prompt": p, "n_predict": 0}, headers=headers, timeout=600).raise_for_status()


def ttft(url: str, prompt: str) -> tuple[float, float]:
    """Seconds to the first streamed token: the conversation cold, then resent with one more turn
    (what an agent sends next: the whole conversation again, a few new tokens at its end). Each
    answer is read to its end before the next request, as an agent reads it: a stream dropped at
    its first token leaves the slot busy for a moment, and llama-server then gives the resent
    conversation another slot, without the cache."""
    def once(text: str) -> float:
        t, first = time.perf_counter(), None
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": text, "max_tokens": 4, "temperature": 0,
                                                                 "stream": True, "cache_prompt": True}, timeout=600,
                          headers={"Authorization": f"Bearer {KEYS[CURRENT['key']]}"}) as r:
            if r.status_code != 200:  # e.g. llama-server -np 4 gives each slot a quarter of -c (else -kvu)
                raise SystemExit(f"{url}: the TTFT conversation was refused: {r.status_code} {r.read().decode()[:300]}")
            for line in r.iter_lines():
                if first is None and line.startswith("data: ") and line != "data: [DONE]":
                    first = time.perf_counter() - t
        if first is None:
            raise SystemExit(f"{url}: the TTFT conversation streamed no token")
        return first

    return once(prompt), once(prompt + "\n# Next turn: now add a docstring to the first function.\n")


def throughput(samples: dict, latency: dict, drafts: list[int]) -> dict:
    """One server's figures over the rounds: median tokens/s and request latency per stream count."""
    out = {f"streams_{n}": statistics.median(v) for n, v in samples.items()}
    out.update({f"streams_{n}_all": v for n, v in samples.items()})
    out.update({f"latency_{n}_s": statistics.median(v) for n, v in latency.items()})
    out.update({"drafted": drafts[0], "accepted": drafts[1]})
    return out


def start(command) -> tuple[str, subprocess.Popen]:
    """A server on a free loopback port, ready."""
    port = free_port()
    proc = subprocess.Popen(command(port), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc)
    except BaseException:
        proc.terminate()
        raise
    return url, proc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of 1/2/4 streams per server, interleaved (median)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--specdeck-arg", action="append", default=[], help="extra flag for specdeck serve (repeatable)")
    ap.add_argument("--llama-server-arg", action="append", default=[], help="extra flag for llama-server (repeatable)")
    ap.add_argument("--workload", choices=["helpers", "coding", "agent"], default="helpers")
    ap.add_argument("--no-ttft", action="store_true", help="skip the long-prompt TTFT check")
    ap.add_argument("--ttft-only", action="store_true", help="only the long-prompt TTFT check (no throughput rounds)")
    ap.add_argument("--ttft-copies", type=int, default=8, metavar="N",
                    help="the TTFT conversation: the code edit's module N times (default 8: ~2,330 tokens; "
                         "~290 tokens each, within the 16K context up to 50)")
    ap.add_argument("--until-eos", action="store_true",
                    help="answers end where the model ends them (--tokens is then a cap), as an agent receives "
                         "them; tokens/s counts what each server generated")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off",
                    help="both servers' flash attention (default off: specdeck's plan on a CPU; llama-server's own "
                         "default, auto, is on)")
    ap.add_argument("--steady", type=float, metavar="SECONDS",
                    help="instead of each measurement's prompts once: n clients each sending theirs again and "
                         "again for SECONDS (a constant n requests under way), tokens/s over that window; specdeck's "
                         "requests then draft from their own text only (`cross_request` off: a resent prompt "
                         "would else draft from its own last answer)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steady is not None and args.steady <= 0:
        ap.error(f"--steady is a window in seconds, above 0 (got {args.steady:g})")
    if not 1 <= args.ttft_copies <= 50:
        ap.error(f"--ttft-copies is 1 to 50 copies of the module (the servers' 16K context; got {args.ttft_copies})")
    if args.ttft_only and args.no_ttft:
        ap.error("--ttft-only and --no-ttft leave nothing to measure")
    IGNORE_EOS["on"] = not args.until_eos
    catalog = load_catalog()
    preset = catalog.preset(args.preset)
    fetcher = Fetcher(paths(), hub_settings(), __import__("rich.console").console.Console(quiet=True))
    target = fetcher.existing(catalog.model(preset.target)).path
    long_prompt = ("# Review this module.\n" + CODE_EDIT_MODULE) * args.ttft_copies  # ~290 tokens a copy
    from app.commands.workloads import agent_turns

    prompts = coding_prompts(target) if args.workload == "coding" else \
        coding_prompts(target, agent_turns()) if args.workload == "agent" else None
    keys = Path(tempfile.mkdtemp()) / "keys"
    keys.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
    commands = {"specdeck": lambda port: [sys.executable, "-m", "app.cli", "serve", args.preset, "--port", str(port),
                                          "--parallel", "4", "--ctx", "16384", "--threads", str(args.threads),
                                          "--api-key-file", str(keys), "--flash-attn", args.flash_attn] + args.specdeck_arg}
    server = find_llama_server()
    if server:
        commands["llama_server_np4"] = lambda port: [str(server), "-m", str(target), "--port", str(port), "--host",
                                                     "127.0.0.1", "-np", "4", "-c", "16384", "-t", str(args.threads),
                                                     "-tb", str(args.threads), "--no-warmup", "-fa", args.flash_attn] \
            + args.llama_server_arg
    # both servers stay up; each measurement alternates between them, so drift in this machine's
    # speed falls on both sides of every ratio
    running = {}
    try:
        for name, command in commands.items():
            running[name] = start(command)
        samples: dict = {name: {n: [] for n in (1, 2, 4)} for name in running}
        latency: dict = {name: {n: [] for n in (1, 2, 4)} for name in running}  # mean seconds a request
        for url, _proc in running.values():  # both evaluate the bench prompts once (their prompt caches)
            if not args.ttft_only:
                aggregate(url, 4, 1, prompts)
        DRAFTS.clear()
        order = list(running)
        measurement = 0
        for _ in range(0 if args.ttft_only else args.rounds):
            for n in (1, 2, 4):
                measurement += 1
                CURRENT["key"] = f"m{measurement}"  # an empty suffix index for this measurement
                for name in order:
                    if name == "specdeck":
                        prime(running[name][0], prompts if prompts is not None else helper_prompts(n))
                    if args.steady:
                        own = {"speculative": {"cross_request": False}} if name == "specdeck" else None
                        tok_s, wait = steady(running[name][0], n, args.tokens,
                                             prompts if prompts is not None else helper_prompts(n), args.steady, own)
                    else:
                        tok_s, wait = aggregate(running[name][0], n, args.tokens, prompts)
                    samples[name][n].append(tok_s)
                    latency[name][n].append(wait)
            order.reverse()  # ABBA: who goes first alternates, so a drift falls on both sides
        results = {}
        for name, (url, _proc) in running.items():
            results[name] = {} if args.ttft_only else throughput(samples[name], latency[name], DRAFTS.get(url, [0, 0]))
            if not args.no_ttft:
                CURRENT["key"] = "m63"
                cold, resent = ttft(url, long_prompt)
                results[name].update({"ttft_cold_s": cold, "ttft_resent_s": resent, "ttft_resent_vs_cold": resent / cold})
    finally:
        for _url, proc in running.values():
            proc.terminate()
            proc.wait(30)
    if "llama_server_np4" in results and not args.ttft_only:
        # each round's two servers were measured back to back: ratio per round, then median, min, max
        results["ratios"] = {}
        for n in (1, 2, 4):
            median, lo, hi = paired(samples["specdeck"][n], samples["llama_server_np4"][n])
            results["ratios"].update({f"streams_{n}": median, f"streams_{n}_min_max": [lo, hi]})
            # mean request latency, llama-server's over specdeck's: above 1, specdeck's requests end sooner
            median, lo, hi = paired(latency["llama_server_np4"][n], latency["specdeck"][n])
            results["ratios"].update({f"latency_{n}": median, f"latency_{n}_min_max": [lo, hi]})
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            print(name, {k: round(v, 3) if isinstance(v, float) else [round(x, 3) for x in v] if isinstance(v, list) else v
                         for k, v in r.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
