"""Process-wide set-up of libllama: backend initialisation once, and its log routed to Python logging.

Everything that touches llama.cpp goes through here first, so no module prints llama.cpp's log
lines to the user's terminal unless asked (SPECDECK_LLAMA_LOG=1).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import llama_cpp

from app.build.isa import read_cpu

log = logging.getLogger("specdeck.llama")
_lock = threading.Lock()
_ready = False
_captures: list[list[str]] = []


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    for sink in _captures:
        sink.append(line)
    if os.environ.get("SPECDECK_LLAMA_LOG") == "1":
        log.warning(line.rstrip())


@contextmanager
def capture_llama_log() -> Iterator[list[str]]:
    """Collect what llama.cpp logs inside the block (its buffer sizes, for example)."""
    init_llama()
    sink: list[str] = []
    _captures.append(sink)
    try:
        yield sink
    finally:
        _captures.remove(sink)


def init_llama() -> None:
    """Initialise the llama.cpp backend once per process, with its log silenced."""
    global _ready
    with _lock:
        if _ready:
            return
        llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
        from llama_cpp import mtmd_cpp  # the vision projectors' library logs on its own

        mtmd_cpp.mtmd_log_set(_on_log, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _ready = True


@functools.cache
def library_identity() -> str:
    """Which libllama this process runs, on which CPU: its version, its library files (size and time:
    a rebuild, with other compiled features, is other files), and the processor's model name, flags
    and core count. Figures measured with one library on one machine hold for that pair."""
    cpu = read_cpu()
    lib = Path(llama_cpp.__file__).parent / "lib"
    files = sorted(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in lib.glob("lib*.so")
                   if not f.is_symlink()) if lib.is_dir() else []
    return " | ".join([llama_cpp.__version__, *files, cpu.machine, cpu.model, " ".join(sorted(cpu.flags)),
                       str(os.cpu_count())])
