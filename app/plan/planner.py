"""The memory plan: which context, cache types, offload and slots fit, and the budget that proves it.

    target weights + draft weights + KV caches + recurrent state + compute + output
        + runtime reserve + safety margin  <=  budget

Each term is one function of GGUF metadata (`app.plan.terms`). The search walks candidate settings
from best to most compact and takes the first that fits; nothing else in specdeck decides context
size, cache types, offload or slots.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from app.errors import SpecdeckError
from app.gguf.info import ModelInfo
from app.gguf.projector import ProjectorInfo
from app.llama.params import ModelParams
from app.monitor.history import history_bytes
from app.plan import terms as M
from app.plan.hardware import Hardware
from app.plan.rows import Device, HeadRows, Term, VisionFacts, extra_copies, model_terms, vision_facts, vision_terms

MiB, GiB = M.MiB, M.GiB
MIN_CTX = 4096


class PlanError(SpecdeckError):
    exit_code = 3


# the draft length's one definition: the planner's input, and the server's setting that feeds it
DraftMax = Annotated[int | None, Field(ge=0, le=64, description="most tokens drafted per step (default: the planner chooses)")]


CTX_CHECKPOINTS = 8  # per slot (llama-server keeps 32: 4.7 GiB a slot for Qwen3.6-27B's ~150 MiB each)
CHECKPOINT_MIN_STEP = 4096


class PlanRequest(BaseModel):
    """What the user asked for; None means "choose for me". Each field is also the flag of the
    commands that take it (app/settings.py: `add_flags`); those marked `only` are plan's alone."""

    ctx: int | None = Field(None, description="context length (default: the preset's; shrunk to fit unless given)")
    cache_type: str | None = Field(None, description="K and V cache type (f16, q8_0, q4_0, ...)")
    cache_type_k: str | None = Field(None, description="K cache type: f16, q8_0, q4_0 ... (default: --cache-type)")
    cache_type_v: str | None = Field(None, description="V cache type (default: --cache-type)")
    n_gpu_layers: int | None = Field(None, description="target layers on the GPU (default: all that fit)")
    parallel: int | None = Field(None, ge=1, le=64, description="concurrent slots (sequences)")
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto", description="flash attention: auto is off on a CPU, where llama.cpp's kernel makes decoding at "
                            "depth slower (scripts/attention_depth.py), unless only a quantized V cache fits; on for CUDA")
    draft_max: DraftMax = Field(None, json_schema_extra={"only": True})
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="plan for the GPU (cuda) or host RAM (cpu)",
                                                   json_schema_extra={"only": True})
    vram: int | None = Field(None, description="the GPU memory to plan for, e.g. 20GiB (default: the free memory, read "
                                               "with pynvml); several models share it", json_schema_extra={"size": True})
    ram: int | None = Field(None, description="the host memory to plan for, e.g. 16GiB (default: the available memory, "
                                              "psutil); several models share it", json_schema_extra={"size": True})
    n_ubatch: int | None = Field(None, ge=32, description="physical batch size (n_ubatch)",
                                 json_schema_extra={"only": True, "flag": "--ubatch"})
    reserve: int | None = Field(None, ge=0, description="runtime reserve (CUDA context, driver, display), e.g. 768MiB",
                                json_schema_extra={"only": True, "size": True})
    margin: int | None = Field(None, ge=0, description="safety margin, e.g. 512MiB", json_schema_extra={"only": True, "size": True})
    ctx_checkpoints: int = Field(
        CTX_CHECKPOINTS, ge=0, le=256,
        description="context checkpoints kept per slot for a recurrent, hybrid or sliding-window model, in host "
                    "memory, so a resent conversation that departs from the cache is not evaluated again "
                    "(llama-server's --ctx-checkpoints; 0: none; the plan counts their bytes)")
    checkpoint_min_step: int = Field(
        CHECKPOINT_MIN_STEP, ge=64, description="tokens between the checkpoints taken inside a long prompt "
                                                "(llama-server's --checkpoint-min-step)")
    ctx_is_user_choice: bool = Field(False, json_schema_extra={"flag": False})

    @model_validator(mode="after")
    def _both_cache_types(self) -> PlanRequest:
        """--cache-type sets K and V where they are not set apart."""
        self.cache_type_k = self.cache_type_k or self.cache_type
        self.cache_type_v = self.cache_type_v or self.cache_type
        return self


@dataclass
class Plan:
    device: Device
    budget: int
    budget_source: str
    terms: list[Term]
    fits: bool
    ctx: int
    ctx_wanted: int
    parallel: int
    draft_max: int
    target: ModelParams
    draft: ModelParams | None
    host_available: int
    warnings: list[str] = field(default_factory=list)
    embedding: ModelParams | None = None  # the optional embedding model's context
    # context checkpoints: how many per slot, and the bytes of one (target, draft; 0: it keeps none)
    checkpoints: int = 0
    checkpoint_bytes: tuple[int, int] = (0, 0)
    checkpoint_min_step: int = CHECKPOINT_MIN_STEP
    head: ModelParams | None = None  # the context of a drafter on the target's own model (its MTP head), from that model
    head_label: str = ""  # its name in the plan's table ("MTP head")
    vision: VisionFacts | None = None  # what images cost in context, where a projector is served

    @property
    def used(self) -> int:
        return sum(t.bytes for t in self.terms if t.where == "device")

    @property
    def host_used(self) -> int:
        return sum(t.bytes for t in self.terms if t.where == "host")

    @property
    def headroom(self) -> int:
        return self.budget - self.used

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "budget": self.budget,
            "budget_source": self.budget_source,
            "fits": self.fits,
            "ctx": self.ctx,
            "ctx_wanted": self.ctx_wanted,
            "parallel": self.parallel,
            "draft_max": self.draft_max,
            "used": self.used,
            "headroom": self.headroom,
            "host_used": self.host_used,
            "host_available": self.host_available,
            "terms": [{**asdict(t), "share": t.bytes / self.budget if t.where == "device" else None} for t in self.terms],
            "target": asdict(self.target),
            "draft": asdict(self.draft) if self.draft else None,
            "head": {**asdict(self.head), "label": self.head_label} if self.head else None,
            "embedding": asdict(self.embedding) if self.embedding else None,
            "vision": asdict(self.vision) if self.vision else None,
            "checkpoints": {"per_slot": self.checkpoints, "bytes": {"target": self.checkpoint_bytes[0],
                                                                    "draft": self.checkpoint_bytes[1]},
                            "min_step": self.checkpoint_min_step},
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class Candidate:
    ctx: int
    type_k: str
    type_v: str
    parallel: int
    n_ubatch: int
    draft_max: int
    n_gpu_layers: int | None  # None: everything (target layers + output)
    flash_attn: bool = True
    checkpoints: int = 0  # context checkpoints per slot


# -- the budget terms ---------------------------------------------------------------------------

def runtime_reserve(device: Device, from_total: bool) -> int:
    """CUDA context, cuBLAS workspace, driver and (when the budget is the card's total) the display."""
    if device == "cpu":
        return 512 * MiB  # Python, libraries, the server
    return 768 * MiB if from_total else 448 * MiB


def safety_margin(budget: int) -> int:
    return max(256 * MiB, budget // 50)


def _shape(info: ModelInfo, c: Candidate, n_rs_seq: int, n_outputs: int) -> M.ContextShape:
    """A model's context for this candidate; its output rows capped as llama-server caps them: each
    slot's `n_outputs` rows (the target verifies its last token and a draft: 1 + draft_max)."""
    return M.context_shape(c.ctx, c.parallel, c.type_k, c.type_v, n_ubatch=c.n_ubatch, flash_attn=c.flash_attn,
                           n_rs_seq=n_rs_seq if info.n_recurrent_layers else 0, n_outputs=n_outputs,
                           n_outputs_max=c.parallel * n_outputs)


# tokens per embedding input at most (one sequence, evaluated in one ubatch): a code chunk. llama.cpp
# reserves the logits of a whole ubatch in the compute buffer even when pooling (measured), so this
# costs 4 x EMBED_CTX x n_vocab bytes: 0.24 GiB for a BERT vocabulary, 2 GiB for Gemma's.
EMBED_CTX = 2048


def embedding_shape(info: ModelInfo) -> M.ContextShape:
    n = min(EMBED_CTX, info.context_length or EMBED_CTX)
    return M.context_shape(n, 1, "f16", "f16", n_batch=n, n_ubatch=n, flash_attn=True)


def evaluate(target: ModelInfo, draft: ModelInfo | None, c: Candidate, device: Device, budget: int,
             budget_source: str, reserve: int, margin: int, host_available: int, ctx_wanted: int,
             buffers: tuple[str, ...] = ("CPU_REPACK",), embedder: ModelInfo | None = None, head: HeadRows | None = None,
             projector: ProjectorInfo | None = None) -> Plan:
    """The full budget for one candidate: every term, and whether it fits. `head`: a drafter on the
    target's own model drafts (its MTP head; no draft model)."""
    t_ngl = target.n_layers + 1 if c.n_gpu_layers is None else c.n_gpu_layers
    t_cs = _shape(target, c, c.draft_max, c.draft_max + 1)
    terms = model_terms("target", target, t_cs, t_ngl if device == "cuda" else 0, device, buffers, hidden=head is not None)
    d_params = None
    if draft is not None:
        d_cs = _shape(draft, c, c.draft_max, 1)
        terms += model_terms("draft", draft, d_cs, draft.n_layers + 1 if device == "cuda" else 0, device, buffers)
        d_params = ModelParams(d_cs.n_ctx, d_cs.n_batch, d_cs.n_ubatch, c.parallel, True, c.type_k, c.type_v,
                               c.flash_attn, False, d_cs.n_rs_seq, draft.n_layers + 1 if device == "cuda" else 0,
                               n_outputs_max=d_cs.n_outputs_max)
    h_params = None
    if head is not None:
        terms += head.terms(target, t_cs, device)
        h_params = ModelParams(t_cs.n_ctx, t_cs.n_batch, t_cs.n_ubatch, c.parallel, True, c.type_k, c.type_v,
                               c.flash_attn, False, 0, t_ngl if device == "cuda" else 0,
                               n_outputs_max=head.shape(t_cs).n_outputs_max)
    e_params = None
    if embedder is not None:
        e_cs, e_ngl = embedding_shape(embedder), embedder.n_layers + 1 if device == "cuda" else 0
        terms += [t for t in model_terms("embedding", embedder, e_cs, e_ngl, device, buffers) if t.bytes]
        e_params = ModelParams(e_cs.n_ctx, e_cs.n_batch, e_cs.n_ubatch, 1, True, "f16", "f16", True, False, 0, e_ngl,
                               embeddings=True)
    if projector is not None:
        terms += vision_terms(projector)
    if device == "cuda" and c.n_gpu_layers is not None and c.n_gpu_layers <= target.n_layers:
        terms += extra_copies("target", target, t_ngl, buffers, "host", "CPU layers")
    ck = (M.checkpoint_bytes(target, t_cs), M.checkpoint_bytes(draft, d_cs) if draft is not None else 0)
    if c.checkpoints and sum(ck):
        terms.append(Term("context checkpoints", c.checkpoints * c.parallel * sum(ck), "host" if device == "cuda" else "device",
                          f"{c.checkpoints} per slot x {c.parallel} slots x {sum(ck) / MiB:,.1f} MiB"
                          + (f" (target {ck[0] / MiB:,.1f} + draft {ck[1] / MiB:,.1f})" if ck[1] else "")))
    terms.append(Term("monitor history", history_bytes(c.parallel, 1 if device == "cuda" else 0),
                      "host" if device == "cuda" else "device", "the monitor's last hour, a row a second"))
    terms.append(Term("runtime reserve", reserve, "device", "CUDA context, driver, display" if device == "cuda" else "Python, libraries, server"))
    terms.append(Term("safety margin", margin, "device"))
    t_params = ModelParams(t_cs.n_ctx, t_cs.n_batch, t_cs.n_ubatch, c.parallel, True, c.type_k,
                           c.type_v, c.flash_attn, False, t_cs.n_rs_seq, t_ngl if device == "cuda" else 0,
                           n_outputs_max=t_cs.n_outputs_max)
    plan = Plan(device, budget, budget_source, terms, False, c.ctx, ctx_wanted, c.parallel, c.draft_max,
                t_params, d_params, host_available, embedding=e_params, checkpoints=c.checkpoints if sum(ck) else 0,
                checkpoint_bytes=ck if c.checkpoints else (0, 0), head=h_params, head_label=head.label if head else "",
                vision=vision_facts(projector, c.ctx) if projector is not None else None)
    plan.fits = plan.used <= budget and (device == "cpu" or plan.host_used <= host_available)
    return plan


# -- the search -------------------------------------------------------------------------------

def _choices(req: PlanRequest, target: ModelInfo, draft: ModelInfo | None,
             head: HeadRows | None = None) -> tuple[list, list, list, list]:
    if req.cache_type_k or req.cache_type_v:
        kv = [(req.cache_type_k or req.cache_type_v or "f16", req.cache_type_v or req.cache_type_k or "f16")]
    else:
        kv = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")]
    recurrent = bool(target.n_recurrent_layers or (draft and draft.n_recurrent_layers))
    parallel = [req.parallel] if req.parallel else ([2, 1] if recurrent else [4, 2, 1])
    ubatch = [req.n_ubatch] if req.n_ubatch else [512, 256]
    if req.draft_max is not None:
        dmax = [req.draft_max]
    else:
        dmax = [head.draft_max] if head is not None else ([8, 4] if recurrent else [8])
    return kv, parallel, ubatch, dmax


def _attention(req: PlanRequest, device: Device) -> list[bool]:
    """Flash attention settings to try, best first. On a CPU without: llama.cpp's CPU kernel takes
    each query row alone, so a 16-token verify at 8K tokens of depth took 2.2 x as long with it, and
    a single decode 1.3 x (scripts/attention_depth.py), while a prompt evaluated 6-14 % faster with
    it. With it only where the plan fits no other way (a quantized V cache needs it). On CUDA with."""
    if req.flash_attn != "auto":
        return [req.flash_attn == "on"]
    return [False, True] if device == "cpu" else [True]


def _check_request(req: PlanRequest, target: ModelInfo, draft: ModelInfo | None, device: Device, ctx: int) -> None:
    if ctx > target.context_length > 0:
        raise PlanError(f"context {ctx:,} is above the target's trained length of {target.context_length:,} tokens",
                        hint=f"use --ctx {target.context_length} or less")
    if ctx < 256:
        raise PlanError(f"context {ctx} is too small (at least 256 tokens)")
    kv, *_ = _choices(req, target, draft)
    attention = _attention(req, device)
    for model in [target] + ([draft] if draft else []):
        for tk, tv in kv:
            bad = [M.kv_incompatibility(model, tk, tv, fa, device) for fa in attention]
            if all(bad) and len(kv) == 1:
                raise PlanError(f"cache types K {tk} / V {tv} cannot be used: {bad[0]}",
                                hint="leave --flash-attn at auto" if req.flash_attn == "off" else None)


def _budget(req: PlanRequest, hw: Hardware) -> tuple[Device, int, str, int, int]:
    device: Device = "cpu" if req.device == "cpu" or (req.device == "auto" and not hw.gpus and req.vram is None) else "cuda"
    if device == "cuda":
        if req.vram is not None:
            budget, source, from_total = req.vram, "--vram (card total)", True
        elif hw.gpus:
            g = hw.gpus[0]
            budget, source, from_total = g.free, f"free memory of GPU 0 ({g.name}, pynvml)", False
        else:
            raise PlanError("no NVIDIA GPU found to plan for", hint="give --vram 24GiB to plan for a card, or --device cpu")
        reserve = req.reserve if req.reserve is not None else runtime_reserve("cuda", from_total)
    else:
        budget = req.ram or hw.ram_available
        source = "--ram" if req.ram else "available host memory (psutil)"
        reserve = req.reserve if req.reserve is not None else runtime_reserve("cpu", False)
    margin = req.margin if req.margin is not None else safety_margin(budget)
    return device, budget, source, reserve, margin


def make_plan(target: ModelInfo, draft: ModelInfo | None, req: PlanRequest, hw: Hardware, preset_ctx: int | None,
              embedder: ModelInfo | None = None, head: HeadRows | None = None,
              projector: ProjectorInfo | None = None) -> Plan:
    """The best plan that fits, or a PlanError that says the largest context that does and what to
    change. `head`: a drafter on the target's own model drafts (--draft mtp: its MTP head; the kind
    declares its rows, app/drafting/). `projector`: the target's vision projector (its weights and
    compute buffer planned, and what images cost in context)."""
    if head is not None and (why := head.missing(target)):
        raise PlanError(why, hint=head.hint or None)
    device, budget, source, reserve, margin = _budget(req, hw)
    ctx_wanted = req.ctx or preset_ctx or min(target.context_length or 32768, 32768)
    _check_request(req, target, draft, device, ctx_wanted)
    kv, parallel, ubatch, dmax = _choices(req, target, draft, head)
    models = [target] + ([draft] if draft else [])
    usable = lambda k, v, fa: not any(M.kv_incompatibility(m, k, v, fa, device) for m in models)  # noqa: E731
    attention = _attention(req, device)
    usable_kv = [(k, v) for k, v in kv if any(usable(k, v, fa) for fa in attention)]
    if not usable_kv:
        raise PlanError("no KV cache type suits both models' head sizes")

    def attempt(ctx: int, ngl: int | None) -> Plan | None:
        for (tk, tv), par, fa, ub, dm in itertools.product(usable_kv, parallel, attention, ubatch, dmax):
            if not usable(tk, tv, fa):
                continue
            p = evaluate(target, draft, Candidate(ctx, tk, tv, par, ub, dm, ngl, fa, req.ctx_checkpoints), device, budget, source,
                         reserve, margin, req.ram or hw.ram_available, ctx_wanted, hw.cpu_buffers, embedder, head, projector)
            if p.fits:
                p.checkpoint_min_step = req.checkpoint_min_step
                return p
        return None

    ngl = req.n_gpu_layers if device == "cuda" else None
    if plan := attempt(ctx_wanted, ngl):
        return _annotate(plan, target, draft)
    largest = _largest_ctx(lambda c: attempt(c, ngl) is not None, ctx_wanted)
    if device == "cuda" and ngl is None and req.ctx_is_user_choice:
        for layers in range(target.n_layers, 0, -1):  # keep the asked context: move target layers to the host
            if plan := attempt(ctx_wanted, layers):
                plan.warnings.append(f"only {layers} of {target.n_layers + 1} target layers fit on the GPU at "
                                     f"{ctx_wanted:,} tokens: expect much lower speed (a context of {largest:,} fits fully)")
                return _annotate(plan, target, draft)
    if largest >= MIN_CTX and not req.ctx_is_user_choice:
        plan = attempt(largest, ngl)
        assert plan is not None
        plan.warnings.append(f"the preset aims for {ctx_wanted:,} tokens; {largest:,} fit in this budget")
        return _annotate(plan, target, draft)
    compact_fa = True in attention and usable(*usable_kv[-1], True)  # its compute buffer is the smaller
    worst = evaluate(target, draft, Candidate(ctx_wanted, *usable_kv[-1], parallel[-1], ubatch[-1], dmax[-1], ngl,
                                              compact_fa, req.ctx_checkpoints),
                     device, budget, source, reserve, margin, req.ram or hw.ram_available, ctx_wanted, hw.cpu_buffers,
                     embedder, head, projector)
    short = worst.used - budget
    what = (f"the largest context that fits is {largest:,} tokens (--ctx {largest})" if largest >= 256
            else "even the weights do not fit")
    raise PlanError(
        f"nothing fits: {ctx_wanted:,} tokens need {worst.used / GiB:.2f} GiB of a {budget / GiB:.2f} GiB budget "
        f"({short / GiB:.2f} GiB over) with the most compact settings; {what}",
        hint="use a smaller --ctx, a smaller model or draft, a bigger --vram/--ram, or a lower --parallel",
    )



def _largest_ctx(fits, upper: int) -> int:
    lo, hi = 0, upper // 256
    while lo < hi:  # largest multiple of 256 that fits
        mid = (lo + hi + 1) // 2
        if fits(mid * 256):
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def _annotate(plan: Plan, target: ModelInfo, draft: ModelInfo | None) -> Plan:
    if draft is not None and draft.context_length and draft.context_length < plan.ctx:
        plan.warnings.append(
            f"the draft was trained on {draft.context_length:,} tokens, the plan runs it over {plan.ctx:,}: "
            f"acceptance may fall at long range (the speed controller adapts)")
    if plan.target.type_k != "f16":
        plan.warnings.append(f"KV cache quantized to {plan.target.type_k} to fit")
    return plan
