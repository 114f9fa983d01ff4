"""The budget's rows for one model: its weights (and the extra copies a CPU build makes), KV cache,
recurrent state and buffers; and those of a drafter that runs on the target's own model (its MTP
head: `HeadRows`, which each such drafter kind declares in app/drafting/). `planner` adds them up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.gguf.info import ModelInfo
from app.gguf.projector import ProjectorInfo
from app.plan import terms as M

Device = Literal["cuda", "cpu"]  # the one definition: the planner imports it


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    where: Literal["device", "host"]
    note: str = ""


EXTRA_COPY_LABELS = {"CPU_REPACK": ("CPU repack copy", "Q4 matmul weights, repacked for AVX2"),
                     "AMX": ("AMX copy", "matmul weights packed for AMX tiles")}


def extra_copies(role: str, info: ModelInfo, ngl: int, buffers: tuple[str, ...], where: Literal["device", "host"],
                 note: str | None = None) -> list[Term]:
    """One term per extra CPU buffer the build has (none for a build without AMX or repacking)."""
    return [Term(f"{role} {EXTRA_COPY_LABELS[b][0]}", n, where, note or EXTRA_COPY_LABELS[b][1])
            for b, n in M.cpu_extra_bytes(info, ngl, buffers).items()]


def model_terms(role: str, info: ModelInfo, cs: M.ContextShape, ngl: int, device: Device,
                buffers: tuple[str, ...], hidden: bool = False) -> list[Term]:
    """Weights (less MTP blocks: llama.cpp skips them unless an MTP context is made; `mtp_terms`
    counts them), KV cache, recurrent state and buffers of one model. `hidden`: the context hands
    out every token's hidden state (for an MTP head), which its compute buffer holds too."""
    nextn = M.nextn_bytes(info)
    if device == "cpu":
        out = [Term(f"{role} weights", M.data_bytes(info) - nextn, "device", f"{info.quantization}, mapped")]
        out += extra_copies(role, info, 0, buffers, "device")
    else:
        gpu, host = M.weight_placement(info, ngl)
        gpu -= min(nextn, gpu)
        out = [Term(f"{role} weights", gpu, "device", f"{info.quantization}, {min(ngl, info.n_layers + 1)}/{info.n_layers + 1} layers"),
               Term(f"{role} weights on host", host, "host", "token_embd" + (" + CPU layers" if ngl <= info.n_layers else ""))]
    kv_note = f"{cs.n_ctx:,} cells, K {cs.type_k}, V {cs.type_v}"
    if info.n_swa_layers:
        kv_note += f", {info.n_swa_layers} sliding-window layers"
    out.append(Term(f"{role} KV cache", M.kv_bytes(info, cs), "device", kv_note))
    if info.n_recurrent_layers:
        out.append(Term(f"{role} recurrent state", M.recurrent_state_bytes(info, cs), "device",
                        f"{info.n_recurrent_layers} layers x {cs.n_seq} slots x (1 + {cs.n_rs_seq} rollback snapshots)"))
    rows = f"n_ubatch {cs.n_ubatch}, {min(cs.n_ubatch, cs.n_outputs_max or cs.n_ubatch)} logits rows"
    out.append(Term(f"{role} compute (hidden-state output)" if hidden else f"{role} compute buffer",
                    M.compute_bytes(info, cs, hidden), "device", rows))
    out.append(Term(f"{role} output buffer", M.output_bytes(info, cs), "host" if device == "cuda" else "device",
                    f"{cs.n_outputs} logits rows x {cs.n_seq} slots"))
    return out


@dataclass(frozen=True)
class HeadRows:
    """What the planner needs of a drafter that runs on the target's own model (reads its hidden
    states, keeps a context of its own over the target's cells): declared by its kind
    (app/drafting/), never named here."""

    name: str  # as --draft names it
    label: str  # as the plan's table names its column ("MTP head")
    draft_max: int  # its draft length where the user sets none
    terms: Callable[[ModelInfo, M.ContextShape, Device], list[Term]]  # its rows beside the target's of this shape
    shape: Callable[[M.ContextShape], M.ContextShape]  # its context beside the target's
    missing: Callable[[ModelInfo], str | None]  # why this target cannot carry it (None: it can)
    hint: str = ""  # what to do then


def mtp_shape(cs: M.ContextShape) -> M.ContextShape:
    """The MTP head's context beside a target's of shape `cs`: the same cells, one draft row per slot
    a decode (llama-server's cap), no recurrent state."""
    return M.context_shape(cs.n_ctx, cs.n_seq, cs.type_k, cs.type_v, n_batch=cs.n_batch, n_ubatch=cs.n_ubatch,
                           flash_attn=cs.flash_attn, n_outputs_max=cs.n_seq)


def mtp_terms(info: ModelInfo, cs: M.ContextShape, device: Device) -> list[Term]:
    """The target's MTP head (--draft mtp): its blocks' weights, its context's cache (the nextn
    blocks' K and V over the target's cells), its compute and logits buffers, and the hidden state
    of every token the target decodes, which it reads."""
    where: Literal["device", "host"] = "host" if device == "cuda" else "device"
    mtp_cs = mtp_shape(cs)
    return [Term("MTP head weights", M.nextn_bytes(info), "device", f"{info.n_nextn} nextn layer(s), from the target's file"),
            Term("MTP KV cache", M.kv_bytes(info, mtp_cs, nextn=True), "device", f"{cs.n_ctx:,} cells, K {cs.type_k}, V {cs.type_v}"),
            Term("MTP compute buffer", M.compute_bytes(info, mtp_cs), "device", f"n_ubatch {cs.n_ubatch}, {cs.n_seq} logits rows"),
            Term("MTP output buffer", M.output_bytes(info, mtp_cs), where, f"1 logits row x {cs.n_seq} slots"),
            Term("target hidden-state output buffer", 4 * info.n_embd * cs.n_batch, where,
                 f"{cs.n_batch} rows of {info.n_embd} floats")]


@dataclass(frozen=True)
class VisionFacts:
    """What images cost in this plan's context: tokens an image at the projector's size, how many
    such images one request's context holds, and the side of the largest image it holds."""

    tokens_per_image: int
    image_size: int
    images_per_request: int
    largest_image: int


def vision_facts(projector: ProjectorInfo, ctx: int) -> VisionFacts:
    """A request may use the whole context (the slots share one KV pool)."""
    return VisionFacts(projector.tokens_per_image, projector.image_size, ctx // projector.tokens_per_image,
                       projector.largest_image(ctx))


def vision_terms(projector: ProjectorInfo) -> list[Term]:
    """The projector's weights and the compute buffer libmtmd reserves for one image (on the card
    where the target is, as llama-server offloads it)."""
    return [Term("vision projector weights", projector.weights_bytes, "device",
                 f"{projector.path.name}: {projector.projector_type}, {projector.n_layer} layers"),
            Term("vision projector compute", projector.compute_bytes, "device",
                 f"one image at {projector.image_size}x{projector.image_size}: {projector.patches:,} patches")]
