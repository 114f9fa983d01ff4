#!/usr/bin/env python3
"""A soak run: `specdeck serve` under steady traffic for a long time (127.0.0.1 only), its memory
sampled every few seconds.

    python scripts/soak.py [--preset coder-1.5b] [--minutes 20] [--clients 2] [--interval 5] [--json]

Traffic: --clients clients loop over a mix of short and long, streamed and plain, greedy and sampled
requests, with some streams cut early (the disconnect path) until the time is up. Samples: the
server's RSS (psutil) and, where a GPU is present, the GPU memory in use (NVML), every --interval
seconds. Passes with zero errors (429s from the queue limit are counted, not errors), the server
never restarted (same pid throughout, /health ok at the end) and no upward memory trend: the
least-squares slope of RSS over the second half of the run, extrapolated over an hour, stays under
--bound-mib (default 64 MiB), and likewise for VRAM. The first half is warm-up (caches, allocator).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load import PROMPTS, start_server

from app.plan.hardware import read_gpus


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes), in bytes per hour."""
    if len(points) < 3:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 3600


def client(url: str, seed: int, stop: threading.Event, counts: dict, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        prompt = rng.choice(PROMPTS) + ("    " * rng.randrange(3))
        body = {"prompt": prompt, "max_tokens": rng.choice([8, 32, 96]), "temperature": rng.choice([0, 0, 0.7]),
                "seed": rng.randrange(1000)}
        kind = rng.random()
        try:
            if kind < 0.2:  # a stream the client abandons part-way
                with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=600) as r:
                    for i, _ in enumerate(r.iter_lines()):
                        if i >= rng.randrange(1, 10):
                            break
                key = "cut"
            else:
                r = httpx.post(url + "/v1/completions", json={**body, "stream": kind < 0.5}, timeout=600)
                key = "ok" if r.status_code == 200 else "rejected" if r.status_code == 429 else "error"
                if key == "error":
                    with lock:
                        counts.setdefault("error_samples", []).append(f"{r.status_code} {r.text[:200]}")
                if key == "rejected":
                    time.sleep(1)
        except httpx.HTTPError as e:
            key = "error"
            with lock:
                counts.setdefault("error_samples", []).append(repr(e))
        with lock:
            counts[key] = counts.get(key, 0) + 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--bound-mib", type=float, default=64.0, help="largest memory growth per hour allowed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"specdeck-soak-{os.getpid()}.log"
    proc, url = start_server(args.preset, 4, log)
    server = psutil.Process(proc.pid)
    stop, lock, counts = threading.Event(), threading.Lock(), {}
    threads = [threading.Thread(target=client, args=(url, i, stop, counts, lock), daemon=True) for i in range(args.clients)]
    samples: list[dict] = []
    t0 = time.time()
    try:
        for t in threads:
            t.start()
        while time.time() - t0 < args.minutes * 60:
            gpus = read_gpus()
            samples.append({"t": round(time.time() - t0, 1), "rss": server.memory_info().rss,
                            "vram": (gpus[0].total - gpus[0].free) if gpus else None, "pid": proc.pid,
                            "alive": proc.poll() is None})
            if proc.poll() is not None:
                break
            time.sleep(args.interval)
        stop.set()
        for t in threads:
            t.join(600)
        healthy = httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}
    finally:
        stop.set()
        proc.terminate()
        rc = proc.wait(60)
    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2]
    rss_slope = slope_per_hour([(s["t"], s["rss"]) for s in half])
    vram = [(s["t"], s["vram"]) for s in half if s["vram"] is not None]
    vram_slope = slope_per_hour(vram) if vram else None
    bound = args.bound_mib * 2**20
    errors = counts.get("error", 0)
    summary = {
        "preset": args.preset, "minutes": round((samples[-1]["t"] if samples else 0) / 60, 1), "clients": args.clients,
        "requests": {k: v for k, v in counts.items() if k != "error_samples"}, "errors": errors,
        "error_samples": counts.get("error_samples", [])[:5], "samples": len(samples),
        "rss_mib": {"first": round(samples[0]["rss"] / 2**20, 1), "min": round(min(s["rss"] for s in samples) / 2**20, 1),
                    "max": round(max(s["rss"] for s in samples) / 2**20, 1), "last": round(samples[-1]["rss"] / 2**20, 1)},
        "rss_trend_mib_per_hour": round(rss_slope / 2**20, 1),
        "vram_trend_mib_per_hour": round(vram_slope / 2**20, 1) if vram_slope is not None else None,
        "bound_mib_per_hour": args.bound_mib, "restarted": any(not s["alive"] for s in samples), "healthy_after": healthy,
        "server_exit": rc, "log": str(log),
    }
    ok = (errors == 0 and not summary["restarted"] and healthy and rss_slope <= bound
          and (vram_slope is None or vram_slope <= bound))
    summary["ok"] = ok
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"specdeck-soak-{os.getpid()}.json"
    out.write_text(json.dumps({**summary, "series": samples}))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['minutes']} min, {args.clients} clients: requests {summary['requests']}, errors {errors}; "
              f"RSS {summary['rss_mib']} MiB, trend {summary['rss_trend_mib_per_hour']} MiB/h (bound {args.bound_mib}); "
              f"VRAM trend {summary['vram_trend_mib_per_hour']}; restarted {summary['restarted']}; ok: {ok}; series in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
