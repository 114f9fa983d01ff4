"""GGUF files with the metadata and tensor shapes of real models, for planning and benchmarks.

The 27B presets' files cannot be fetched here, so tests and the GPU script write stand-ins: the
header of the real architecture (the keys llama.cpp reads, the tensor table llama.cpp's loader
expects for `qwen35` and `gemma3`), followed by a hole up to the size the tensors need (a sparse
file: it costs no disk). Values not read from the real files are listed in ASSUMED.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, TokenType
from gguf import GGMLQuantizationType as T

from app.gguf.synthetic_projector import PROJECTOR_SHAPES as PROJECTOR_SHAPES  # the projector stand-ins, re-exported
from app.gguf.synthetic_projector import ProjectorShape as ProjectorShape
from app.gguf.synthetic_projector import write_mmproj as write_mmproj
from app.gguf.synthetic_projector import write_mmproj_header as write_mmproj_header

ASSUMED = {
    "qwen3.6-27b": [
        "per-tensor quantization types: Q4_K for 2-D weights, Q6_K for output.weight and for "
        "ffn_down/attn_v in llama.cpp's use_more_bits layers, F32 for norms and small SSM tensors",
        "ssm.time_step_rank 48 and group_count 16 from the published header; rope sections not used here",
        "vocabulary texts are placeholders (same for target and draft); eos 248046, bos 248044, add_bos false",
    ],
    "qwen3.5-0.8b": [
        "tied embeddings (no output.weight); time_step_rank 16 (inner 2048 / state 128) [derived]",
        "per-tensor types as for the 27B file",
    ],
    "gemma3-27b": [
        "token_embd F16 and no output.weight (tied), linear weights Q4_0, norms F32 (published layout)",
        "vocabulary texts are placeholders; eos 106",
    ],
    "gemma3-270m": ["token_embd Q8_0 [assumed], linear weights Q4_0, tied output"],
    "qwen3.6-27b-mtp": [
        "as qwen3.6-27b, plus one nextn block (block 64: a full-attention decoder block with "
        "nextn.eh_proj, enorm, hnorm, shared_head_norm; embed_tokens and the head shared with the trunk)",
        "the nextn block's weights Q4_K, eh_proj Q6_K, norms F32 [assumed]; the published file is "
        "289,528,736 bytes larger than the file without it",
    ],
}


@dataclass(frozen=True)
class Shape:
    """An architecture's dimensions, as the GGUF keys state them."""

    name: str
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    context_length: int
    tied: bool
    sliding_window: int = 0
    full_attention_interval: int = 0
    ssm_conv: int = 0
    ssm_state: int = 0
    ssm_inner: int = 0
    ssm_groups: int = 0
    ssm_dt_rank: int = 0
    n_nextn: int = 0  # MTP (nextn) blocks after the n_layer trunk blocks (block_count counts both)
    weight_type: T = T.Q4_K
    embd_type: T = T.Q4_K
    bos: int = 1
    eos: int = 2
    add_bos: bool = False
    extra: dict = field(default_factory=dict)

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and bool(self.full_attention_interval) and (il + 1) % self.full_attention_interval != 0


SHAPES = {
    "qwen3.6-27b": Shape(
        "qwen3.6-27b", "qwen35", 64, 5120, 17408, 24, 4, 256, 248320, 262144, tied=False,
        full_attention_interval=4, ssm_conv=4, ssm_state=128, ssm_inner=6144, ssm_groups=16, ssm_dt_rank=48,
        bos=248044, eos=248046, extra={"rope.dimension_count": 64, "rope.freq_base": 1e7},
    ),
    "qwen3.6-27b-mtp": Shape(
        "qwen3.6-27b-mtp", "qwen35", 64, 5120, 17408, 24, 4, 256, 248320, 262144, tied=False,
        full_attention_interval=4, ssm_conv=4, ssm_state=128, ssm_inner=6144, ssm_groups=16, ssm_dt_rank=48,
        n_nextn=1, bos=248044, eos=248046, extra={"rope.dimension_count": 64, "rope.freq_base": 1e7},
    ),
    "qwen3.5-0.8b": Shape(
        "qwen3.5-0.8b", "qwen35", 24, 1024, 3584, 8, 2, 256, 248320, 262144, tied=True,
        full_attention_interval=4, ssm_conv=4, ssm_state=128, ssm_inner=2048, ssm_groups=16, ssm_dt_rank=16,
        bos=248044, eos=248046, extra={"rope.dimension_count": 64, "rope.freq_base": 1e7},
    ),
    "gemma3-27b": Shape(
        "gemma3-27b", "gemma3", 62, 5376, 21504, 32, 16, 128, 262144, 131072, tied=True, sliding_window=1024,
        weight_type=T.Q4_0, embd_type=T.F16, bos=2, eos=106, add_bos=True,
        extra={"rope.freq_base": 1e6, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0},
    ),
    "gemma3-270m": Shape(
        "gemma3-270m", "gemma3", 18, 640, 2048, 4, 1, 256, 262144, 32768, tied=True, sliding_window=512,
        weight_type=T.Q4_0, embd_type=T.Q8_0, bos=2, eos=1, add_bos=True, extra={"rope.freq_base": 1e6},
    ),
}


def _more_bits(il: int, n_layer: int) -> bool:
    """llama.cpp's Q4_K_M rule for which layers keep ffn_down / attn_v at Q6_K."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def tensor_table(s: Shape) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ggml dims ne0..., type) for every tensor llama.cpp's loader expects for this shape."""
    w, f32 = s.weight_type, T.F32
    mixed = s.weight_type == T.Q4_K
    out: list[tuple[str, tuple[int, ...], T]] = [("token_embd.weight", (s.n_embd, s.n_vocab), s.embd_type),
                                                   ("output_norm.weight", (s.n_embd,), f32)]
    if not s.tied:
        out.append(("output.weight", (s.n_embd, s.n_vocab), T.Q6_K if mixed else w))
    q_dim = s.head_dim * s.n_head * (2 if s.arch == "qwen35" else 1)
    kv_dim = s.head_dim * s.n_head_kv
    for il in range(s.n_layer + s.n_nextn):
        p = f"blk.{il}."
        more = T.Q6_K if mixed and _more_bits(il, s.n_layer) else w
        out.append((p + "attn_norm.weight", (s.n_embd,), f32))
        out.append((p + "post_attention_norm.weight", (s.n_embd,), f32))
        if s.is_recurrent(il):
            key_dim = s.ssm_state * s.ssm_groups
            value_dim = s.ssm_state * s.ssm_dt_rank
            out += [
                (p + "attn_qkv.weight", (s.n_embd, key_dim * 2 + value_dim), w),
                (p + "attn_gate.weight", (s.n_embd, value_dim), w),
                (p + "ssm_conv1d.weight", (s.ssm_conv, key_dim * 2 + value_dim), f32),
                (p + "ssm_dt.bias", (s.ssm_dt_rank,), f32),
                (p + "ssm_a", (s.ssm_dt_rank,), f32),
                (p + "ssm_beta.weight", (s.n_embd, s.ssm_dt_rank), f32 if s.n_embd % 256 else w),
                (p + "ssm_alpha.weight", (s.n_embd, s.ssm_dt_rank), f32 if s.n_embd % 256 else w),
                (p + "ssm_norm.weight", (s.ssm_state,), f32),
                (p + "ssm_out.weight", (value_dim, s.n_embd), w),
            ]
        else:
            out += [
                (p + "attn_q.weight", (s.n_embd, q_dim), w),
                (p + "attn_k.weight", (s.n_embd, kv_dim), w),
                (p + "attn_v.weight", (s.n_embd, kv_dim), more),
                (p + "attn_output.weight", (s.head_dim * s.n_head, s.n_embd), w),
                (p + "attn_q_norm.weight", (s.head_dim,), f32),
                (p + "attn_k_norm.weight", (s.head_dim,), f32),
            ]
        if s.arch == "gemma3":
            out += [(p + "ffn_norm.weight", (s.n_embd,), f32), (p + "post_ffw_norm.weight", (s.n_embd,), f32)]
        out += [
            (p + "ffn_gate.weight", (s.n_embd, s.n_ff), w),
            (p + "ffn_up.weight", (s.n_embd, s.n_ff), w),
            (p + "ffn_down.weight", (s.n_ff, s.n_embd), more),
        ]
        if il >= s.n_layer:
            out += nextn_tensors(s, il)
    return out


def nextn_tensors(s: Shape, il: int) -> list[tuple[str, tuple[int, ...], T]]:
    """The tensors that make block `il` an MTP (nextn) head, as llama.cpp's qwen35 loader names them:
    the projection of [token embedding, target hidden state] and its norms."""
    p, f32 = f"blk.{il}.nextn.", T.F32
    return [(p + "eh_proj.weight", (2 * s.n_embd, s.n_embd), T.Q6_K if s.weight_type == T.Q4_K else s.weight_type),
            (p + "enorm.weight", (s.n_embd,), f32), (p + "hnorm.weight", (s.n_embd,), f32),
            (p + "shared_head_norm.weight", (s.n_embd,), f32)]


def tensor_nbytes(dims: tuple[int, ...], t: T) -> int:
    block, size = GGML_QUANT_SIZES[t]
    n = int(np.prod(dims))
    return n // block * size


def _add_metadata(w: GGUFWriter, s: Shape) -> None:
    a = s.arch
    w.add_name(s.name)
    w.add_uint32(f"{a}.block_count", s.n_layer + s.n_nextn)
    if s.n_nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", s.n_nextn)
    w.add_uint32(f"{a}.context_length", s.context_length)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if s.sliding_window:
        w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    if s.full_attention_interval:
        w.add_uint32(f"{a}.full_attention_interval", s.full_attention_interval)
        w.add_uint32(f"{a}.ssm.conv_kernel", s.ssm_conv)
        w.add_uint32(f"{a}.ssm.state_size", s.ssm_state)
        w.add_uint32(f"{a}.ssm.inner_size", s.ssm_inner)
        w.add_uint32(f"{a}.ssm.group_count", s.ssm_groups)
        w.add_uint32(f"{a}.ssm.time_step_rank", s.ssm_dt_rank)
        w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
    for k, v in s.extra.items():
        if isinstance(v, str):
            w.add_string(f"{a}.{k}", v)
        elif isinstance(v, float):
            w.add_float32(f"{a}.{k}", v)
        else:
            w.add_uint32(f"{a}.{k}", v)
    w.add_tokenizer_model("gpt2" if a == "qwen35" else "llama")
    if a == "qwen35":
        w.add_tokenizer_pre("qwen35")
        w.add_token_merges(["<tok 1>"])  # BPE needs a merges list; placeholder vocabularies merge nothing
    toks = [f"<tok{i}>" for i in range(s.n_vocab)]
    w.add_token_list(toks)
    w.add_token_types([int(TokenType.NORMAL)] * s.n_vocab)
    if a != "qwen35":
        w.add_token_scores([0.0] * s.n_vocab)
    w.add_bos_token_id(s.bos)
    w.add_eos_token_id(s.eos)
    w.add_add_bos_token(s.add_bos)


def _start(path: Path, s: Shape) -> GGUFWriter:
    w = GGUFWriter(str(path), s.arch)
    _add_metadata(w, s)
    for name, dims, t in tensor_table(s):
        w.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), tensor_nbytes(dims, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def write_sparse(path: Path, s: Shape, file_size: int | None = None) -> Path:
    """Header and tensor table of `s`, then a hole: as big as the data needs, or `file_size`."""
    _start(path, s).close()
    from app.gguf.header import read_header

    h = read_header(path)
    need = h.data_offset + max(t.offset + t.n_bytes for t in h.tensors)
    with open(path, "r+b") as f:
        f.truncate(max(need, file_size or 0))
    return path


# Byte offsets of the f16 scale fields inside one block, per quantization type. Random bytes
# elsewhere are valid quants; the scales are set small so activations stay finite.
_SCALE_FIELDS = {T.Q4_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,)}


class _RandomBytes:
    """Cheap pseudo-random weights: one random buffer, reused (timings do not care)."""

    def __init__(self, seed: int, size: int = 64 * 2**20) -> None:
        self.buf = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    def take(self, n: int, offset: int) -> np.ndarray:
        reps = -(-(n + offset) // len(self.buf))
        src = self.buf if reps == 1 else np.tile(self.buf, reps)
        return src[offset : offset + n].copy()


def _tensor_data(name: str, dims: tuple[int, ...], t: T, rnd: _RandomBytes, rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(dims))
    if t in (T.F32, T.F16):
        dtype = np.float32 if t == T.F32 else np.float16
        if name.endswith("norm.weight") or name.endswith("ssm_a"):
            return np.ones(n, dtype=dtype) * (-1 if name.endswith("ssm_a") else 1)
        return (rng.standard_normal(n) * 0.02).astype(dtype)
    block, size = GGML_QUANT_SIZES[t]
    n_blocks = n // block
    data = rnd.take(n_blocks * size, int(rng.integers(0, 1 << 20))).reshape(n_blocks, size)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for off in _SCALE_FIELDS[t]:
        data[:, off : off + 2] = scale
    return data.reshape(-1)


def write_random(path: Path, s: Shape, seed: int = 0, scale: dict[str, float] | None = None,
                 values: dict[str, np.ndarray] | None = None) -> Path:
    """A loadable model of shape `s` with random weights (for speed measurements, not for text).
    For float weights (F32 / F16 shapes): `scale` multiplies the tensors it names, `values` gives
    tensors outright (numpy order: the ggml dims reversed)."""
    w = _start(path, s)
    rnd, rng = _RandomBytes(seed), np.random.default_rng(seed)
    for name, dims, t in tensor_table(s):
        data = _tensor_data(name, dims, t, rnd, rng)
        if t in (T.F32, T.F16):
            if values and name in values:
                data = np.asarray(values[name], dtype=data.dtype).reshape(-1)
            if scale and name in scale:
                data = (data * scale[name]).astype(data.dtype)
        w.write_tensor_data(data)
    w.close()
    return path


def small(s: Shape, n_vocab: int = 4096) -> Shape:
    """The architecture of `s` at a size a CPU runs in seconds (same layer pattern and head sizes)."""
    if s.arch == "qwen35":
        return replace(s, name=s.name + "-small", n_layer=8, n_embd=512, n_ff=1024, n_head=4, n_head_kv=2,
                       n_vocab=n_vocab, context_length=16384, ssm_groups=4, ssm_dt_rank=8, ssm_inner=1024,
                       bos=n_vocab - 2, eos=n_vocab - 1)
    return replace(s, name=s.name + "-small", n_layer=12, n_embd=512, n_ff=1024, n_head=4, n_head_kv=2,
                   n_vocab=n_vocab, context_length=16384, sliding_window=min(s.sliding_window, 256))


def write_mtp_standin(path: Path, seed: int = 3, n_vocab: int = 256, state_weight: float = 1.0,
                      embd_scale: float = 16.0, output_scale: float = 10.0) -> Path:
    """Qwen3.6-27B-MTP's architecture at a small shape (hybrid trunk + one nextn block), F32 random
    weights arranged so that the MTP head's drafts depend on both of its inputs, as a trained head's
    do: the token embedding dominates each of the target's hidden states (so the target's next token
    is mostly a function of its current one, which the head sees too), and the head's `eh_proj` maps
    [embedding | target state] to the embedding plus a norm-preserving (orthogonal) turn of the state
    times `state_weight`. At 1.0 the state weighs as much as the embedding: a head fed a zero or a
    stale state drafts other tokens, so a test can tell right state handling from wrong (llama.cpp
    normalises both halves before the projection, `enorm` and `hnorm`)."""
    shape = replace(small(SHAPES["qwen3.6-27b-mtp"], n_vocab), weight_type=T.F32, embd_type=T.F32)
    n = shape.n_embd
    turn, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    through = np.concatenate([np.eye(n), turn * state_weight], axis=1).astype(np.float32)
    return write_random(path, shape, seed=seed, scale={"output.weight": output_scale, "token_embd.weight": embd_scale},
                        values={f"blk.{shape.n_layer}.nextn.eh_proj.weight": through})
