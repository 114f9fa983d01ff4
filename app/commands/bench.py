"""`specdeck bench`: tokens/s with speculation off, with the draft model, with prompt lookup, with
the suffix index and with the adaptive choice, on the same prompts, side by side in one run; and,
where a llama-server built from the same llama.cpp sources is present, the same prompts through it
as anchors.

`--workload builtin` (the default) runs each prompt on its own: the suffix index is cleared before
every run, so no run drafts from an earlier run of the very prompt it measures. `--workload agent`
replays the agent workload (app/commands/workloads.py) turn by turn in session order, each mode
from an empty index that the workload's own turns then fill, as in real use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from app.commands.common import (
    catalog_from_args,
    console,
    local_path,
    make_fetcher,
    make_selection,
    out,
)
from app.commands.equivalence import prompt_tokens
from app.commands.workloads import agent_turns
from app.engine.calibration import calibrate
from app.engine.controller import Controller
from app.engine.engine import Engine, Request, SpecParams
from app.engine.loader import DRAFTER_KINDS, Loaded, build_drafter
from app.errors import SpecdeckError
from app.gguf.info import read_model_info
from app.llama.context import Context
from app.plan.hardware import detect
from app.plan.planner import PlanRequest, make_plan

MODES = ("plain", "adaptive", "lookup", "draft")  # plain and adaptive side by side; the order flips each repeat
AGENT_MODES = ("plain", "adaptive", "adaptive-local", "suffix", "lookup")  # adaptive-local: without the global index
DRAFT_N_MAX = 8  # the draft model at a fixed length, greedy (our "draft" mode)
ANCHOR_P_MIN = 0.75  # llama-server's best draft setting here (FACTS: n-max 8, p-min 0.75)
MAX_TOKENS = 200  # per prompt, the built-in prompts
AGENT_MAX_TOKENS = 512  # the agent workload's answers end where the model ends them (the longest is ~490 tokens)
ADAPTIVE_N_MAX = 48  # the controller may go this long (lookup proposals are free to make; llama-server's ngram-simple drafts 48)





@dataclass
class ModeResult:
    tok_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_decode: list[float] = field(default_factory=list)
    python_ms_per_drafted: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # per run, a digest of the answer's token ids

    def summary(self) -> dict:
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {
            "tok_s": med(self.tok_s), "tok_s_min": min(self.tok_s, default=None), "tok_s_max": max(self.tok_s, default=None),
            "tok_s_all": list(self.tok_s),
            "acceptance": med(self.acceptance), "tokens_per_decode": med(self.tokens_per_decode),
            "tokens_per_decode_all": list(self.tokens_per_decode),
            "python_ms_per_drafted_token": med(self.python_ms_per_drafted),
            "answers": list(self.answers),
        }


def answer_digest(token_ids: list[int], stop_tokens: set[int]) -> str:
    """A short digest of an answer's token ids, less a closing stop token (llama-server's answers
    leave it out): two runs gave the same answer when their digests match."""
    if token_ids and token_ids[-1] in stop_tokens:
        token_ids = token_ids[:-1]
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def answers_unlike_plain(workloads: dict) -> list[dict]:
    """Where a mode's answer was not plain decoding's in the same repeat: {kind, mode, differ, runs}.
    Every mode is lossless, but a greedy near-tie can fall the other way in a batch of another shape
    (llama.cpp's numerics), and tokens per decode measured on another answer is not the same figure."""
    found = []
    for kind, modes in workloads.items():
        plain = (modes.get("plain") or {}).get("answers") or []
        for mode, summary in modes.items():
            mine = summary.get("answers") or []
            if mode == "plain" or not plain or not mine:
                continue
            differ = sum(1 for a, b in zip(mine, plain) if a != b)
            if differ:
                found.append({"kind": kind, "mode": mode, "differ": differ, "runs": min(len(mine), len(plain))})
    return found


def _drafters(loaded: Loaded, controller: Controller) -> dict:
    return mode_drafters(loaded.draft, controller)


def mode_drafters(draft: Context | None, controller: Controller) -> dict:
    """Every mode's drafter as bench measures it ({mode: drafter}, None for plain): one controller
    for all but adaptive-local, which keeps its own acceptance estimates on the same measured costs
    (what one mode learns must not steer the other)."""
    drafters = {mode: build_drafter(mode, draft, controller) for mode in DRAFTER_KINDS}
    drafters["adaptive-local"] = build_drafter("adaptive", draft, Controller(controller.costs), suffix_tokens=0)
    return drafters


def suffix_index(drafter):
    """The drafter's suffix index over recent requests (None where it has none)."""
    inner = getattr(drafter, "suffix", None) or drafter
    return getattr(inner, "index", None)


def clear_index(drafter) -> None:
    index = suffix_index(drafter)
    if index is not None:
        index.clear()


def measure_one(loaded: Loaded, drafter, mode: str, ids: list[int], max_tokens: int, res: ModeResult):
    """One greedy request through a fresh engine with this mode's drafter; its figures go to `res`."""
    n_max = ADAPTIVE_N_MAX if mode.startswith("adaptive") else DRAFT_N_MAX
    engine = Engine(loaded.target, drafter, 1, draft_limit=n_max, costs=getattr(drafter, "controller", None))
    d_ctx = loaded.draft
    d0 = (d_ctx.decode_seconds if d_ctx else 0.0)
    req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=loaded.tokenizer.stop_tokens,
                  speculative=SpecParams(enabled=mode != "plain", n_max=n_max))
    for _ in engine.generate(req):
        pass
    r = engine.slots[0].record
    if drafter is not None:
        drafter.release(0)
    res.tok_s.append(r.generation_tps or 0.0)
    res.tokens.append(len(r.completion))
    res.answers.append(answer_digest(r.completion, req.stop_tokens))
    if r.acceptance is not None:
        res.acceptance.append(r.acceptance)
    res.tokens_per_decode.append(r.tokens_per_decode or 0.0)
    if mode == "draft" and r.drafted:
        in_llama = (d_ctx.decode_seconds - d0) if d_ctx else 0.0
        res.python_ms_per_drafted.append(max(r.t_draft - in_llama, 0.0) / r.drafted * 1e3)
    return r


def _calibrated(loaded: Loaded, log) -> Controller:
    t = time.perf_counter()
    costs = calibrate(loaded.target, loaded.draft, ADAPTIVE_N_MAX)
    log(f"calibrated in {time.perf_counter() - t:.1f} s: c_verify(n) ms "
        + " ".join(f"{n}: {costs.verify[n] * 1e3:.1f}" for n in sorted(costs.verify))
        + (f"; c_draft {costs.draft * 1e3:.1f} ms" if costs.draft else "")
        + (f", draft prefill {costs.draft_prefill * 1e3:.2f} ms/token" if costs.draft_prefill else ""))
    return Controller(costs)


def _costs_json(controller: Controller) -> dict:
    costs = controller.costs
    return {"c_verify_ms": {n: v * 1e3 for n, v in costs.verify.items()}, "c_draft_ms": (costs.draft or 0) * 1e3,
            "draft_prefill_ms_per_token": (costs.draft_prefill or 0) * 1e3}


def run_engine(loaded: Loaded, prompts: list[dict], max_tokens: int, repeats: int, modes=MODES, log=print,
               anchors: AnchorServers | None = None) -> tuple[dict, dict, dict]:
    """{kind: {mode: summary}}, the calibrated costs, and {anchor: {kind: tok_s}} measured next to
    each prompt's runs (when `anchors` are up)."""
    controller = _calibrated(loaded, log)
    drafters = _drafters(loaded, controller)
    tok = loaded.tokenizer
    results: dict[str, dict[str, ModeResult]] = {}
    anchor_runs: dict[str, dict[str, list[float]]] = {}
    for rep in range(repeats):
        for item in prompts:
            kind = item.get("kind", "custom")
            ids = prompt_tokens(tok, item)
            # ABBA: each repeat runs the modes in the other order, so a drift in this machine's speed
            # falls on both sides of the adaptive / plain ratio (taken per repeat, then the median)
            for mode in (modes if rep % 2 == 0 else tuple(reversed(modes))):
                drafter = drafters[mode]
                if mode != "plain" and drafter is None:
                    continue
                clear_index(drafter)  # never the answer of an earlier run of this very prompt
                res = results.setdefault(kind, {}).setdefault(mode, ModeResult())
                r = measure_one(loaded, drafter, mode, ids, max_tokens, res)
                log(f"  [{rep + 1}/{repeats}] {kind:16} {mode:9} {r.generation_tps or 0:6.1f} tok/s"
                    f"  acceptance {r.acceptance if r.acceptance is None else round(r.acceptance, 2)}"
                    f"  tokens/decode {r.tokens_per_decode or 0:.2f}")
            for name in (anchors.urls if anchors else {}):
                tps = anchors.measure(name, ids, max_tokens)
                anchor_runs.setdefault(name, {}).setdefault(kind, []).append(tps)
                log(f"  [{rep + 1}/{repeats}] {kind:16} {name:20} {tps:6.1f} tok/s")
    summary = {kind: {mode: res.summary() for mode, res in modes_.items()} for kind, modes_ in results.items()}
    anchor_summary = {name: {kind: statistics.median(v) for kind, v in kinds.items()} for name, kinds in anchor_runs.items()}
    anchor_summary["runs"] = anchor_runs
    return summary, _costs_json(controller), anchor_summary if anchor_runs else {}


def run_agent(loaded: Loaded, turns: list[dict], max_tokens: int, repeats: int, modes=AGENT_MODES, log=print,
              anchors: AnchorServers | None = None) -> tuple[dict, dict, dict, dict]:
    """The agent workload: in each repeat, every mode replays all turns in session order from an
    empty suffix index (the modes' order flips each repeat), then each anchor does. Returns
    {kind: {mode: summary}}, the costs, the tokens per target decode of the turns together and the
    workload tokens/s, each {mode or anchor: {"all" | "cross": [per repeat]}}."""
    controller = _calibrated(loaded, log)
    drafters = _drafters(loaded, controller)
    ids = [prompt_tokens(loaded.tokenizer, t) for t in turns]
    results: dict[str, dict[str, ModeResult]] = {}
    totals: dict[str, dict[str, list]] = {}
    per_decode: dict[str, dict[str, list]] = {}
    for rep in range(repeats):
        for mode in (modes if rep % 2 == 0 else tuple(reversed(modes))):
            drafter = drafters[mode]
            if mode != "plain" and drafter is None:
                continue
            clear_index(drafter)
            sums = {"all": [0, 0.0, 0.0], "cross": [0, 0.0, 0.0]}
            for turn, prompt in zip(turns, ids):
                index = suffix_index(drafter)
                held = index.holds() if index is not None else None  # before this turn joins it
                res = results.setdefault(turn["kind"], {}).setdefault(mode, ModeResult())
                r = measure_one(loaded, drafter, mode, prompt, max_tokens, res)
                _add(sums, turn, len(r.completion), r.t_generate, r.target_decodes)
                log(f"  [{rep + 1}/{repeats}] {turn['session']}{turn['turn']} {turn['kind']:22} {mode:14} "
                    f"{r.generation_tps or 0:6.1f} tok/s  tokens/decode {r.tokens_per_decode or 0:.2f}"
                    + (f"  (index held {held['documents']} requests, {held['tokens']:,} tokens)" if held else ""))
            _total(totals, per_decode, mode, sums)
        if anchors and rep:
            anchors.restart()  # each repeat from empty n-gram pools, as the modes start from an empty index
        for name in (anchors.urls if anchors else {}):
            sums = {"all": [0, 0.0, 0.0], "cross": [0, 0.0, 0.0]}
            for turn, prompt in zip(turns, ids):
                n, seconds, tpd, answer = anchors.measure_answer(name, prompt, max_tokens)
                res = results.setdefault(turn["kind"], {}).setdefault(name, ModeResult())
                res.tok_s.append(n / seconds if seconds else 0.0)
                res.tokens.append(n)
                if answer:
                    res.answers.append(answer_digest(answer, loaded.tokenizer.stop_tokens))
                res.tokens_per_decode.append(tpd)
                _add(sums, turn, n, seconds, n / tpd if tpd else 0.0)
                log(f"  [{rep + 1}/{repeats}] {turn['session']}{turn['turn']} {turn['kind']:22} {name:14} "
                    f"{n / seconds if seconds else 0:6.1f} tok/s  tokens/decode {tpd:.2f}")
            _total(totals, per_decode, name, sums)
    summary = {kind: {mode: res.summary() for mode, res in modes_.items()} for kind, modes_ in results.items()}
    return summary, _costs_json(controller), per_decode, totals


def _add(sums: dict, turn: dict, tokens: int, seconds: float, decodes: float) -> None:
    for part in ("all", "cross") if turn["cross"] else ("all",):
        sums[part][0] += tokens
        sums[part][1] += seconds
        sums[part][2] += decodes


def _total(totals: dict, per_decode: dict, mode: str, sums: dict) -> None:
    """One repeat of one mode: tokens/s, and tokens per target decode, of the turns together."""
    for part, (n, seconds, decodes) in sums.items():
        totals.setdefault(mode, {}).setdefault(part, []).append(n / seconds if seconds else 0.0)
        per_decode.setdefault(mode, {}).setdefault(part, []).append(n / decodes if decodes else 0.0)


def workload_per_decode(per_decode: dict) -> dict:
    """Tokens per target decode of the turns together (their tokens over their decodes), per mode:
    the median of the repeats, and each repeat's."""
    return {m: {**{p: statistics.median(v) for p, v in parts.items()}, "runs": parts} for m, parts in per_decode.items()}


def agent_ratios(totals: dict) -> dict:
    """Workload tokens/s (all turns; the cross-request turns) per mode, and the goals' ratios paired by repeat."""
    ngram = [a for a in totals if a.startswith("llama_server_ngram") or a == "llama_server_lookup"]
    out: dict = {"tok_s": {m: {p: statistics.median(v) for p, v in parts.items()} for m, parts in totals.items()}}
    if ngram:
        best = max(ngram, key=lambda a: statistics.median(totals[a]["all"]))
        out["best_ngram_anchor"] = best
    for key, a, b, part in (("adaptive_vs_plain_cross", "adaptive", "plain", "cross"),
                            ("adaptive_vs_adaptive_local_cross", "adaptive", "adaptive-local", "cross"),
                            ("adaptive_vs_plain_all", "adaptive", "plain", "all"),
                            ("adaptive_vs_best_ngram_all", "adaptive", out.get("best_ngram_anchor"), "all")):
        got = paired((totals.get(a) or {}).get(part, []), (totals.get(b) or {}).get(part, [])) if b else None
        if got:
            out[key], out[key + "_min"], out[key + "_max"] = got
    return out


# -- llama-server anchors ----------------------------------------------------------------------

ANCHORS = {
    "llama_server_plain": [],
    "llama_server_draft": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", str(DRAFT_N_MAX),
                           "--spec-draft-p-min", str(ANCHOR_P_MIN)],
    "llama_server_lookup": ["--spec-type", "ngram-simple"],
}
AGENT_ANCHORS = {  # the agent workload: plain and llama-server's three n-gram modes (the best is the anchor)
    "llama_server_plain": [],
    "llama_server_ngram_simple": ["--spec-type", "ngram-simple"],
    "llama_server_ngram_map_k": ["--spec-type", "ngram-map-k"],
    "llama_server_ngram_mod": ["--spec-type", "ngram-mod"],
}


def find_llama_server() -> Path | None:
    env = os.environ.get("SPECDECK_LLAMA_SERVER")
    if env and Path(env).is_file():
        return Path(env)
    cache = Path(os.environ.get("SPECDECK_LLAMA_CPP_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeck" / "llama.cpp")
    built = cache / "build" / "bin" / "llama-server"
    if built.is_file():
        return built
    found = shutil.which("llama-server")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


class AnchorServers:
    """llama-server with each anchor's flags, all started up front and kept up, so every anchor is
    measured right next to specdeck's own runs of the same prompt (this machine's speed drifts); the
    agent workload restarts them before each repeat (`restart`)."""

    def __init__(self, server: Path, target: Path, draft: Path | None, threads: int, n_ctx: int,
                 anchors: dict | None = None, flash_attn: bool = True) -> None:
        self.urls: dict[str, str] = {}
        self.procs: list[subprocess.Popen] = []
        self.args = (server, target, draft, threads, n_ctx, flash_attn)
        self.anchors = anchors or ANCHORS

    def __enter__(self) -> AnchorServers:
        try:
            self._start_all()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start_all(self) -> None:
        server, target, draft, threads, n_ctx, flash_attn = self.args
        for name, extra in self.anchors.items():
            if any("{draft}" in a for a in extra) and draft is None:
                continue
            port = free_port()
            # the plan's attention too: the two sides then decode with the same numerics, so they
            # answer the same text (a near-tie may flip between the two kernels)
            args = [str(server), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                    "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--no-warmup", "-fa", "on" if flash_attn else "off"]
            args += [a.replace("{draft}", str(draft)) for a in extra]
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc)
            self.urls[name] = url

    def restart(self) -> None:
        """Every anchor in a fresh process: llama-server's `ngram-mod` keeps its n-gram pool across
        requests for the life of the process, so a repeat of the same turns would draft from its own
        earlier answers (its tokens/s climbed from 30.7 to 46.4 over four repeats of the agent
        workload), the measurement specdeck's modes avoid by clearing their suffix index."""
        self.__exit__()
        self.urls = {}
        self._start_all()

    def measure(self, name: str, ids: list[int], max_tokens: int) -> float:
        """Generated tokens/s for one greedy request through llama-server's /completion."""
        n, seconds, _, _ = self.measure_answer(name, ids, max_tokens)
        return n / seconds if seconds else 0.0

    def measure_answer(self, name: str, ids: list[int], max_tokens: int) -> tuple[int, float, float, list[int]]:
        """(generated tokens, seconds generating, tokens per target decode, the answer's token ids)
        for one greedy request."""
        r = _post(self.urls[name] + "/completion", {"prompt": ids, "n_predict": max_tokens, "temperature": 0,
                                                    "cache_prompt": False, "top_k": 1, "return_tokens": True})
        return (*counted(r["timings"]), list(r.get("tokens") or []))

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = []


def counted(timings: dict) -> tuple[int, float, float]:
    """llama-server's `timings` as (generated tokens, seconds generating, tokens per target decode).
    Each decode after the prompt's yields one token and the drafts it kept, so the decodes are the
    generated tokens less the accepted drafts."""
    n = int(timings["predicted_n"])
    decodes = n - int(timings.get("draft_n_accepted") or 0)
    return n, float(timings["predicted_ms"]) / 1e3, n / decodes if decodes > 0 else 1.0


def paired(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """Median, min and max of a[i] / b[i]: runs of the same repeat, minutes apart at most."""
    pairs = [x / y for x, y in zip(a, b) if y]
    return (statistics.median(pairs), min(pairs), max(pairs)) if pairs else None


def ratios(workloads: dict, anchor_runs: dict) -> dict:
    """The goals as ratios measured in this run, each taken per repeat (side by side), then the median.
    `anchor_runs`: {anchor: {kind: [tok_s per repeat]}}."""
    runs = anchor_runs
    out = {}
    for kind, modes in workloads.items():
        all_ = lambda m, modes=modes: (modes.get(m) or {}).get("tok_s_all") or []  # noqa: E731
        anchor = lambda a, kind=kind: runs.get(a, {}).get(kind) or []  # noqa: E731
        r = {}
        for key, a, b in (("adaptive_vs_plain", all_("adaptive"), all_("plain")),
                          ("plain_vs_llama_server_plain", all_("plain"), anchor("llama_server_plain")),
                          ("adaptive_vs_llama_server_draft", all_("adaptive"), anchor("llama_server_draft")),
                          ("adaptive_vs_llama_server_lookup", all_("adaptive"), anchor("llama_server_lookup"))):
            got = paired(a, b)
            if got:
                r[key], r[key + "_min"], r[key + "_max"] = got
        out[kind] = r
    return out


# -- the command -------------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    import contextlib

    from app.commands.equivalence import load_prompts
    from app.engine.loader import load

    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    agent = getattr(args, "workload", "builtin") == "agent"
    if agent and args.prompts:
        raise SpecdeckError("--prompts and --workload agent do not go together", hint="the agent workload is built in")
    prompts = agent_turns() if agent else load_prompts(Path(args.prompts) if args.prompts else None)
    max_tokens = args.max_tokens if args.max_tokens is not None else AGENT_MAX_TOKENS if agent else MAX_TOKENS
    if max_tokens < 1:
        raise SpecdeckError(f"--max-tokens must be at least 1, not {max_tokens}")
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft else None
    hw = detect()
    plan = make_plan(target, draft, PlanRequest(ctx=args.ctx, ctx_is_user_choice=True, parallel=1, draft_max=16), hw, args.ctx)
    threads = args.threads or hw.cpu_count
    log = (lambda *a, **k: console.print(*a, **k)) if args.json else (lambda *a, **k: out.print(*a, **k))
    server = None if args.no_anchors else find_llama_server()
    if server is not None:
        log(f"anchors: {server} (kept up, measured next to each prompt's runs; flash attention "
            f"{'on' if plan.target.flash_attn else 'off'}, as specdeck's plan)")
    elif not args.no_anchors:
        log("anchors: no llama-server found (scripts/build_llama_server.sh builds one)")
    servers = (AnchorServers(server, target.path, draft.path if draft else None, threads, plan.ctx,
                             AGENT_ANCHORS if agent else ANCHORS, plan.target.flash_attn)
               if server else contextlib.nullcontext(None))
    with servers as up:
        loaded = load(plan, target, draft, threads)
        try:
            log(f"bench: {sel.name}, {threads} threads, {max_tokens} tokens per prompt, {args.repeats} repeats"
                + (f", the agent workload ({len(prompts)} turns, two sessions interleaved; every mode starts from an "
                   "empty suffix index that the turns fill in order)" if agent else
                   "; the suffix index is cleared before every run"))
            if agent:
                workloads, costs, per_decode, totals = run_agent(loaded, prompts, max_tokens, args.repeats, log=log,
                                                                 anchors=up)
            else:
                workloads, costs, anchors = run_engine(loaded, prompts, max_tokens, args.repeats, log=log, anchors=up)
        finally:
            loaded.close()
    if agent:
        result = {"workload": "agent", "turns": [{k: t[k] for k in ("session", "turn", "kind", "cross")} for t in prompts],
                  "workloads": workloads, "totals": totals, "ratios": agent_ratios(totals),
                  "tokens_per_decode": workload_per_decode(per_decode),
                  "answers_unlike_plain": answers_unlike_plain(workloads), "costs": costs,
                  "threads": threads, "max_tokens": max_tokens, "repeats": args.repeats}
        out.print_json(json.dumps(result)) if args.json else print_agent(result)
        return 0
    anchor_runs = anchors.pop("runs", {})
    result = {"workloads": workloads, "anchors": anchors, "anchor_runs": anchor_runs,
              "ratios": ratios(workloads, anchor_runs), "answers_unlike_plain": answers_unlike_plain(workloads),
              "costs": costs,
              "threads": threads, "max_tokens": max_tokens, "repeats": args.repeats}
    if args.json:
        out.print_json(json.dumps(result))
    else:
        table = Table(title="tokens/s (median of repeats)")
        for col in ("workload", "plain", "draft", "lookup", "adaptive", "adaptive / plain", "server plain", "server draft", "server lookup"):
            table.add_column(col, justify="right")
        for kind, modes in workloads.items():
            cell = lambda m, modes=modes: f"{modes[m]['tok_s']:.1f}" if m in modes and modes[m]["tok_s"] else "-"  # noqa: E731
            anchor = lambda a, kind=kind: f"{anchors[a][kind]:.1f}" if kind in anchors.get(a, {}) else "-"  # noqa: E731
            r = result["ratios"][kind].get("adaptive_vs_plain")
            table.add_row(kind, cell("plain"), cell("draft"), cell("lookup"), cell("adaptive"), f"{r:.2f}" if r else "-",
                          anchor("llama_server_plain"), anchor("llama_server_draft"), anchor("llama_server_lookup"))
        out.print(table)
        print_answers(result["answers_unlike_plain"])
    return 0


def print_answers(unlike: list[dict]) -> None:
    """Say whether every mode answered as plain decoding did, turn by turn and repeat by repeat."""
    if not unlike:
        out.print("answers: every mode gave plain decoding's answer in every run")
    for u in unlike:
        out.print(f"answers: {u['kind']} {u['mode']}: {u['differ']} of {u['runs']} runs differ from plain decoding's "
                  "(their tokens per decode are of another answer; `specdeck verify` shows whether it parts at a near-tie)")


def print_agent(result: dict) -> None:
    """Per turn kind: tokens/s and tokens per target decode for every mode; then the workload's totals."""
    modes = [m for m in (*AGENT_MODES, *AGENT_ANCHORS) if m in result["totals"]]
    table = Table(title="agent workload: tokens/s, median of repeats (tokens per target decode)")
    table.add_column("turn kind")
    for m in modes:
        table.add_column(m.replace("llama_server_", "server "), justify="right")
    for kind, by_mode in result["workloads"].items():
        cross = any(t["cross"] for t in result["turns"] if t["kind"] == kind)
        row = [kind + (" (cross)" if cross else "")]
        for m in modes:
            s = by_mode.get(m)
            row.append(f"{s['tok_s']:.1f} ({s['tokens_per_decode']:.2f})" if s and s["tok_s"] and s["tokens_per_decode"]
                       else f"{s['tok_s']:.1f}" if s and s["tok_s"] else "-")
        table.add_row(*row)
    r = result["ratios"]
    per_decode = result.get("tokens_per_decode", {})
    for part in ("cross", "all"):
        table.add_row(f"workload: {'cross-request turns' if part == 'cross' else 'all turns'}",
                      *[f"{r['tok_s'][m][part]:.1f}" + (f" ({per_decode[m][part]:.2f})" if m in per_decode else "")
                        for m in modes])
    out.print(table)
    for key in ("adaptive_vs_plain_cross", "adaptive_vs_adaptive_local_cross", "adaptive_vs_plain_all",
                "adaptive_vs_best_ngram_all"):
        if key in r:
            out.print(f"{key}: {r[key]:.2f} (min {r[key + '_min']:.2f}, max {r[key + '_max']:.2f})"
                      + (f" [{r['best_ngram_anchor']}]" if key.endswith("ngram_all") else ""))
    print_answers(result["answers_unlike_plain"])
