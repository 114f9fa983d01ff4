"""One second's figures from the server's status snapshot (the dict /v1/status answers): the model's
(`model_point`) and the machine's (`machine_point`). Rates are the snapshot's running counts
(`counts`) differenced against the previous tick's: the per-second figures are made here and
nowhere else; every other figure is read as the snapshot has it."""

from __future__ import annotations

RATES = {  # figure -> the running count it is the rate of
    "generated_tokens_per_second": "generated",
    "prompt_tokens_per_second": "prompt_evaluated",
    "drafted_tokens_per_second": "drafted",
    "accepted_tokens_per_second": "accepted",
}


def rates(counts: dict, prev: dict | None, dt: float) -> dict[str, float | None]:
    """Per-second rates of the running counts since the previous tick (None on the first tick, or
    when a count went backwards: the model was reloaded); tokens per target decode over the tick."""
    if prev is None or dt <= 0 or any(counts[c] < prev[c] for c in RATES.values()):
        return {**dict.fromkeys(RATES), "tokens_per_decode": None}
    out: dict[str, float | None] = {f: (counts[c] - prev[c]) / dt for f, c in RATES.items()}
    decodes = counts["decodes"] - prev["decodes"]
    out["tokens_per_decode"] = (counts["generated"] - prev["generated"]) / decodes if decodes > 0 else None
    return out


def model_point(status: dict, prev_counts: dict | None, dt: float) -> dict[str, float | None]:
    """A loaded model's figures this tick."""
    plan = status.get("plan") or {}
    kv = status.get("kv_cache") or {}
    out: dict[str, float | None] = {
        "loaded": 1.0,
        **rates(status["counts"], prev_counts, dt),
        "ttft_p50_seconds": status.get("ttft_s_p50"),
        "ttft_p95_seconds": status.get("ttft_s_p95"),
        "tbt_p50_seconds": status.get("tbt_s_p50"),
        "tbt_p95_seconds": status.get("tbt_s_p95"),
        "acceptance_rate": status.get("recent_acceptance"),
        "requests_running": status.get("busy_slots"),
        "requests_waiting": status.get("queue"),
        "slots": status.get("slots_total"),
        "queue_limit": status.get("queue_limit"),
        "context_limit_tokens": plan.get("ctx"),
        "kv_cache_usage_ratio": kv["used_cells"] / kv["cells"] if kv.get("cells") else None,
        "vram_planned_bytes": plan.get("used") if plan.get("device") == "cuda" else None,
    }
    for s in status.get("slots", []):
        out[f"context_tokens:{s['id']}"] = s.get("cached_tokens")
    for key, d in (status.get("drafters") or {}).items():
        out[f"acceptance_rate:{key}"] = d.get("acceptance")
        out[f"mean_accepted_length:{key}"] = d.get("mean_accepted_length")
    return out


def machine_point(machine: dict) -> dict[str, float | None]:
    """The host's and each GPU's figures, from the snapshot's `host` and `gpu`."""
    host = machine.get("host") or {}
    out: dict[str, float | None] = {
        "host_memory_used_bytes": host["total"] - host["available"] if host.get("total") else None,
        "host_memory_total_bytes": host.get("total"),
        "process_rss_bytes": host.get("rss"),
        "host_cpu_percent": host.get("cpu_percent"),
    }
    for i, g in enumerate(machine.get("gpu") or []):
        util = g.get("utilization")
        out |= {f"gpu_memory_used_bytes:{i}": g["total"] - g["free"] if g.get("total") else None,
                f"gpu_memory_total_bytes:{i}": g.get("total"),
                f"gpu_temperature_celsius:{i}": g.get("temperature_c"),
                f"gpu_temperature_slowdown_celsius:{i}": g.get("temperature_slowdown_c"),
                f"gpu_power_watts:{i}": g.get("power_w"),
                f"gpu_power_limit_watts:{i}": g.get("power_limit_w"),
                f"gpu_utilization_ratio:{i}": None if util is None else util / 100}
    return out
