"""What the installed llama.cpp build is: its compiled instruction sets, its extra CPU weight
buffers, GPU offload, and the record install.sh left of how it was built."""

from __future__ import annotations

import functools
import json
import platform
import sys
from pathlib import Path

from app.build.isa import build_sets
from app.build.ladder import RECORD_NAME


@functools.cache
def system_info() -> str:
    """llama.cpp's own description of the CPU backend ("CPU : SSE3 = 1 | ... | REPACK = 1 |")."""
    import llama_cpp

    from app.llama.backend import init_llama

    init_llama()  # the CPU backend reports its features once it is registered
    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


def gpu_offload() -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def cpu_buffers(info: str | None = None) -> tuple[str, ...]:
    """The extra buffers this build moves CPU-run matmul weights into, in llama.cpp's order:
    `AMX` when compiled with AMX_INT8, `CPU_REPACK` when compiled with repacking (on x86 its
    kernels need AVX2)."""
    sets = build_sets(system_info() if info is None else info)
    out = []
    if "AMX_INT8" in sets:
        out.append("AMX")
    if "REPACK" in sets and ("AVX2" in sets or platform.machine() not in ("x86_64", "AMD64")):
        out.append("CPU_REPACK")
    return tuple(out)


def build_record(prefix: str = sys.prefix) -> dict | None:
    """install.sh's record of the settled build (rung, CMake flags, smoke result), if present."""
    try:
        return json.loads((Path(prefix) / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
