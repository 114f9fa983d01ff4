"""Whether this CPU can run AMX, asked before anything is compiled: a VM can advertise `amx_tile`
in /proc/cpuinfo and still refuse the tile instructions (llama.cpp's native build then dies at its
first decode). The question takes about a second: a tiny C program, compiled here with the compiler
that builds llama.cpp, asks the kernel for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM for
XTILEDATA, as Linux requires before any tile instruction) and runs one tile instruction (ldtilecfg,
tilezero, tilerelease, written as bytes so any assembler takes them). No Python package runs an
instruction of our choosing, hence the program. Standard library only (install.sh runs it before
specdeck's dependencies are installed).

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


def probe_amx(cc: str | None = None, timeout: float = 60.0, source: str = SOURCE) -> AmxProbe:
    """Compile and run the probe (`cc`: the compiler, else $CC, else cc)."""
    if not sys.platform.startswith("linux"):
        return AmxProbe(None, "not Linux")
    compiler = cc or os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        return AmxProbe(None, f"no C compiler ({compiler})")
    with tempfile.TemporaryDirectory(prefix="specdeck-amx-") as d:
        src, exe = Path(d) / "amx.c", Path(d) / "amx"
        src.write_text(source)
        try:
            built = subprocess.run([compiler, "-O0", "-o", str(exe), str(src)], capture_output=True, text=True,
                                   timeout=timeout)
            if built.returncode != 0:
                return AmxProbe(None, "the probe did not compile: " + (built.stderr.strip().splitlines() or ["?"])[-1])
            return verdict(subprocess.run([str(exe)], capture_output=True, timeout=timeout).returncode)
        except subprocess.TimeoutExpired:
            return AmxProbe(None, "the probe did not finish")
        except OSError as e:
            return AmxProbe(None, f"the probe could not run: {e.strerror or e}")


def main() -> int:
    p = probe_amx()
    print(("AMX runs" if p.runs else "AMX cannot run" if p.runs is False else "AMX unknown") + f": {p.why}")
    return {True: 0, False: 1, None: 2}[p.runs]


if __name__ == "__main__":
    sys.exit(main())
