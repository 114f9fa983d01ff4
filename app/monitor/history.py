"""The last hour of the monitor's figures, one row a second, in a fixed-size ring in memory.

One ring for the whole server: a row is one tick (`t`, unix seconds), the machine's figures (host,
each GPU) and every model's. Each block of columns is allocated whole at the start (a model's
drafter columns are named when a drafter first drafts, up to `DRAFTER_KEYS`), so the ring's size
is known before the first row (`history_bytes`, the plan's "monitor history" row) and never grows.
A missing value (a model not loaded, a figure with nothing to measure) is NaN, JSON null.

Written by hand: a ring of float columns is a few lines of numpy, and no library we ship keeps
one with the named, late-named columns and the `since` reads the page needs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

import numpy as np

SECONDS = 3600  # an hour at one row a second
DRAFTER_KEYS = 8  # drafters (and an MTP head's depth bands) a model's block has room for
PER_DRAFTER = ("acceptance_rate", "mean_accepted_length")  # figures of each drafter: "acceptance_rate:mtp@4k"


class Full(Exception):
    """A block has no free column left for a new name."""


class Block:
    """Columns of one source (the machine, or one model): fixed names, plus names taken on first
    use up to `spare` more."""

    def __init__(self, fixed: Sequence[str], spare: int, rows: int) -> None:
        self.names: list[str] = list(fixed)
        self.capacity = len(fixed) + spare
        self.data = np.full((rows, self.capacity), np.nan)
        self.index = {n: i for i, n in enumerate(self.names)}

    def column(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            if len(self.names) >= self.capacity:
                raise Full(name)
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i

    def write(self, row: int, values: dict[str, float | None]) -> None:
        self.data[row, :] = np.nan
        for name, v in values.items():
            if v is None:
                continue
            try:
                self.data[row, self.column(name)] = v
            except Full:
                continue  # more drafters than DRAFTER_KEYS: the extra ones are not kept


def model_columns(slots: int) -> list[str]:
    """A model's fixed columns (its drafters' come on first use)."""
    return [*MODEL_FIGURES, *(f"context_tokens:{i}" for i in range(slots))]


def machine_columns(gpus: int) -> list[str]:
    return [*HOST_FIGURES, *(f"{name}:{i}" for i in range(gpus) for name in GPU_FIGURES)]


def history_bytes(slots: int, gpus: int, seconds: int = SECONDS) -> int:
    """The ring's memory for one model beside the machine's columns (the plan's host row)."""
    cols = 1 + len(machine_columns(gpus)) + len(model_columns(slots)) + DRAFTER_KEYS * len(PER_DRAFTER)
    return cols * seconds * 8


# name -> unit; the page shows each with its unit, /ui/api/series lists them
MODEL_FIGURES = {
    "loaded": "0/1",
    "generated_tokens_per_second": "tokens/s",
    "prompt_tokens_per_second": "tokens/s",
    "ttft_p50_seconds": "s",
    "ttft_p95_seconds": "s",
    "tbt_p50_seconds": "s",
    "tbt_p95_seconds": "s",
    "acceptance_rate": "0-1",
    "tokens_per_decode": "tokens",
    "drafted_tokens_per_second": "tokens/s",
    "accepted_tokens_per_second": "tokens/s",
    "requests_running": "requests",
    "requests_waiting": "requests",
    "slots": "requests",
    "queue_limit": "requests",
    "context_limit_tokens": "tokens",
    "kv_cache_usage_ratio": "0-1",
    "vram_planned_bytes": "bytes",
}
HOST_FIGURES = {
    "host_memory_used_bytes": "bytes",
    "host_memory_total_bytes": "bytes",
    "process_rss_bytes": "bytes",
    "host_cpu_percent": "%",
}
GPU_FIGURES = {
    "gpu_memory_used_bytes": "bytes",
    "gpu_memory_total_bytes": "bytes",
    "gpu_temperature_celsius": "°C",
    "gpu_temperature_slowdown_celsius": "°C",
    "gpu_power_watts": "W",
    "gpu_power_limit_watts": "W",
    "gpu_utilization_ratio": "0-1",
}


NAMED_FIGURES = {"mean_accepted_length": "tokens", "context_tokens": "tokens"}  # only as "NAME:drafter" or ":slot"


def unit_of(name: str) -> str:
    """A column's unit, by its figure (the part before ":")."""
    base = name.split(":", 1)[0]
    return {**MODEL_FIGURES, **HOST_FIGURES, **GPU_FIGURES, **NAMED_FIGURES}.get(base, "")


class History:
    """The ring. `add` (the sampler, once a second) and the reads take one lock."""

    def __init__(self, models: dict[str, int], gpus: int, seconds: int = SECONDS) -> None:
        """`models`: each model's name and its slots; `gpus`: the GPUs NVML saw at the start."""
        self.rows, self.gpus = seconds, gpus
        self.t = np.full(seconds, np.nan)
        self.machine = Block(machine_columns(gpus), 0, seconds)
        self.models = {name: Block(model_columns(slots), DRAFTER_KEYS * len(PER_DRAFTER), seconds)
                       for name, slots in models.items()}
        self.count = 0  # rows written so far (the next row is count % rows)
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.t.nbytes + self.machine.data.nbytes + sum(b.data.nbytes for b in self.models.values())

    def add(self, t: float, machine: dict[str, float | None], models: dict[str, dict[str, float | None]]) -> None:
        with self.lock:
            row = self.count % self.rows
            self.t[row] = round(t, 3)  # as the JSON says it: a reader's `since` is one of these
            self.machine.write(row, machine)
            for name, block in self.models.items():
                block.write(row, models.get(name, {}))
            self.count += 1

    def last_t(self) -> float | None:
        with self.lock:
            return None if self.count == 0 else float(self.t[(self.count - 1) % self.rows])

    def fields(self, model: str) -> list[str]:
        with self.lock:
            return [*self.machine.names, *self.models[model].names]

    def columns(self, model: str, after: float, fields: Iterable[str] | None = None) -> dict[str, list]:
        """The rows with t > `after`, oldest first, as JSON columns (NaN as None)."""
        with self.lock:
            n = min(self.count, self.rows)
            order = (np.arange(self.count - n, self.count) % self.rows) if n else np.arange(0)
            ts = self.t[order]
            keep = order[ts > after]
            block = self.models[model]
            wanted = list(fields) if fields is not None else [*self.machine.names, *block.names]
            out: dict[str, list] = {"t": self.t[keep].tolist()}
            for name in wanted:
                if name in self.machine.index:
                    col = self.machine.data[keep, self.machine.index[name]]
                elif name in block.index:
                    col = block.data[keep, block.index[name]]
                else:
                    continue
                out[name] = [None if math.isnan(x) else x for x in col.tolist()]
            return out
