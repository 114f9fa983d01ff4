"""The engine side of `specdeck bench`: each mode's drafter, one measured answer, the built-in
prompts and the agent workload run mode by mode (ABBA order), the costs calibrated for the controller."""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field

from app.commands.anchors import DRAFT_N_MAX, AnchorServers
from app.commands.equivalence import prompt_tokens
from app.engine.calibration import calibrate
from app.engine.controller import Controller
from app.engine.drafters.adaptive import adaptive_controller
from app.engine.drafters.base import HeadDrafter
from app.engine.engine import Engine, Request, SpecParams
from app.engine.loader import DRAFTER_KINDS, Loaded, build_drafter
from app.llama.context import Context
from app.drafting.mtp import DRAFT_MAX as MTP_DRAFT_MAX

MODES = ("plain", "adaptive", "lookup", "draft")  # plain and adaptive side by side; the order flips each repeat
CARD_MODES = ("plain", "adaptive", "lookup", "suffix", "draft")  # bench --f32-target: every single mode beside adaptive
AGENT_MODES = ("plain", "adaptive", "adaptive-local", "suffix", "lookup")  # adaptive-local: without the global index
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
    return mode_drafters(loaded.draft, controller, loaded.head)


def mode_drafters(draft: Context | None, controller: Controller, head: HeadDrafter | None = None) -> dict:
    """Every mode's drafter as bench measures it ({mode: drafter}, None for plain): one controller
    for all but adaptive-local, which keeps its own acceptance estimates on the same measured costs
    (what one mode learns must not steer the other). `head`: the target's MTP head in the draft
    model's place (one head, shared by the modes in turn)."""
    drafters = {mode: build_drafter(mode, draft, controller, head=head) for mode in DRAFTER_KINDS}
    drafters["adaptive-local"] = build_drafter("adaptive", draft, adaptive_controller(controller.costs), suffix_tokens=0,
                                               head=head)
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
    # fixed-length draft mode: the draft model at llama-server draft-simple's length, the MTP head
    # alone at draft-mtp's (the anchors' lengths)
    n_max = ADAPTIVE_N_MAX if mode.startswith("adaptive") else MTP_DRAFT_MAX if loaded.head is not None else DRAFT_N_MAX
    if loaded.head is not None:  # the head follows the target only in the modes it drafts in
        loaded.head.follow(drafter is loaded.head or getattr(drafter, "model", None) is loaded.head)
    engine = Engine(loaded.target, drafter, 1, draft_limit=n_max, costs=getattr(drafter, "controller", None))
    req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=loaded.tokenizer.stop_tokens,
                  speculative=SpecParams(enabled=mode != "plain", n_max=n_max))
    steps = engine.generate(req)
    next(steps)  # the prompt is in (a draft model follows it chunk by chunk: not drafting time)
    d0 = llama_draft_seconds(loaded)
    for _ in steps:
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
        in_llama = llama_draft_seconds(loaded) - d0
        res.python_ms_per_drafted.append(max(r.t_draft - in_llama, 0.0) / r.drafted * 1e3)
    return r


def llama_draft_seconds(loaded: Loaded) -> float:
    """Seconds the drafter has spent in llama.cpp drafting (the MTP head's drafts only, not the
    evaluation that follows each target decode)."""
    if loaded.head is not None:
        return loaded.head.draft_seconds
    return loaded.draft.decode_seconds if loaded.draft else 0.0


def _calibrated(loaded: Loaded, log) -> Controller:
    t = time.perf_counter()
    costs = calibrate(loaded.target, loaded.draft, ADAPTIVE_N_MAX, head=loaded.head)
    log(f"calibrated in {time.perf_counter() - t:.1f} s: c_verify(n) ms "
        + " ".join(f"{n}: {costs.verify[n] * 1e3:.1f}" for n in sorted(costs.verify))
        + (f"; c_draft {costs.draft * 1e3:.1f} ms" if costs.draft else "")
        + (f", draft prefill {costs.draft_prefill * 1e3:.2f} ms/token" if costs.draft_prefill else ""))
    return adaptive_controller(costs)


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
    anchor_tpd: dict[str, dict[str, list[float]]] = {}
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
                n, seconds, tpd, _ = anchors.measure_answer(name, ids, max_tokens)
                tps = n / seconds if seconds else 0.0
                anchor_runs.setdefault(name, {}).setdefault(kind, []).append(tps)
                anchor_tpd.setdefault(name, {}).setdefault(kind, []).append(tpd)
                log(f"  [{rep + 1}/{repeats}] {kind:16} {name:20} {tps:6.1f} tok/s  tokens/decode {tpd:.2f}")
    summary = {kind: {mode: res.summary() for mode, res in modes_.items()} for kind, modes_ in results.items()}
    anchor_summary = {name: {kind: statistics.median(v) for kind, v in kinds.items()} for name, kinds in anchor_runs.items()}
    anchor_summary["runs"] = anchor_runs
    anchor_summary["tokens_per_decode"] = {name: {kind: statistics.median(v) for kind, v in kinds.items()}
                                           for name, kinds in anchor_tpd.items()}
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
