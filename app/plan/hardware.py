"""What this machine has: NVIDIA GPUs (pynvml, from nvidia-ml-py), host memory (psutil), and the
extra weight buffers its llama.cpp build makes (read from the build)."""

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
    temperature_c: int | None = None
    power_limit_w: float | None = None
    compute_capability: str | None = None  # "8.6"
    power_w: float | None = None  # drawn now
    temperature_slowdown_c: int | None = None  # where the card starts to throttle


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...]
    ram_total: int
    ram_available: int
    cpu_count: int
    cpu_buffers: tuple[str, ...] = ("CPU_REPACK",)  # the extra weight copies the llama.cpp build makes


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
            util = _optional(lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            temp = _optional(lambda: int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))
            power = _optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            cc = _optional(lambda: "{}.{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(h)))
            drawn = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            slowdown = _optional(lambda: int(pynvml.nvmlDeviceGetTemperatureThreshold(
                h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)))
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name, int(mem.total), int(mem.free), util,
                            temp, power, cc, drawn, slowdown))
        return tuple(gpus)
    except Exception:  # noqa: BLE001
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _optional(read):
    try:
        return read()
    except Exception:  # noqa: BLE001 - a reading this GPU or driver does not offer
        return None


@dataclass(frozen=True)
class Driver:
    version: str  # "560.35.03"
    cuda: str | None  # the newest CUDA runtime the driver supports, "12.6"


def read_driver() -> Driver | None:
    """The NVIDIA driver's version and the CUDA version it supports; None without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        cuda = _optional(lambda: pynvml.nvmlSystemGetCudaDriverVersion_v2())
        return Driver(version.decode() if isinstance(version, bytes) else str(version),
                      f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None)
    except Exception:  # noqa: BLE001
        return None
    finally:
        _optional(pynvml.nvmlShutdown)


def detect() -> Hardware:
    from app.build.info import cpu_buffers

    vm = psutil.virtual_memory()
    return Hardware(read_gpus(), int(vm.total), int(vm.available), psutil.cpu_count(logical=False) or psutil.cpu_count() or 1,
                    cpu_buffers())


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
