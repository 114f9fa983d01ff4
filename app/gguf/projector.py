"""A vision projector's header (`mmproj-*.gguf`, architecture `clip`), read with `gguf`: what it is
(projector type, output width), what it costs (weights, the compute buffer libmtmd reserves) and
what an image costs in context. Nothing is loaded."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from app.errors import GGUFError
from app.gguf.header import read_header

# tokens an image takes are the patches merged k x k: Qwen2/3-VL's spatial merge, Gemma 3's pooling
MERGE_BY_TYPE = {"gemma3": 4, "qwen2vl_merger": 2, "qwen2.5vl_merger": 2, "qwen3vl_merger": 2}
# libmtmd's compute buffer for an image at the projector's size, as an upper bound: per patch (+1, a
# class token) 4 bytes x the larger of the projection's live rows (2 x output + 3 x encoder width)
# and an encoder block's (5 x width + feed-forward width). Against what libmtmd reserved for LLaVA-style
# stand-ins (65-257 patches, widths 64-256, outputs 64-1536): 1.02-1.42 x, most within 1.2 x
# (tests/test_vision.py measures it).

@dataclass(frozen=True)
class ProjectorInfo:
    path: Path
    projector_type: str
    has_vision: bool
    n_embd_out: int  # the width of its rows: the target's embedding width
    width: int  # the encoder's
    n_ff: int
    n_layer: int
    image_size: int
    patch_size: int
    merge: int
    weights_bytes: int
    max_pixels: int | None = None  # a dynamic-resolution projector's largest image (clip.vision.image_max_pixels)

    @property
    def patches(self) -> int:
        """Patches of an image at the projector's own size."""
        return (self.image_size // max(1, self.patch_size)) ** 2

    @property
    def tokens_per_image(self) -> int:
        """Context tokens an image at the projector's size takes."""
        return max(1, self.patches // (self.merge * self.merge))

    def tokens_for(self, pixels: int) -> int:
        """Tokens of an image of that many pixels, where the projector keeps its resolution (else its size's)."""
        if self.max_pixels is None:
            return self.tokens_per_image
        side = self.patch_size * self.merge
        return max(1, min(pixels, self.max_pixels) // (side * side))

    @property
    def compute_bytes(self) -> int:
        """The compute buffer libmtmd reserves for one image at the projector's size."""
        per_patch = max(2 * self.n_embd_out + 3 * self.width, 5 * self.width + self.n_ff)
        return (self.patches + 1) * 4 * per_patch

    def largest_image(self, room: int) -> int:
        """The side, in pixels, of the largest square image whose tokens fit `room` context tokens (the
        projector's own size where it resizes every image to it)."""
        if self.max_pixels is None:
            return self.image_size if room >= self.tokens_per_image else 0
        side = self.patch_size * self.merge
        fit = min(room * side * side, self.max_pixels)
        return int(math.isqrt(fit) // side * side)


def read_projector(path: str | os.PathLike[str]) -> ProjectorInfo:
    """Read a projector's header; GGUFError when it is not one."""
    path = Path(path)
    header = read_header(path)
    meta = header.metadata
    if meta.get("general.architecture") != "clip":
        raise GGUFError(f"{path.name}: not a vision projector (architecture {meta.get('general.architecture')!r}, not clip)")
    need = header.data_offset + max((t.offset + t.n_bytes for t in header.tensors), default=0)
    if need > path.stat().st_size:
        raise GGUFError(f"{path.name}: truncated: its tensors need {need:,} bytes, the file has {path.stat().st_size:,}")
    kind = str(meta.get("clip.vision.projector_type") or meta.get("clip.projector_type") or "")
    v = lambda k, d=0: meta.get(f"clip.vision.{k}", d)  # noqa: E731
    out = int(v("projection_dim", 0)) or _out_width(header)
    if not out:
        raise GGUFError(f"{path.name}: the projector states no output width (clip.vision.projection_dim)")
    merge = int(v("spatial_merge_size", 0) or v("projector.scale_factor", 0) or MERGE_BY_TYPE.get(kind, 1))
    return ProjectorInfo(
        path=path, projector_type=kind, has_vision=bool(meta.get("clip.has_vision_encoder", False)),
        n_embd_out=out, width=int(v("embedding_length")), n_ff=int(v("feed_forward_length")), n_layer=int(v("block_count")),
        image_size=int(v("image_size")), patch_size=int(v("patch_size", 1)), merge=merge,
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        max_pixels=int(v("image_max_pixels")) if v("image_max_pixels", None) else None)


def _out_width(header) -> int:
    """The last projection matrix's output width (for a file without projection_dim)."""
    mm = [t for t in header.tensors if t.name.startswith("mm.") and t.name.endswith(".weight") and len(t.shape) == 2]
    return int(mm[-1].shape[1]) if mm else 0


def fits(projector: ProjectorInfo, n_embd: int) -> str | None:
    """Why the projector cannot serve a target of embedding width `n_embd` (None: it can)."""
    if not projector.has_vision:
        return f"{projector.path.name} has no vision encoder"
    if projector.n_embd_out != n_embd:
        return (f"{projector.path.name} gives rows of width {projector.n_embd_out}; the target's embedding width is "
                f"{n_embd}: a projector made for another model")
    return None
