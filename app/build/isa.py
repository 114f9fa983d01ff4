"""Instruction sets: what this CPU advertises and what a llama.cpp build was compiled to use."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

# /proc/cpuinfo flag -> llama.cpp's system-info name, for the x86 sets ggml compiles kernels for.
X86_FLAGS = {
    "pni": "SSE3", "sse3": "SSE3", "ssse3": "SSSE3", "avx": "AVX", "avx2": "AVX2", "f16c": "F16C", "fma": "FMA",
    "bmi2": "BMI2", "avx_vnni": "AVX_VNNI", "avx512f": "AVX512", "avx512vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI", "avx512_bf16": "AVX512_BF16", "amx_int8": "AMX_INT8",
    "amx_tile": "AMX_TILE", "amx_bf16": "AMX_BF16",
}
_ISA_PREFIXES = ("avx", "amx", "sse", "ssse", "pni", "fma", "f16c", "bmi", "sve", "asimd", "neon", "dotprod", "i8mm", "sme")
_INFO_ITEM = re.compile(r"([A-Z0-9_]+)\s*=\s*1")


@dataclass(frozen=True)
class CpuIsa:
    """The CPU as the kernel describes it."""

    machine: str  # x86_64, aarch64 ...
    model: str
    flags: frozenset[str]  # every flag /proc/cpuinfo lists

    @property
    def sets(self) -> tuple[str, ...]:
        """llama.cpp's names of the instruction sets this CPU advertises."""
        return tuple(name for flag, name in X86_FLAGS.items() if flag in self.flags)

    @property
    def advertises_amx(self) -> bool:
        return bool({"amx_tile", "amx_int8"} & self.flags)

    def fingerprint(self) -> str:
        """What a native build depends on: the architecture, the model name and every vector, matrix
        and bit-manipulation flag advertised (a fixed rule, so a cached wheel's key never drifts)."""
        return f"{self.machine}:{self.model}:" + ",".join(sorted(f for f in self.flags if f.startswith(_ISA_PREFIXES)))


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuIsa:
    """The first processor's flags and model name (all cores of one machine share them)."""
    flags: frozenset[str] = frozenset()
    model = platform.processor() or "unknown"
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
        elif key in ("model name", "Model") and model in ("unknown", ""):
            model = value.strip()
        elif key in ("model name",):
            model = value.strip()
    return CpuIsa(platform.machine(), model, flags)


def build_sets(system_info: str) -> tuple[str, ...]:
    """The instruction sets a build's CPU backend was compiled with, from `llama_print_system_info()`
    ("CPU : SSE3 = 1 | AVX = 1 | ... | AMX_INT8 = 1 | REPACK = 1 |")."""
    return tuple(dict.fromkeys(_INFO_ITEM.findall(system_info)))


def unsupported(build: tuple[str, ...], cpu: CpuIsa) -> tuple[str, ...]:
    """Sets the build uses that this CPU does not even advertise (a sure SIGILL). A set the CPU
    advertises may still fail to run (a VM's AMX): only the smoke decode proves that."""
    have = set(cpu.sets)
    known = set(X86_FLAGS.values())
    return tuple(s for s in build if s in known and s not in have and cpu.machine in ("x86_64", "AMD64"))
