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

MiB = 1024 * 1024
_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
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
) -> Allocation:
    """Load `path`, create a context with these parameters, free both; return what llama.cpp allocated.

    With `no_alloc`, llama.cpp reads no tensor data and reports the model and KV buffers as 0, but
    still really allocates (and reports) the recurrent state and output buffer, and sizes the
    compute buffer from its first prompt graph. With `mtp`, the model is loaded with its MTP layers
    and an MTP context is made beside the target's: what that context allocates is returned under
    kinds prefixed "mtp " ("mtp KV", "mtp compute", "mtp output")."""
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
            made.append(llama_cpp.llama_init_from_model(model, cp))
            if not made[-1]:
                raise SpecdeckError(f"{path}: llama.cpp could not create a context with n_ctx={n_ctx}")
            if mtp:
                n_target_lines = len(lines)
                cp.ctx_type, cp.ctx_other, cp.n_rs_seq = llama_cpp.LLAMA_CONTEXT_TYPE_MTP, made[0], 0
                made.append(llama_cpp.llama_init_from_model(model, cp))
                if not made[-1]:
                    raise SpecdeckError(f"{path}: llama.cpp could not create an MTP context")
        finally:
            for ctx in reversed(made):
                if ctx:
                    llama_cpp.llama_free(ctx)
            llama_cpp.llama_model_free(model)
    if not mtp:
        return parse_allocation(lines)
    alloc = parse_allocation(lines[:n_target_lines])
    for kind, bufs in parse_allocation(lines[n_target_lines:]).by_kind.items():
        alloc.by_kind[f"mtp {kind}"] = bufs
    return alloc
