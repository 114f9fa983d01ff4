"""What llama.cpp really allocates for a model and context: its own buffer-size log lines, parsed.

Used to hold the planner's arithmetic against llama.cpp (tests, `specdeck plan --measure`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from gguf import GGMLQuantizationType

from app.errors import SpecdeckError
from app.llama.backend import capture_llama_log
from app.llama.nextn import emit_hidden

MiB = 1024 * 1024
_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
# at a context's end llama.cpp says how large its compute buffer grew (a decode may need more than
# the graph reserved at its start: with hidden-state output on, for one)
_FINAL = re.compile(r"(\S+) compute buffer size is\s+([\d.]+) MiB")
KV_TYPE_IDS = {name: int(GGMLQuantizationType[name.upper()]) for name in
               ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")}


@dataclass
class Allocation:
    """Bytes per kind ("model", "KV", "RS", "compute", "output") and buffer (CPU, CPU_REPACK, CUDA0 ...)."""

    by_kind: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))

    def total(self, kind: str) -> int:
        return sum(self.by_kind.get(kind, {}).values())

    def get(self, kind: str, buffer: str) -> int:
        return self.by_kind.get(kind, {}).get(buffer, 0)


def parse_allocation(lines: list[str]) -> Allocation:
    """Sum llama.cpp's 'X buffer size = N MiB' lines. The compute buffer is reported once per reserve: keep the last."""
    alloc = Allocation()
    for line in "".join(lines).splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        buf, kind, mib = m.group(1), m.group(2), float(m.group(3))
        value = round(mib * MiB)
        if kind in ("compute",):
            alloc.by_kind[kind][buf] = value
        else:
            alloc.by_kind[kind][buf] = alloc.by_kind[kind].get(buf, 0) + value
    return alloc


def measure(
    path: Path,
    n_ctx: int,
    type_k: str = "f16",
    type_v: str = "f16",
    n_ubatch: int = 512,
    n_batch: int = 2048,
    n_seq_max: int = 1,
    kv_unified: bool = True,
    swa_full: bool = False,
    flash_attn: bool = True,
    n_rs_seq: int = 0,
    n_gpu_layers: int = 0,
    no_alloc: bool = False,
    mtp: bool = False,
    n_outputs_max: int = 0,
    hidden: bool = False,
) -> Allocation:
    """Load `path`, create a context with these parameters, free both; return what llama.cpp allocated.

    With `no_alloc`, llama.cpp reads no tensor data and reports the model and KV buffers as 0, but
    still really allocates (and reports) the recurrent state and output buffer, and sizes the
    compute buffer from its first prompt graph. With `mtp`, the model is loaded with its MTP layers
    and an MTP context is made beside the target's: what that context allocates is returned under
    kinds prefixed "mtp " ("mtp KV", "mtp compute", "mtp output"). `n_outputs_max`: the most logits
    rows one decode may ask for (0: n_batch, llama.cpp's default); an MTP context gets n_seq_max. With
    `hidden`, the target context hands out every token's hidden state (as it does for an MTP head)
    and decodes one full ubatch: the compute buffer it then holds is under "compute after a decode"."""
    with capture_llama_log() as lines:
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.load_mtp = mtp
        if no_alloc:  # read the header, simulate the allocations: works on files without tensor data
            mp.no_alloc = True
            mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise SpecdeckError(f"{path}: llama.cpp could not load the model")
        made = []
        try:
            cp = llama_cpp.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_ubatch
            cp.n_seq_max, cp.kv_unified, cp.swa_full, cp.n_rs_seq = n_seq_max, kv_unified, swa_full, n_rs_seq
            cp.type_k, cp.type_v = KV_TYPE_IDS[type_k], KV_TYPE_IDS[type_v]
            cp.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
            cp.n_threads = cp.n_threads_batch = 1
            cp.n_outputs_max = n_outputs_max
            made.append(llama_cpp.llama_init_from_model(model, cp))
            if not made[-1]:
                raise SpecdeckError(f"{path}: llama.cpp could not create a context with n_ctx={n_ctx}")
            if hidden:
                _decode_a_ubatch(made[0], min(n_ubatch, n_batch, n_ctx))
            if mtp:
                n_target_lines = len(lines)
                cp.ctx_type, cp.ctx_other, cp.n_rs_seq = llama_cpp.LLAMA_CONTEXT_TYPE_MTP, made[0], 0
                cp.n_outputs_max = n_seq_max if n_outputs_max else 0
                made.append(llama_cpp.llama_init_from_model(model, cp))
                if not made[-1]:
                    raise SpecdeckError(f"{path}: llama.cpp could not create an MTP context")
        finally:
            for ctx in reversed(made):
                if ctx:
                    llama_cpp.llama_free(ctx)
            llama_cpp.llama_model_free(model)
    final = [m for m in map(_FINAL.search, lines) if m]
    if not mtp:
        alloc = parse_allocation(lines)
    else:
        alloc = parse_allocation(lines[:n_target_lines])
        for kind, bufs in parse_allocation(lines[n_target_lines:]).by_kind.items():
            alloc.by_kind[f"mtp {kind}"] = bufs
    if hidden and final:  # contexts are freed in reverse: the target's line is the last
        alloc.by_kind["compute after a decode"] = {final[-1].group(1): round(float(final[-1].group(2)) * MiB)}
    return alloc


def _decode_a_ubatch(ctx, n: int) -> None:
    """One decode of n tokens (one ubatch), with hidden-state output on for every token."""
    emit_hidden(ctx, False)
    tokens = (llama_cpp.llama_token * n)(*[5 + i % 100 for i in range(n)])
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, n)) != 0:
        raise SpecdeckError("llama.cpp could not decode the measuring batch")
