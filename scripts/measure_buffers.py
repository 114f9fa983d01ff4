"""Each model's CPU weight buffers as llama.cpp allocates them, next to the planner's terms.

    python scripts/measure_buffers.py [FILE.gguf ...]   (default: every model in specdeck's cache)

Prints, per file, the AMX and CPU_REPACK copies and the CPU_Mapped span: predicted by
`app.plan.terms` for the extra buffers the *installed* build has (`app.build.info.cpu_buffers`), and
reported by llama.cpp when it loads the file (no decode, so it runs even under a build whose
kernels this CPU cannot execute). The test suite's AMX figures were measured with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.build.info import cpu_buffers, system_info  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.llama.measure import measure  # noqa: E402
from app.plan import terms as M  # noqa: E402
from app.settings import paths  # noqa: E402


def main(files: list[str]) -> int:
    bufs = cpu_buffers()
    print(f"build: {system_info()}\nextra buffers: {', '.join(bufs) or 'none'}")
    found = [Path(f) for f in files] or sorted(paths().store.glob("*/*.gguf"))
    for path in found:
        info = read_model_info(path)
        got = measure(path, 2048)
        pred = M.cpu_extra_bytes(info, 0, bufs)
        cells = [f"{b} {pred.get(b, 0) / M.MiB:.2f} / {got.get('model', b) / M.MiB:.2f}" for b in M.CPU_EXTRA_BUFFERS]
        cells.append(f"CPU_Mapped {M.mapped_report_bytes(info, bufs) / M.MiB:.2f} / {got.get('model', 'CPU_Mapped') / M.MiB:.2f}")
        print(f"{path.name}: " + " · ".join(cells) + "  (MiB, planned / llama.cpp)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
