"""Vision projector stand-ins (`mmproj-*.gguf`, architecture `clip`), written with `gguf`: a small
LLaVA-style one with random F32 weights that libmtmd loads and runs, and header-only stand-ins of the
27B presets' projectors for the plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T


def _nbytes(dims: tuple[int, ...], t: T) -> int:
    block, size = GGML_QUANT_SIZES[t]
    return int(np.prod(dims)) // block * size


@dataclass(frozen=True)
class ProjectorShape:
    """A LLaVA-style vision projector (a ViT, then an MLP `mm.0` / GELU / `mm.2`) at a small size:
    libmtmd loads it as it loads a real one. `n_embd`: its output width, the target's embedding width."""

    n_embd: int
    width: int = 64  # the ViT's embedding width
    n_ff: int = 128
    n_layer: int = 2
    n_head: int = 4
    image_size: int = 32  # images are resized to image_size x image_size
    patch_size: int = 8  # so (32 / 8)^2 = 16 tokens an image

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def mmproj_tensors(s: ProjectorShape) -> list[tuple[str, tuple[int, ...]]]:
    """The projector's tensors and their numpy shapes (all F32)."""
    e, f = s.width, s.n_ff
    out = [("v.patch_embd.weight", (e, 3, s.patch_size, s.patch_size)), ("v.patch_embd.bias", (e,)),
           ("v.class_embd", (e,)), ("v.position_embd.weight", (s.n_patches + 1, e))]
    for i in range(s.n_layer):
        p = f"v.blk.{i}."
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(p + m + ".weight", (e, e)), (p + m + ".bias", (e,))]
        out += [(p + "ln1.weight", (e,)), (p + "ln1.bias", (e,)), (p + "ln2.weight", (e,)), (p + "ln2.bias", (e,)),
                (p + "ffn_up.weight", (f, e)), (p + "ffn_up.bias", (f,)),
                (p + "ffn_down.weight", (e, f)), (p + "ffn_down.bias", (e,))]
    return out + [("mm.0.weight", (s.n_embd, e)), ("mm.0.bias", (s.n_embd,)),
                  ("mm.2.weight", (s.n_embd, s.n_embd)), ("mm.2.bias", (s.n_embd,))]


def _mmproj_metadata(w: GGUFWriter, s: ProjectorShape, kind: str, merge: int) -> None:
    w.add_name("specdeck projector stand-in")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", kind)
    w.add_bool("clip.use_gelu", True)
    v = "clip.vision."
    for key, value in (("embedding_length", s.width), ("feed_forward_length", s.n_ff), ("block_count", s.n_layer),
                       ("projection_dim", s.n_embd), ("attention.head_count", s.n_head),
                       ("image_size", s.image_size), ("patch_size", s.patch_size)):
        w.add_uint32(v + key, value)
    if merge > 1:
        w.add_uint32(v + "spatial_merge_size", merge)
    w.add_float32(v + "attention.layer_norm_epsilon", 1e-6)
    w.add_array(v + "image_mean", [0.5, 0.5, 0.5])
    w.add_array(v + "image_std", [0.5, 0.5, 0.5])


def write_mmproj(path: Path, n_embd: int, seed: int = 0, **shape) -> Path:
    """A vision projector stand-in whose output rows fit a target of embedding width `n_embd` (random
    F32 weights: different images give different rows, the same image the same)."""
    s = ProjectorShape(n_embd, **shape)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    _mmproj_metadata(w, s, "mlp", 1)
    for name, dims in mmproj_tensors(s):
        if name.endswith(("ln1.weight", "ln2.weight")):
            data = np.ones(dims, np.float32)
        elif name.endswith(".bias"):
            data = np.zeros(dims, np.float32)
        else:  # float64 would be written as F64, which llama.cpp's matmuls do not take
            data = (rng.standard_normal(dims) / np.sqrt(dims[-1] if len(dims) > 1 else 50.0)).astype(np.float32)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# The 27B presets' projectors as their published configurations state them (header and tensor table
# only, F16 matrices, a hole for the data): for the plan. Both are SigLIP-So400m-shaped encoders;
# Gemma 3's pools 64x64 patches to 256 tokens, Qwen3.6's merges 2x2 patches.
PROJECTOR_SHAPES = {
    "gemma3-27b": (ProjectorShape(5376, width=1152, n_ff=4304, n_layer=27, n_head=16, image_size=896, patch_size=14),
                   "gemma3", 4),
    "qwen3.6-27b": (ProjectorShape(5120, width=1152, n_ff=4304, n_layer=27, n_head=16, image_size=768, patch_size=16),
                    "qwen3vl_merger", 2),
}


def write_mmproj_header(path: Path, preset: str) -> Path:
    """A header stand-in of a 27B preset's projector (PROJECTOR_SHAPES), its data a hole."""
    s, kind, merge = PROJECTOR_SHAPES[preset]
    w = GGUFWriter(str(path), "clip")
    _mmproj_metadata(w, s, kind, merge)
    for name, dims in mmproj_tensors(s):
        t = T.F16 if len(dims) > 1 else T.F32
        w.add_tensor_info(name, dims, np.dtype(np.float32), _nbytes(dims, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    from app.gguf.header import read_header

    h = read_header(path)
    with open(path, "r+b") as f:
        f.truncate(h.data_offset + max(t.offset + t.n_bytes for t in h.tensors))
    return path
