"""libllama's own `llama_model_quantize`: a model rewritten at another tensor type."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from app.errors import SpecdeckError
from app.llama.backend import init_llama


def requantize_f32(src: Path, dst: Path, threads: int) -> None:
    """Every tensor of `src` written to `dst` as F32 (allow_requantize: quantized weights are
    dequantized, so the values are the source's exactly; only their width changes)."""
    init_llama()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = max(1, threads)
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.pure = True  # every tensor at the one type: no per-tensor mix
    params.quantize_output_tensor = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SpecdeckError(f"{src.name}: llama.cpp could not rewrite it as F32 (llama_model_quantize returned {rc})")
