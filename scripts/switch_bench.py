#!/usr/bin/env python3
"""The time to switch models: one server, two models whose budget holds one at a time, requests
to each in turn. A switch is the whole wait a client sees: the other model unloaded, this one
loaded (weights, contexts, speculation costs calibrated), its prompt read and its first token
streamed. Beside it, the same request's time to first token with its model already loaded.

    python scripts/switch_bench.py [--rounds 5] [--json]

Models (real weights, from the model store; `specdeck pull coder-1.5b gemma3-270m-q4_k_m`):
`coder` the Qwen2.5-Coder 1.5B + 0.5B pair, `gemma` Gemma 3 270M; each planned at context 4,096,
one slot. The server is `specdeck serve --model coder=... --model gemma=... --models-max 1`, in a
process of its own. Each round: coder (a switch), coder again (loaded), gemma (a switch), gemma
again (loaded). Median with min-max over the rounds. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import local_path, make_fetcher  # noqa: E402
from app.models.catalog import load_catalog  # noqa: E402
from app.models.refs import ModelRef  # noqa: E402


def model_file(name: str) -> Path:
    return local_path(make_fetcher(offline=True), ModelRef(spec=load_catalog().model(name)))


def first_token(url: str, model: str) -> float:
    """Seconds from the request to its first streamed token."""
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", timeout=600, json={
            "model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "prompt": "def binary_search(items, target):"}) as r:  # Gemma 3 270M has no chat template
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t0
    raise RuntimeError(f"{model}: no token came")


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    target, draft = model_file("qwen2.5-coder-1.5b-q4_k_m"), model_file("qwen2.5-coder-0.5b-q4_k_m")
    gemma = model_file("gemma3-270m-q4_k_m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.toml"
        cfg.write_text(f'[models.coder]\ndraft = "{draft}"\n')
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--model", f"coder={target}",
                                 "--model", f"gemma={gemma}", "--models-max", "1", "--config", str(cfg), "--ctx", "4096",
                                 "--parallel", "1", "--port", str(port)], cwd=ROOT, env={**os.environ},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
                time.sleep(0.5)
            first_token(url, "coder")  # warm: the start loaded coder; its first answer is not timed
            times: dict[str, list[float]] = {k: [] for k in ("coder switch", "coder loaded", "gemma switch", "gemma loaded")}
            for _ in range(args.rounds):
                for model in ("gemma", "coder"):
                    times[f"{model} switch"].append(first_token(url, model))
                    times[f"{model} loaded"].append(first_token(url, model))
        finally:
            proc.terminate()
            proc.wait(60)
    result = {k: summary(v) for k, v in times.items()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'first token':<16} {'median s':>9} {'min-max s':>15}")
    for k, v in result.items():
        print(f"{k:<16} {v['median']:9.2f} {v['min']:7.2f}-{v['max']:<7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
