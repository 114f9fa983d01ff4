"""Validation baselines: one record per preset (machine, build, models and digests, plan, settings,
every figure, date) in <state>/baselines/, and the comparison of a new run with it.

Tolerances (defaults; `--tolerance NAME=VALUE` changes one, VALUE a share such as 15% or 0.15):

    tokens_per_second  0.10   decode speed (ABBA medians): more than 10 % below the baseline is a regression
    throughput         0.20   aggregate tokens/s at 1 and `parallel` streams (one round, prompts and the
                              adaptive controller's choices included: measured to move ~15 % between restarts)
    acceptance         0.10   absolute: 0.62 -> 0.51 is a regression
    ttft               0.25   time to first token (cold, cached, long context): 25 % above, and at least 50 ms
    memory             0.10   peak RSS / VRAM during the long-context request: 10 % above
    errors             0      any failed request, server restart during the run, unexplained greedy difference, or the draft gone

Acceptance is compared only where both runs drafted at least MIN_DRAFTED tokens: the adaptive
controller may judge plain decoding faster on a machine and draft little.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

from app.errors import SpecdeckError

TOLERANCES = {"tokens_per_second": 0.10, "throughput": 0.20, "acceptance": 0.10, "ttft": 0.25, "memory": 0.10, "errors": 0.0}
MIN_DRAFTED = 32  # an adaptive controller that drafted a handful of tokens gives no acceptance worth comparing
TTFT_FLOOR_S = 0.05  # a cached TTFT of 20 ms against 15 ms is noise, not a regression

# figure -> (tolerance, direction): "down" = lower is worse (relative), "down_abs", "up" = higher is worse
RULES = {
    "decode_tps_spec": ("tokens_per_second", "down"),
    "decode_tps_plain": ("tokens_per_second", "down"),
    "throughput_1": ("throughput", "down"),
    "throughput_parallel": ("throughput", "down"),
    "acceptance": ("acceptance", "down_abs"),  # judged where both runs drafted MIN_DRAFTED tokens or more
    "draft_model": ("errors", "lost"),
    "ttft_cold_s": ("ttft", "up"),
    "ttft_cached_s": ("ttft", "up"),
    "long_ctx_ttft_s": ("ttft", "up"),
    "peak_memory": ("memory", "up"),
    "errors": ("errors", "count"),
    "equivalence_failures": ("errors", "count"),
    "soak_errors": ("errors", "count"),
    "soak_restarts": ("errors", "count"),
    "restarts": ("errors", "count"),
}


def parse_tolerances(items: list[str] | None) -> dict[str, float]:
    out = dict(TOLERANCES)
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in TOLERANCES:
            raise SpecdeckError(f"bad --tolerance {item!r}: expected NAME=VALUE with NAME one of {', '.join(TOLERANCES)}")
        try:
            v = float(value.strip()[:-1]) / 100 if value.strip().endswith("%") else float(value)
        except ValueError:
            raise SpecdeckError(f"bad --tolerance {item!r}: {value!r} is not a number or a percentage") from None
        if v < 0:
            raise SpecdeckError(f"bad --tolerance {item!r}: a tolerance cannot be negative")
        out[name] = v
    return out


@dataclass
class Finding:
    figure: str
    baseline: float | None
    now: float | None
    limit: float | None
    regression: bool
    text: str

    def to_json(self) -> dict:
        return {"figure": self.figure, "baseline": self.baseline, "now": self.now, "limit": self.limit,
                "regression": self.regression, "text": self.text}


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def compare(baseline: dict, now: dict, tolerances: dict[str, float]) -> list[Finding]:
    """Every figure with a rule, judged against the baseline's. A figure the baseline had and this run
    lacks (acceptance, when the draft is gone) is a regression too."""
    out = []
    for fig, (tol_name, how) in RULES.items():
        old, new = baseline.get(fig), now.get(fig)
        tol = tolerances[tol_name]
        if how == "lost":
            if old and not new:
                out.append(Finding(fig, 1.0, 0.0, None, True, "the draft model is gone (the baseline had one)"))
            continue
        if fig == "acceptance" and (baseline.get("drafted", MIN_DRAFTED) < MIN_DRAFTED or now.get("drafted", MIN_DRAFTED) < MIN_DRAFTED):
            continue
        if how == "count":
            if new is None:
                continue
            bad = new > (old or 0) + tol
            out.append(Finding(fig, old, new, (old or 0) + tol, bad, f"{fig} {_fmt(new)} (baseline {_fmt(old)})"))
            continue
        if old is None:
            continue
        if new is None:
            out.append(Finding(fig, old, None, None, True, f"{fig} missing now (baseline {_fmt(old)})"))
            continue
        if how == "down":
            limit = old * (1 - tol)
            bad = new < limit
        elif how == "down_abs":
            limit = old - tol
            bad = new < limit
        else:
            limit = max(old * (1 + tol), old + TTFT_FLOOR_S) if tol_name == "ttft" else old * (1 + tol)
            bad = new > limit
        change = (new - old) / old if old else 0.0
        out.append(Finding(fig, old, new, limit, bad,
                           f"{fig} {_fmt(new)} vs {_fmt(old)} ({change:+.0%}; limit {_fmt(limit)})"))
    return out


# -- records ---------------------------------------------------------------------------------------

def baseline_dir(state: Path) -> Path:
    return state / "baselines"


def default_path(state: Path, preset: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in preset)
    return baseline_dir(state) / f"{safe}.json"


def make_record(status: dict, figures: dict, checks: list[dict], settings: dict | None = None) -> dict:
    return {
        "kind": "specdeck-baseline", "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "preset": status.get("model_id"), "machine": status.get("machine") or {},
        "models": status.get("models") or {}, "digests": status.get("model_digests") or {},
        "plan": status.get("plan") or {}, "settings": settings or status.get("settings") or {},
        "revision": status.get("revision"), "figures": figures, "checks": checks,
    }


def save(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecdeckError(f"no baseline at {path}", hint="record one with `specdeck validate --save-baseline`") from None
    except (OSError, ValueError) as e:
        raise SpecdeckError(f"{path}: not a readable baseline ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "specdeck-baseline" or not isinstance(data.get("figures"), dict):
        raise SpecdeckError(f"{path}: not a specdeck baseline")
    return data


def machine_key(machine: dict) -> tuple:
    return (machine.get("cpu"), machine.get("cores"), tuple(machine.get("gpus") or ()))


def check_comparable(baseline: dict, status: dict, path: Path) -> None:
    """A baseline from another preset or another machine compares nothing: one clear line."""
    if baseline.get("preset") != status.get("model_id"):
        raise SpecdeckError(f"{path} is a baseline of preset {baseline.get('preset')!r}; this server runs "
                            f"{status.get('model_id')!r}", hint="compare with that preset's baseline, or save a new one")
    old, new = machine_key(baseline.get("machine") or {}), machine_key(status.get("machine") or {})
    if old != new:
        raise SpecdeckError(f"{path} was recorded on another machine ({old[0]}, {old[1]} cores, GPUs {list(old[2]) or 'none'}); "
                            f"this one is {new[0]}, {new[1]} cores, GPUs {list(new[2]) or 'none'}",
                            hint="save a baseline on this machine with `specdeck validate --save-baseline`")
