"""What this machine has: NVIDIA GPUs (pynvml, from nvidia-ml-py) and host memory (psutil)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

GIB = 1024**3
GPU_24GB_MIN_TOTAL = 22 * GIB  # a "24 GB" card reports ~23.6-24 GiB total


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total: int
    free: int
    utilization: int | None  # percent


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...]
    ram_total: int
    ram_available: int
    cpu_count: int


def read_gpus() -> tuple[Gpu, ...]:
    """Every NVIDIA GPU the driver reports; none where there is no driver or no NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no device: no GPU
        return ()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            try:
                util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # noqa: BLE001
                util = None
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name, int(mem.total), int(mem.free), util))
        return tuple(gpus)
    except Exception:  # noqa: BLE001
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def detect() -> Hardware:
    vm = psutil.virtual_memory()
    return Hardware(read_gpus(), int(vm.total), int(vm.available), psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


def default_preset_reason(hw: Hardware) -> tuple[bool, str]:
    """(use the GPU preset?, why) for this machine."""
    big = [g for g in hw.gpus if g.total >= GPU_24GB_MIN_TOTAL]
    if big:
        g = big[0]
        return True, f"GPU {g.index} {g.name} has {g.total / GIB:.1f} GiB"
    if hw.gpus:
        g = max(hw.gpus, key=lambda x: x.total)
        return False, f"largest GPU ({g.name}) has {g.total / GIB:.1f} GiB, under the 24 GB class"
    return False, "no NVIDIA GPU found"
