"""A start keeps the speculation costs it measured (app/server/costs.py), and the next start of the
same models, plan (at any context size), threads and library reuses them instead of timing decodes
again; anything else changed, a week gone, or a file that does not read: measured again. A folder that cannot be written
never stops a start. On the tiny pair, loaded as `serve` loads a model (`load_model`)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.plan.planner import PlanRequest, make_plan
from app.server.lifecycle import load_model
from app.server.model_start import ModelStart
from app.server.settings import ServeSettings

EDITED = 123.0  # a verify cost no decode of the tiny target takes: seen again only if the file was read


def start_of(tiny, parallel: int = 2, ctx: int = 512) -> ModelStart:
    t, d = read_model_info(tiny.target), read_model_info(tiny.draft)
    plan = make_plan(t, d, PlanRequest(ctx=ctx, ctx_is_user_choice=True, parallel=parallel, draft_max=4), detect(), 512)
    return ModelStart("tiny", plan, t, d)


def verify_one(m: ModelStart, threads: int = 1, speculative: bool = True) -> float | None:
    """A start's cost of a one-token verify (None: it has no costs, speculation off)."""
    loaded = load_model(m, threads, ServeSettings(speculative=speculative))
    try:
        return loaded.costs.verify[1] if loaded.costs is not None else None
    finally:
        loaded.close()


def saved(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def edit(path: Path, **changes) -> None:
    rec = json.loads(path.read_text())
    rec["verify"]["1"] = EDITED
    rec.update(changes)
    path.write_text(json.dumps(rec))


@pytest.fixture()
def costs(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDECK_COSTS_DIR", str(tmp_path / "costs"))
    return tmp_path / "costs"


def test_a_start_reuses_what_an_earlier_start_of_the_same_plan_measured(tiny, costs, caplog):
    caplog.set_level(logging.WARNING, logger="specdeck")
    m = start_of(tiny)
    measured = verify_one(m)
    [kept] = saved(costs)
    rec = json.loads(kept.read_text())
    assert rec["verify"]["1"] == measured and rec["draft"] > 0 and rec["model"] == "tiny"
    assert time.time() - rec["measured"] < 600
    edit(kept)
    assert verify_one(m) == EDITED  # read back, not measured
    assert "speculation costs as measured at" in caplog.text and str(kept) in caplog.text
    # another context size: the same costs (a decode's cost follows the cells in use, not those allocated)
    bigger = start_of(tiny, ctx=1024)
    assert bigger.plan.target.n_ctx > m.plan.target.n_ctx and verify_one(bigger) == EDITED
    assert len(saved(costs)) == 1
    # another thread count, another plan: each measured and kept beside
    assert verify_one(m, threads=2) != EDITED
    assert verify_one(start_of(tiny, parallel=1)) != EDITED
    assert len(saved(costs)) == 3
    # speculation off: nothing measured, nothing kept
    assert verify_one(m, speculative=False) is None and len(saved(costs)) == 3


def test_an_old_or_unreadable_record_is_measured_again_and_an_unwritable_folder_stops_nothing(tiny, costs, caplog,
                                                                                              monkeypatch, tmp_path):
    caplog.set_level(logging.WARNING, logger="specdeck")
    m = start_of(tiny)
    verify_one(m)
    [kept] = saved(costs)
    edit(kept, measured=time.time() - 8 * 86400)  # past a week
    assert verify_one(m) != EDITED
    assert json.loads(kept.read_text())["verify"]["1"] != EDITED  # written over with the new measure
    for junk in ("{not json", json.dumps({"measured": time.time(), "verify": {"one": "fast"}})):
        kept.write_text(junk)
        caplog.clear()
        assert verify_one(m) > 0
        assert "do not read" in caplog.text and "measuring them again" in caplog.text
        assert "Traceback" not in caplog.text
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SPECDECK_COSTS_DIR", str(blocked / "costs"))
    caplog.clear()
    assert verify_one(m) > 0  # the start goes on
    assert "the measured speculation costs are not kept" in caplog.text
