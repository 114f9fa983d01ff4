"""Bring a plan to life: load target and draft with the plan's parameters, build the engine."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.engine.calibration import calibrate
from app.engine.checkpoints import Checkpoints
from app.engine.controller import Controller, CostModel
from app.engine.drafters.adaptive import AdaptiveDrafter, adaptive_controller
from app.engine.drafters.base import Drafter, HeadDrafter
from app.engine.drafters.lookup import LookupDrafter
from app.engine.drafters.model import ModelDrafter
from app.engine.drafters.suffix import SuffixDrafter, SuffixIndex
from app.engine.engine import Engine
from app.engine.text import Tokenizer
from app.gguf.info import ModelInfo
from app.llama.context import Context, LoadCancelled, Model
from app.llama.params import ModelParams
from app.llama.vision import Projector
from app.plan.planner import Plan

SUFFIX_TOKENS = 100_000  # recent requests' tokens the suffix index holds (about 12 MiB, measured)
CACHE_RAM_MIB = 8192  # host memory for prompt caches whose slot was taken (llama-server's --cache-ram default)


class HeadKind(Protocol):
    """How a drafter on the target's own model is opened (its kind declares it, app/drafting/)."""

    name: str
    target_layers: bool  # the target's model must load the head's layers (an MTP head's nextn blocks)

    def open(self, target: Context, params: ModelParams, threads: int) -> HeadDrafter:
        ...


@dataclass
class Loaded:
    engine: Engine
    tokenizer: Tokenizer
    target: Context
    draft: Context | None  # the draft model's context
    head: HeadDrafter | None = None  # a drafter on the target's own model (its MTP head), its context of that model
    vision: Projector | None = None  # the target's vision projector (images in)
    costs: CostModel | None = None  # the speculation costs measured at load (a reload of the same plan may reuse them)

    def close(self) -> None:
        if self.vision is not None:
            self.vision.close()
        head = None
        if self.head is not None:
            self.head.close()
            head = self.head.context
        for c in (head, self.draft, self.target):
            if c is not None:
                c.close()
        for c in (self.draft, self.target):
            if c is not None:
                c.model.close()


def saved_bytes(plan: Plan, cache_ram_mib: int) -> int:
    """Host memory for saved prompt caches: as asked, but at most half of what the plan leaves free."""
    left = plan.host_available - (plan.used if plan.device == "cpu" else plan.host_used)
    return max(0, min(cache_ram_mib * 2**20, left // 2))


def load(plan: Plan, target: ModelInfo, draft: ModelInfo | None, threads: int, adaptive: bool = False,
         suffix_tokens: int = SUFFIX_TOKENS, cache_ram_mib: int = CACHE_RAM_MIB,
         cancel: threading.Event | None = None, chat_template: str | None = None,
         mmproj: Path | None = None, costs: CostModel | None = None, head: HeadKind | None = None) -> Loaded:
    """Target and draft contexts from the plan, and an engine over them. `adaptive`: prompt lookup,
    the suffix index over recent requests (`suffix_tokens`; 0 = none) and the draft model behind the
    controller, with costs calibrated on this machine now. `cache_ram_mib`: host memory for prompt
    caches whose slot was taken (see `saved_bytes`). `cancel`: set, loading stops at llama.cpp's next
    progress report or between its phases (LoadCancelled), and what was loaded is freed.
    `chat_template`: used in place of the target's own (--chat-template-file). `mmproj`: the target's
    vision projector (images in); one that does not fit the target fails the load, naming it.
    `costs`: the costs an earlier load of this plan on this machine measured (a model loaded again:
    calibration is most of a small model's load time), in place of measuring them again. `head`: the
    kind of the drafter on the target's own model the plan has a context for (the MTP head)."""
    made: list[Context] = []

    def context(info: ModelInfo, params, head_layers: bool = False) -> Context:
        model = Model(Path(info.path), params.n_gpu_layers, cancel=cancel, load_mtp=head_layers)
        try:
            made.append(Context(model, params, threads))
        except BaseException:
            model.close()
            raise
        check_cancel(cancel)
        return made[-1]

    if (plan.head is None) != (head is None):
        raise ValueError("a plan with a head drafter's context loads with its kind, and only then")
    drafting_head = vision = None
    try:
        tc = context(target, plan.target, head_layers=head is not None and head.target_layers)
        if mmproj is not None:
            vision = Projector(mmproj, tc.model, threads, use_gpu=plan.target.n_gpu_layers > 0)
        dc = context(draft, plan.draft) if draft is not None and plan.draft is not None else None
        if head is not None:
            drafting_head = head.open(tc, plan.head, threads)
            made.insert(0, drafting_head.context)
        controller = None
        if adaptive:
            # verify decodes hold up to every slot's last token and drafts: their costs are measured too
            if costs is None:
                costs = calibrate(tc, dc, min(64, plan.parallel * (plan.draft_max + 1)) - 1,
                                  stop=cancel.is_set if cancel is not None else None, head=drafting_head)
            controller = adaptive_controller(costs)
    except BaseException:
        if vision is not None:
            vision.close()
        for c in made:
            c.close()
        for c in made:
            c.model.close()
        raise
    halt = threading.Event()  # the engine's stop, shared with the draft model's catch-up
    drafter = build_drafter("adaptive" if adaptive else "draft", dc, controller, suffix_tokens, halt,
                            checkpoints_of(plan, dc, 1) if dc is not None else None, head=drafting_head)
    engine = Engine(tc, drafter, plan.parallel, draft_limit=plan.draft_max, costs=controller,
                    saved_bytes=saved_bytes(plan, cache_ram_mib), halt=halt,
                    checkpoints=checkpoints_of(plan, tc, 0), vision=vision)
    return Loaded(engine, Tokenizer(tc.model, chat_template or target.vocab.chat_template), tc, dc, drafting_head, vision,
                  costs if adaptive else None)


def checkpoints_of(plan: Plan, ctx: Context, which: int) -> Checkpoints:
    """A context's checkpoint store as the plan counted it: its number per slot, and per slot at
    most the bytes the plan holds for them (a larger checkpoint is skipped)."""
    one = plan.checkpoint_bytes[which]
    return Checkpoints(ctx, plan.checkpoints if one else 0, plan.checkpoint_min_step,
                       max_bytes=plan.checkpoints * one + 2**20)


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise LoadCancelled("loading stopped")


DRAFTER_KINDS = ("plain", "draft", "lookup", "suffix", "adaptive")


def build_drafter(kind: str, draft: Context | None, controller: Controller | None = None,
                  suffix_tokens: int = SUFFIX_TOKENS, halt: threading.Event | None = None,
                  checkpoints: Checkpoints | None = None, head: HeadDrafter | None = None) -> Drafter | None:
    """The drafter of one kind, as serve, bench and the equivalence check use it: none (plain
    decoding), the draft model (None without one), prompt lookup, the suffix index over recent
    requests, or all three behind the controller (the suffix index only if `suffix_tokens` > 0).
    `halt`: the engine's stop event, which also stops the draft model catching up over a prompt.
    `checkpoints`: the draft model's context checkpoints (none by default). `head`: a drafter on the
    target's own model (its MTP head) drafts in the draft model's place."""
    if kind == "plain":
        return None
    if kind == "draft":
        return head or (ModelDrafter(draft, halt=halt, checkpoints=checkpoints) if draft else None)
    if kind == "lookup":
        return LookupDrafter()
    if kind == "suffix":
        return SuffixDrafter(SuffixIndex(max(1, suffix_tokens)))
    if kind == "adaptive":
        if controller is None:
            raise ValueError("the adaptive drafter needs a controller")
        suffix = SuffixDrafter(SuffixIndex(suffix_tokens)) if suffix_tokens > 0 else None
        model = head or (ModelDrafter(draft, halt=halt, checkpoints=checkpoints) if draft else None)
        return AdaptiveDrafter(controller, LookupDrafter(), model, suffix)
    raise ValueError(f"unknown drafter kind {kind!r} (one of {', '.join(DRAFTER_KINDS)})")
