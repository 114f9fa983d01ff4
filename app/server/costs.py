"""The speculation costs a start measured, kept for the next start of the same models.

Calibration (app/engine/calibration.py) times target decodes of every size a verify may have and
the draft model's token: on the CPU pair with 2 cores, 28 s of a 34 s start. Those figures depend
only on the model files, the contexts the plan makes (not their sizes), the threads, the llama.cpp
library and the machine, so a start with all of those the same reuses them. The controller corrects
them from the steps it runs, as it does freshly measured ones; a week on, or with anything in the key
changed, a start measures again. One JSON file per key in `paths().costs`. Nothing here may stop a start: a file
that does not read is measured over, one that cannot be written is said once and skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from app.engine.calibration import SIZE_BOUND
from app.engine.controller import CostModel
from app.llama.backend import library_identity
from app.llama.params import ModelParams
from app.server.model_start import ModelStart
from app.settings import paths

log = logging.getLogger("specdeck")

MAX_AGE = 7 * 86400  # seconds a saved measurement is reused for


def _file(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _context(params: ModelParams | None) -> dict | None:
    """A context's settings as its costs depend on them: its size and its logical batch only up to
    SIZE_BOUND (past that they bound nothing calibration does: a decode's cost follows the cells in
    use, not those allocated, and its tokens, not how many one call could take), so a start with
    another --ctx reuses what one measured."""
    if params is None:
        return None
    return {**asdict(params), "n_ctx": min(params.n_ctx, SIZE_BOUND), "n_batch": min(params.n_batch, SIZE_BOUND)}


def costs_key(m: ModelStart, threads: int) -> str:
    """What the costs depend on, hashed: the files, the contexts, the threads, the library and CPU."""
    plan = m.plan
    parts = {"target": _file(m.target.path), "draft": _file(m.draft.path) if m.draft is not None else None,
             "head": m.head.name if m.head is not None else None, "parallel": plan.parallel, "draft_max": plan.draft_max,
             "contexts": [_context(p) for p in (plan.target, plan.draft, plan.head)],
             "threads": threads, "library": library_identity()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _path(m: ModelStart, threads: int) -> Path:
    return paths().costs / f"{costs_key(m, threads)}.json"


def saved_costs(m: ModelStart, threads: int) -> CostModel | None:
    """The costs a start of the same key measured less than MAX_AGE ago, or None."""
    path = _path(m, threads)
    try:
        data = json.loads(path.read_text())
        if time.time() - float(data["measured"]) > MAX_AGE:
            return None
        costs = CostModel({int(n): float(s) for n, s in data["verify"].items()}, data["draft"], data["draft_prefill"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("specdeck: the saved speculation costs in %s do not read (%s): measuring them again", path,
                    type(e).__name__)
        return None
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(data["measured"])))
    log.warning("specdeck: speculation costs as measured at %s (%s; delete it to measure again)", stamp, path)
    return costs


def keep_costs(m: ModelStart, threads: int, costs: CostModel) -> None:
    """Save what this start measured (written whole, then renamed: a reader never sees half)."""
    path = _path(m, threads)
    record = {"measured": time.time(), "verify": {str(n): s for n, s in sorted(costs.verify.items())},
              "draft": costs.draft, "draft_prefill": costs.draft_prefill, "model": m.name}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(record, indent=1))
        part.replace(path)
    except OSError as e:
        log.warning("specdeck: the measured speculation costs are not kept (%s: %s)", path.parent, e.strerror or e)
