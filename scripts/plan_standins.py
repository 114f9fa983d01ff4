#!/usr/bin/env python3
"""Plan both 27B presets for a 24 GiB card from stand-ins of their files (real headers and tensor
tables, no tensor data; see app/gguf/synthetic.py for what is assumed), as docs/BENCHMARKS.md shows them.

    python scripts/plan_standins.py [--vram 24GiB] [--ctx 110000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from app.drafting.mtp import KIND as MTP  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.gguf.projector import read_projector  # noqa: E402
from app.gguf.synthetic import ASSUMED, SHAPES, write_mmproj_header, write_sparse  # noqa: E402
from app.plan.hardware import detect  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402
from app.plan.view import render_plan  # noqa: E402
from app.units import parse_size  # noqa: E402

TRUE_SIZES = {"qwen3.6-27b": 16_817_244_384, "qwen3.6-27b-mtp": 17_106_773_120, "qwen3.5-0.8b": 532_517_120,
              "gemma3-27b": 17_229_630_496, "gemma3-270m": 241_410_624}
# preset: (target, draft model, or "mtp": the target's own MTP head)
PRESETS = {"qwen3.6-27b-mtp": ("qwen3.6-27b-mtp", "mtp"), "qwen3.6-27b": ("qwen3.6-27b", "qwen3.5-0.8b"),
           "gemma3-27b": ("gemma3-27b", "gemma3-270m")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vram", default="24GiB")
    ap.add_argument("--ctx", type=int, default=110_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mmproj", action="store_true", help="with each preset's vision projector (header stand-ins of "
                    "their published shapes); the preset's context shrinks where 110K no longer fits")
    args = ap.parse_args()
    console = Console(width=110)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for preset, (t, dr) in PRESETS.items():
            models = (t,) if dr == "mtp" else (t, dr)
            infos = [read_model_info(write_sparse(Path(d) / f"{n}.gguf", SHAPES[n], TRUE_SIZES[n])) for n in models]
            vision = None
            if args.mmproj:
                which = "gemma3-27b" if t.startswith("gemma") else "qwen3.6-27b"
                vision = read_projector(write_mmproj_header(Path(d) / f"{which}-mmproj.gguf", which))
            req = PlanRequest(vram=parse_size(args.vram), ctx=None if args.mmproj else args.ctx,
                              ctx_is_user_choice=not args.mmproj)
            plan = make_plan(infos[0], infos[1] if len(infos) > 1 else None, req, detect(), args.ctx, head=MTP.rows if dr == "mtp" else None,
                             projector=vision)
            out[preset] = plan.to_json()
            if not args.json:
                console.print(render_plan(plan, preset))
                console.print("assumed: " + "; ".join(sum((ASSUMED[n] for n in models), [])) + "\n", markup=False)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
