"""The monitor's figures: the ring's memory for an hour (and the time to write a row and to read the
hour back), what the monitor page transfers, and the server's cost with no monitor page open and
with three open (Debian's Chromium through Playwright), against the same load: a streamed answer
of `--tokens` tokens, and `--idle` seconds of nothing, in ABBA order; the server process's CPU
seconds and the answer's wall time, medians with min-max.

    .venv/bin/python scripts/monitor_bench.py [--preset coder-1.5b] [--pairs 4] [--tokens 64] [--idle 20]

It starts its own `specdeck serve` on a free loopback port (run nothing else beside it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil
from ui_bench import LAUNCH, cpu, own_server, spread, straight

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.monitor.history import DRAFTER_KEYS, PER_DRAFTER, SECONDS, History, history_bytes, model_columns  # noqa: E402


def ring_figures() -> None:
    """An hour of rows with every column filled, on a CPU (no GPU) and a card (one GPU)."""
    for gpus, slots, where in ((0, 1, "CPU pair, 1 slot"), (1, 1, "a 24 GB card, 1 slot"), (1, 4, "a card, 4 slots")):
        h = History({"m": slots}, gpus)
        assert h.nbytes == history_bytes(slots, gpus)
        names = [*model_columns(slots), *(f"{f}:d{i}" for i in range(DRAFTER_KEYS) for f in PER_DRAFTER)]
        machine = {n: 1.5 for n in h.machine.names}
        row = {n: 2.5 for n in names}
        t0 = time.perf_counter()
        for i in range(SECONDS):
            h.add(1e9 + i, machine, {"m": row})
        add = (time.perf_counter() - t0) / SECONDS
        t0 = time.perf_counter()
        body = json.dumps({"columns": h.columns("m", 0)})
        read = time.perf_counter() - t0
        print(f"ring, {where}: {h.nbytes / 2**20:.2f} MiB for {SECONDS} rows x {len(h.fields('m')) + 1} columns; "
              f"a row written in {add * 1e6:.0f} us; the hour read as JSON in {read * 1e3:.0f} ms ({len(body) / 2**20:.2f} MiB)")


def page_size(url: str) -> None:
    from playwright.sync_api import sync_playwright

    seen: list = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=LAUNCH)
        page = b.new_context().new_page()
        page.on("response", lambda r: seen.append(r))
        t0 = time.perf_counter()
        page.goto(url + "/ui/monitor")
        page.wait_for_selector('[data-testid="chart-speed"]')
        ready = time.perf_counter() - t0
        page.wait_for_timeout(500)
        files = {r.url.replace(url, ""): len(r.body()) for r in seen if r.ok and "/ui/api/live" not in r.url}
        b.close()
    static = sum(v for k, v in files.items() if k.startswith(("/ui/static", "/ui/monitor")))
    print(f"monitor page: {static:,} bytes of page and libraries, {sum(files.values()):,} in all with its first "
          f"data ({len(files)} responses); charts drawn {ready:.2f} s after the request (warm server, cold browser)")


class Pages:
    """Three monitor pages open in one Chromium, each following /ui/api/live."""

    def __init__(self, url: str, n: int = 3) -> None:
        from playwright.sync_api import sync_playwright

        self.p = sync_playwright().start()
        self.b = self.p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=LAUNCH)
        self.pages = []
        for _ in range(n):
            page = self.b.new_context().new_page()
            page.goto(url + "/ui/monitor")
            page.wait_for_selector('[data-testid="chart-speed"]')
            self.pages.append(page)
        time.sleep(2)  # past the first loads: what is measured is pages that follow

    def close(self) -> None:
        self.b.close()
        self.p.stop()


def measure(proc: psutil.Process, c: httpx.Client, tokens: int, idle: float) -> tuple[float, float, float]:
    """(server CPU seconds of the answer, its wall seconds, server CPU seconds over `idle` quiet seconds)."""
    c0, t0 = cpu(proc), time.perf_counter()
    straight(c, tokens)
    wall, used = time.perf_counter() - t0, cpu(proc) - c0
    c0 = cpu(proc)
    time.sleep(idle)
    return used, wall, cpu(proc) - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="coder-1.5b")
    ap.add_argument("--pairs", type=int, default=4, help="ABBA pairs of (no page, three pages)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--idle", type=float, default=20.0, help="quiet seconds measured after each answer")
    args = ap.parse_args()
    ring_figures()
    with own_server(args.preset) as (url, proc):
        page_size(url)
        with httpx.Client(base_url=url, timeout=600) as c:
            straight(c, args.tokens)  # warm: the prompt cached alike for both
            got: dict[str, list[tuple[float, float, float]]] = {"none": [], "three": []}
            for i in range(args.pairs):
                for way in (("none", "three") if i % 2 == 0 else ("three", "none")):
                    pages = Pages(url) if way == "three" else None
                    try:
                        got[way].append(measure(proc, c, args.tokens, args.idle))
                    finally:
                        if pages is not None:
                            pages.close()
        for k, name in ((0, f"{args.tokens}-token answer, server CPU s"), (1, "its wall s"),
                        (2, f"{args.idle:.0f} quiet s, server CPU s")):
            a, b = [x[k] for x in got["none"]], [x[k] for x in got["three"]]
            ratio = [y / x for x, y in zip(a, b, strict=True) if x > 0]
            print(f"{name}: no page {spread(a)}, three pages {spread(b)}; three / none {spread(ratio, 'x') if ratio else '-'}; "
                  f"three - none {spread([y - x for x, y in zip(a, b, strict=True)])}")
        quiet = [x[2] / args.idle * 100 for x in got["none"]]
        print(f"the server at rest with no page (its sampler writing a row a second): {statistics.median(quiet):.2f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
