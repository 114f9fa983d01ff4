"""Load the CUDA libraries of a toolkit installed from PyPI before llama.cpp's CUDA backend needs them.

install.sh can take the CUDA toolkit from PyPI (NVIDIA's cuda-toolkit packages, under
site-packages/nvidia/cu13/lib). A llama.cpp compiled against it needs libcudart and libcublas at
load time, and nothing puts that folder on the loader's path: loading them first, by full path and
RTLD_GLOBAL, lets the dynamic loader resolve libggml-cuda's NEEDED entries to them (as PyTorch does
for its pip-installed CUDA libraries). Where no such folder exists this does nothing.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

LIBS = ("libcudart.so", "libcublasLt.so", "libcublas.so")
_loaded: list[str] = []


def pypi_cuda_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        d = Path(base) / "cu13" / "lib"
        if d.is_dir():
            return d
    return None


def preload() -> list[str]:
    """dlopen the PyPI toolkit's CUDA runtime and cuBLAS, once; the paths loaded."""
    if _loaded:
        return list(_loaded)
    d = pypi_cuda_lib_dir()
    if d is None:
        return []
    for name in LIBS:
        found = sorted(d.glob(name + ".*"))
        if found:
            ctypes.CDLL(str(found[0]), mode=ctypes.RTLD_GLOBAL)
            _loaded.append(str(found[0]))
    return list(_loaded)
