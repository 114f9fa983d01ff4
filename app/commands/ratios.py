"""The ratios `specdeck bench` reports: per repeat, side by side in one run, then the median with
min and max (docs/BENCHMARKS.md, Method)."""

from __future__ import annotations

import statistics


def paired(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """Median, min and max of a[i] / b[i]: runs of the same repeat, minutes apart at most."""
    pairs = [x / y for x, y in zip(a, b) if y]
    return (statistics.median(pairs), min(pairs), max(pairs)) if pairs else None


def ratios(workloads: dict, anchor_runs: dict) -> dict:
    """The goals as ratios measured in this run, each taken per repeat (side by side), then the median.
    `anchor_runs`: {anchor: {kind: [tok_s per repeat]}}."""
    runs = anchor_runs
    out = {}
    for kind, modes in workloads.items():
        all_ = lambda m, modes=modes: (modes.get(m) or {}).get("tok_s_all") or []  # noqa: E731
        anchor = lambda a, kind=kind: runs.get(a, {}).get(kind) or []  # noqa: E731
        best_draft = _best(runs, kind, lambda a: a.startswith("llama_server_draft"))
        best_ngram = _best(runs, kind, lambda a: a.startswith("llama_server_ngram") or a == "llama_server_lookup")
        best_mode = max((m for m in ("draft", "lookup", "suffix") if all_(m)),
                        key=lambda m: statistics.median(all_(m)), default=None)
        r = {"best_llama_server_draft": best_draft, "best_llama_server_ngram": best_ngram, "best_single_mode": best_mode}
        for key, a, b in (("adaptive_vs_plain", all_("adaptive"), all_("plain")),
                          ("draft_vs_plain", all_("draft"), all_("plain")),
                          ("plain_vs_llama_server_plain", all_("plain"), anchor("llama_server_plain")),
                          ("adaptive_vs_llama_server_draft", all_("adaptive"), anchor("llama_server_draft")),
                          ("adaptive_vs_llama_server_lookup", all_("adaptive"), anchor("llama_server_lookup")),
                          ("adaptive_vs_best_llama_server_draft", all_("adaptive"), anchor(best_draft) if best_draft else []),
                          ("adaptive_vs_best_llama_server_ngram", all_("adaptive"), anchor(best_ngram) if best_ngram else []),
                          ("adaptive_vs_best_single_mode", all_("adaptive"), all_(best_mode) if best_mode else [])):
            got = paired(a, b)
            if got:
                r[key], r[key + "_min"], r[key + "_max"] = got
        out[kind] = r
    return out


def _best(runs: dict, kind: str, which) -> str | None:
    """The anchor of this kind (by `which`) with the highest median tok/s on the workload."""
    have = [a for a in runs if which(a) and runs[a].get(kind)]
    return max(have, key=lambda a: statistics.median(runs[a][kind]), default=None)


def workload_per_decode(per_decode: dict) -> dict:
    """Tokens per target decode of the turns together (their tokens over their decodes), per mode:
    the median of the repeats, and each repeat's."""
    return {m: {**{p: statistics.median(v) for p, v in parts.items()}, "runs": parts} for m, parts in per_decode.items()}


def agent_ratios(totals: dict) -> dict:
    """Workload tokens/s (all turns; the cross-request turns) per mode, and the goals' ratios paired by repeat."""
    ngram = [a for a in totals if a.startswith("llama_server_ngram") or a == "llama_server_lookup"]
    out: dict = {"tok_s": {m: {p: statistics.median(v) for p, v in parts.items()} for m, parts in totals.items()}}
    if ngram:
        best = max(ngram, key=lambda a: statistics.median(totals[a]["all"]))
        out["best_ngram_anchor"] = best
    for key, a, b, part in (("adaptive_vs_plain_cross", "adaptive", "plain", "cross"),
                            ("adaptive_vs_adaptive_local_cross", "adaptive", "adaptive-local", "cross"),
                            ("adaptive_vs_plain_all", "adaptive", "plain", "all"),
                            ("adaptive_vs_best_ngram_all", "adaptive", out.get("best_ngram_anchor"), "all")):
        got = paired((totals.get(a) or {}).get(part, []), (totals.get(b) or {}).get(part, [])) if b else None
        if got:
            out[key], out[key + "_min"], out[key + "_max"] = got
    return out
