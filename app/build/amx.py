"""Whether llama.cpp's AMX kernels would run here, asked before anything is compiled, in two
steps of about a second each:

1. The CPU and kernel: a tiny C program asks the kernel for the tile state (arch_prctl
   ARCH_REQ_XCOMP_PERM for XTILEDATA, as Linux requires before any tile instruction) and runs one
   tile instruction (ldtilecfg, tilezero, tilerelease, written as bytes so any assembler takes
   them). A VM can advertise `amx_tile` and refuse it.
2. The compiler: ggml configures its tiles by filling a struct field by field and handing it to
   `_tile_loadconfig` (ggml-cpu/amx/mmq.cpp, `ggml_tile_config_init`). GCC 12 (Debian 12's) at
   -O2/-O3 drops those stores as dead (its RTL dead-store pass does not see ldtilecfg read them),
   so the tiles stay unconfigured and the first `tilezero` dies with SIGILL: seen on an Intel
   Xeon VM whose CPU runs AMX, in gdb at `tilezero %tmm4` in ggml_backend_amx_mul_mat, with
   `ldtilecfg` after a zeroed config in the disassembly. A C++ program of the same shape, built
   with the C++ compiler that builds llama.cpp and llama.cpp's flags (-O3 -march=native), is run.

No Python package runs an instruction of our choosing, hence the programs. Standard library only
(install.sh runs it before specdeck's dependencies are installed).

    python -m app.build.amx     prints the answer; exit 0: AMX runs, 1: it cannot, 2: unknown
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REFUSED = 3  # the program's exit status when the kernel refuses the tile state

SOURCE = r"""
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int main(void) {
    unsigned char cfg[64];
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 3;
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;                      /* palette 1 */
    cfg[16] = 64;                    /* tmm0: 64 bytes a row */
    cfg[48] = 16;                    /* tmm0: 16 rows */
    __asm__ volatile(".byte 0xc4,0xe2,0x78,0x49,0x00" :: "a"(cfg) : "memory");  /* ldtilecfg (%rax) */
    __asm__ volatile(".byte 0xc4,0xe2,0x7b,0x49,0xc0" ::: "memory");            /* tilezero %tmm0 */
    __asm__ volatile(".byte 0xc4,0xe2,0x78,0x49,0xc0" ::: "memory");            /* tilerelease */
    return 0;
}
"""


# ggml's tile configuration, as ggml_tile_config_init writes it (the shape, not its code): a
# zero-initialised struct, fields set one by one, then _tile_loadconfig, inside a lambda
CONFIG_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>

struct config { uint8_t palette = 0; uint8_t start_row = 0; uint8_t reserved[14] = {0};
                uint16_t colsb[16] = {0}; uint8_t rows[16] = {0}; };

static inline void configure() {
    static thread_local bool done = false;
    if (done) return;
    alignas(64) config c = {};
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = i < 2 ? 8 : 16; c.colsb[i] = i == 2 || i == 3 ? 32 : 64; }
    _tile_loadconfig(&c);
    done = true;
}

template <typename F> __attribute__((noinline)) void each(int n, F f) { f(0, n); }

int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0)  /* ARCH_REQ_XCOMP_PERM, XTILEDATA */
        return 3;
    each(2, [](int begin, int end) { configure(); for (int i = begin; i < end; i++) { _tile_zero(4); _tile_zero(6); } });
    _tile_release();
    return 0;
}
"""


@dataclass(frozen=True)
class AmxProbe:
    runs: bool | None  # None: the question could not be asked (no compiler, not x86-64 Linux)
    why: str


def verdict(returncode: int) -> AmxProbe:
    """The program's exit status read: 0 ran a tile instruction; REFUSED, the kernel would not give
    the tile state; killed by a signal, the instruction faulted."""
    if returncode == 0:
        return AmxProbe(True, "a tile instruction ran")
    if returncode == REFUSED:
        return AmxProbe(False, "the kernel refuses the AMX tile state")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return AmxProbe(False, f"a tile instruction died with {name}")
    return AmxProbe(None, f"the probe exited with {returncode}")


def compile_and_run(compiler: str, flags: list[str], source: str, suffix: str, timeout: float) -> int | AmxProbe:
    """The program's exit status (negative: the signal that killed it), or why there is none."""
    if shutil.which(compiler) is None:
        return AmxProbe(None, f"no compiler ({compiler})")
    with tempfile.TemporaryDirectory(prefix="specdeck-amx-") as d:
        src, exe = Path(d) / f"amx{suffix}", Path(d) / "amx"
        src.write_text(source)
        try:
            built = subprocess.run([compiler, *flags, "-o", str(exe), str(src)], capture_output=True, text=True,
                                   timeout=timeout)
            if built.returncode != 0:
                return AmxProbe(None, "the probe did not compile: " + (built.stderr.strip().splitlines() or ["?"])[-1])
            return subprocess.run([str(exe)], capture_output=True, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return AmxProbe(None, "the probe did not finish")
        except OSError as e:
            return AmxProbe(None, f"the probe could not run: {e.strerror or e}")


def probe_amx(cc: str | None = None, cxx: str | None = None, timeout: float = 60.0, source: str = SOURCE,
              config_source: str = CONFIG_SOURCE) -> AmxProbe:
    """Ask the CPU (`cc`: the C compiler, else $CC, else cc), then the C++ compiler that builds
    llama.cpp (`cxx`, else $CXX, else c++) with ggml's way of configuring tiles."""
    if not sys.platform.startswith("linux"):
        return AmxProbe(None, "not Linux")
    code = compile_and_run(cc or os.environ.get("CC") or "cc", ["-O0"], source, ".c", timeout)
    cpu = code if isinstance(code, AmxProbe) else verdict(code)
    if not cpu.runs:
        return cpu
    compiler = cxx or os.environ.get("CXX") or "c++"
    code = compile_and_run(compiler, ["-O3", "-march=native"], config_source, ".cpp", timeout)
    if isinstance(code, AmxProbe):
        return code
    if code == 0:
        return AmxProbe(True, "a tile instruction ran, and the compiler keeps ggml's tile configuration")
    if code < 0 and -code == signal.SIGILL:
        return AmxProbe(False, f"the CPU runs AMX, but {compiler_name(compiler)} drops ggml's tile configuration "
                               "(its stores before ldtilecfg): llama.cpp's AMX kernels would die with SIGILL")
    return AmxProbe(None, f"the tile configuration probe ended with {verdict(code).why}")


def compiler_name(compiler: str) -> str:
    """`g++ 12.2.0`, from the compiler's --version (its command where it does not say)."""
    try:
        out = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return f"{compiler} {out}" if out else compiler


def main() -> int:
    p = probe_amx()
    print(("AMX runs" if p.runs else "AMX cannot run" if p.runs is False else "AMX unknown") + f": {p.why}")
    return {True: 0, False: 1, None: 2}[p.runs]


if __name__ == "__main__":
    sys.exit(main())
