"""The planner's arithmetic: each memory term llama.cpp allocates, as a function of GGUF metadata.

Every rule below is the vendored llama.cpp's (llama-cpp-python 0.3.36), read from its sources and
held against its own buffer-size log lines by the tests:
- context: n_ctx is padded to a multiple of 256; n_ubatch <= n_batch <= the requested n_ctx;
  with a unified KV pool one stream holds all n_ctx cells for every sequence.
- KV: per attention layer, cells x (row(type_k, kv_heads x k_len) + row(type_v, kv_heads x v_len));
  a sliding-window layer holds pad256(min(n_ctx, window x n_seq + n_ubatch)) cells unless
  swa_full; recurrent layers hold no KV.
- recurrent state (F32): per recurrent layer (r + s) x max(1, n_seq) x (1 + n_rs_seq), with
  r = (conv - 1) x (inner + 2 x groups x state) and s = state x inner; each rollback snapshot
  (n_rs_seq) is a full copy.
- weights: token_embd always stays in host memory; with the output on the GPU a tied embedding is
  copied there too; layers go to the GPU from the last one down.
- CPU repack: Q4_0, Q4_K, IQ4_NL 2-D matmul weights with rows divisible by 8 get a second,
  repacked copy on x86 with AVX2 (token_embd only as the output copy of a tied embedding); a build
  with AMX first packs Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS/F16 weights whose shapes fit its
  tiles into an `AMX` buffer. Which of these a build has is read from the build, not assumed.
- compute: the scheduler keeps the largest of the prompt graphs: the logits phase
  4·(rows·n_vocab + 3·n_ubatch·n_embd), rows = min(n_ubatch, n_outputs_max), or a layer phase: with flash attention the f16 mask
  2·n_kv·n_ubatch plus 4·n_ubatch·(3·n_ff + 2·n_embd); without it the f32 scores and mask
  4·n_kv·n_ubatch·(n_head + 1) plus 4·n_ubatch·n_ff; or a recurrent layer's phase (below).
- output: 4·n_vocab·rows, rows = the most logits rows asked for at once (at least n_seq_max).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from app.gguf.info import ModelInfo

MiB = 1024 * 1024
GiB = 1024 * MiB
CTX_PAD = 256
KV_TYPES = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", "f32")
QUANT_KV = {"q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"}
CUDA_FA_KV = {"f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0"}
REPACKED = {"Q4_0", "Q4_K", "IQ4_NL"}


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def row_bytes(type_name: str, n: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]
    return n // block * size


def kv_type_block(type_name: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]][0]


@dataclass(frozen=True)
class ContextShape:
    """The context llama.cpp will really create for one model."""

    n_ctx: int  # after padding
    n_batch: int
    n_ubatch: int
    n_seq: int
    type_k: str
    type_v: str
    flash_attn: bool
    swa_full: bool = False
    n_rs_seq: int = 0
    n_outputs: int = 1  # most logits rows per sequence asked for at once
    n_outputs_max: int = 0  # most logits rows of one decode the compute buffer is sized for (0: n_batch)


def context_shape(
    n_ctx: int, n_seq: int, type_k: str, type_v: str, n_batch: int = 2048, n_ubatch: int = 512,
    flash_attn: bool = True, swa_full: bool = False, n_rs_seq: int = 0, n_outputs: int = 1,
    n_outputs_max: int = 0,
) -> ContextShape:
    """llama.cpp's adjustments to a requested context (unified KV pool)."""
    batch = min(n_ctx, n_batch)
    return ContextShape(pad(n_ctx, CTX_PAD), batch, min(batch, n_ubatch), max(1, n_seq), type_k, type_v,
                        flash_attn, swa_full, n_rs_seq, n_outputs, min(batch, n_outputs_max))


# -- KV cache and recurrent state --------------------------------------------------------------

def kv_cells(info: ModelInfo, layer: int, cs: ContextShape) -> int:
    if info.swa_layers[layer] and not cs.swa_full and info.sliding_window:
        return pad(min(cs.n_ctx, int(info.sliding_window) * cs.n_seq + cs.n_ubatch), CTX_PAD)
    return cs.n_ctx


def kv_bytes(info: ModelInfo, cs: ContextShape, nextn: bool = False) -> int:
    """Target or draft KV cache: K and V for every attention layer of the trunk; `nextn`: of the MTP
    blocks instead (an MTP context's cache holds only theirs)."""
    total = 0
    for il in (range(info.n_trunk, info.n_layers) if nextn else range(info.n_trunk)):
        heads = info.n_head_kv[il]
        if not heads:
            continue
        per_cell = row_bytes(cs.type_k, heads * info.key_length) + row_bytes(cs.type_v, heads * info.value_length)
        total += per_cell * kv_cells(info, il, cs)
    return total


def recurrent_state_bytes(info: ModelInfo, cs: ContextShape) -> int:
    """Recurrent (SSM / Gated DeltaNet) state, with one full copy per rollback snapshot."""
    if not info.n_recurrent_layers:
        return 0
    conv, state = info.ssm.get("conv_kernel", 0), info.ssm.get("state_size", 0)
    inner, groups = info.ssm.get("inner_size", 0), info.ssm.get("group_count", 0)
    r = max(conv - 1, 0) * (inner + 2 * groups * state)
    s = state * inner
    return 4 * (r + s) * cs.n_seq * (1 + cs.n_rs_seq) * info.n_recurrent_layers


def checkpoint_bytes(info: ModelInfo, cs: ContextShape) -> int:
    """One context checkpoint of one sequence (llama.cpp's PARTIAL_ONLY state): the recurrent state
    without snapshots, and each sliding-window layer's cells within the window; 0 for a model whose
    cache can simply be cut back (it keeps none)."""
    one = ContextShape(cs.n_ctx, cs.n_batch, cs.n_ubatch, 1, cs.type_k, cs.type_v, cs.flash_attn, cs.swa_full)
    total = recurrent_state_bytes(info, one)
    swa = bool(info.sliding_window) and not cs.swa_full and info.n_swa_layers > 0
    if not total and not swa:
        return 0
    total += 4096  # the state's headers
    if swa:
        total += 16 * min(cs.n_ctx, int(info.sliding_window))  # each cell's position and sequences
        for il in range(info.n_layers):
            heads = info.n_head_kv[il]
            if heads and info.swa_layers[il]:
                per_cell = row_bytes(cs.type_k, heads * info.key_length) + row_bytes(cs.type_v, heads * info.value_length)
                total += per_cell * min(cs.n_ctx, int(info.sliding_window))
    return total


def kv_incompatibility(info: ModelInfo, type_k: str, type_v: str, flash_attn: bool, device: str) -> str | None:
    """Why llama.cpp would refuse these cache types for this model, or None."""
    for t, dim, what in ((type_k, info.key_length, "K"), (type_v, info.value_length, "V")):
        if t not in KV_TYPES:
            return f"unknown cache type '{t}' (one of {', '.join(KV_TYPES)})"
        if t in QUANT_KV and dim % kv_type_block(t):
            return f"{what} head size {dim} is not a multiple of {t}'s block of {kv_type_block(t)}"
    if type_v in QUANT_KV and not flash_attn:
        return "a quantized V cache needs flash attention"
    if device == "cuda" and flash_attn and (type_k not in CUDA_FA_KV or type_v not in CUDA_FA_KV):
        return f"CUDA flash attention supports K/V types {', '.join(sorted(CUDA_FA_KV))}"
    return None


# -- weights ----------------------------------------------------------------------------------

def _per_model(fn: Callable) -> Callable:
    """Remember what `fn(info, *args)` came to for each model: these sums walk the whole tensor table,
    and a plan's search asks for the same ones hundreds of times per plan (32 plans of the 27B
    stand-ins took 63 s under a profiler, 55 s of it here; 7 s with this). A ModelInfo is frozen;
    the cache holds the model itself beside each answer, so an id is never taken for another's."""
    cache: dict[tuple, tuple[ModelInfo, object]] = {}

    @functools.wraps(fn)
    def wrapper(info: ModelInfo, *args):
        key = (id(info), *args)
        hit = cache.get(key)
        if hit is None or hit[0] is not info:
            if len(cache) > 256:
                cache.clear()
            hit = cache[key] = (info, fn(info, *args))
        return hit[1]

    return wrapper


def _layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return None


def data_bytes(info: ModelInfo) -> int:
    """The weights as llama.cpp maps them: the tensor table's sum.

    A stand-in file (header plus a hole up to the real file's size) may be larger than its table:
    the unexplained bytes count as weights too, so a plan built on it never comes out short.
    """
    return max(info.tensor_bytes, info.file_size - info.data_offset)


@_per_model
def nextn_bytes(info: ModelInfo) -> int:
    """The MTP blocks' weights: llama.cpp loads them only for an MTP draft context (load_mtp)."""
    return sum(t.n_bytes for t in info.tensors if (layer := _layer_of(t.name)) is not None and info.is_nextn(layer))


def _unexplained(info: ModelInfo) -> int:
    return data_bytes(info) - info.tensor_bytes


def _first_gpu_layer(info: ModelInfo, n_gpu_layers: int) -> int:
    """llama.cpp offloads the output layer first, then the last n_gpu_layers - 1 layers."""
    if n_gpu_layers <= 0:
        return info.n_layers
    return info.n_layers - min(n_gpu_layers - 1, info.n_layers)


@_per_model
def weight_placement(info: ModelInfo, n_gpu_layers: int) -> tuple[int, int]:
    """(bytes on the GPU, bytes in host memory) of the weights with `n_gpu_layers` offloaded."""
    first = _first_gpu_layer(info, n_gpu_layers)
    output_on_gpu = n_gpu_layers >= 1
    tied = not any(t.name == "output.weight" for t in info.tensors)
    gpu = host = 0
    for t in info.tensors:
        layer = _layer_of(t.name)
        if layer is not None:
            on_gpu = layer >= first
        elif t.name == "token_embd.weight":
            on_gpu = False  # the input embedding always stays on the host ...
            if tied and output_on_gpu:
                gpu += t.n_bytes  # ... and a tied one is copied to the GPU for the output
        else:
            on_gpu = output_on_gpu
        if on_gpu:
            gpu += t.n_bytes
        else:
            host += t.n_bytes
    extra = _unexplained(info)  # attributed to the GPU share of the layers, to err on the safe side
    if extra:
        share = (info.n_layers - first) / info.n_layers if info.n_layers else 0.0
        gpu += int(extra * share)
        host += extra - int(extra * share)
    return gpu, host


def _repackable(t) -> bool:
    return t.type in REPACKED and len(t.shape) == 2 and not t.shape[1] % 8


# AMX (Intel Sapphire Rapids and later, builds compiled with AMX_INT8): weights of these types with
# in_features divisible by the alignment and out_features by 32 go to an `AMX` buffer, packed;
# F16 ones too, unpacked. It is tried before the repack buffer.
AMX_ALIGN = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256, "F16": 16}
_AMX_EXTRA_PER_BLOCK = {"Q8_0": 4, "Q4_K": 4, "Q5_K": 4, "IQ4_XS": 2}  # compensation / scales added by the packing


def _amx_eligible(t) -> bool:
    return (t.type in AMX_ALIGN and len(t.shape) == 2 and not t.shape[0] % AMX_ALIGN[t.type]
            and not t.shape[1] % 32)


def _amx_bytes(t) -> int:
    if t.type == "F16":
        return t.n_bytes
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t.type]]
    kb = t.shape[0] // block
    return t.shape[1] * kb * (size + _AMX_EXTRA_PER_BLOCK.get(t.type, 0))


CPU_EXTRA_BUFFERS = ("AMX", "CPU_REPACK")  # in the order llama.cpp tries them


def _extra_buffer_of(t, buffers: tuple[str, ...]) -> str | None:
    if "AMX" in buffers and _amx_eligible(t):
        return "AMX"
    if "CPU_REPACK" in buffers and _repackable(t):
        return "CPU_REPACK"
    return None


def mapped_report_bytes(info: ModelInfo, buffers: tuple[str, ...] = ("CPU_REPACK",)) -> int:
    """What llama.cpp's log calls the CPU_Mapped buffer on a CPU-only load: the file span from the
    first to the last tensor that is not moved to an extra buffer (the plan counts every tensor)."""
    kept = [t for t in info.tensors if t.name == "token_embd.weight" or _extra_buffer_of(t, buffers) is None]
    return max(t.offset + t.n_bytes for t in kept) - min(t.offset for t in kept) if kept else 0


def cpu_extra_bytes(info: ModelInfo, n_gpu_layers: int = 0,
                    buffers: tuple[str, ...] = ("CPU_REPACK",)) -> dict[str, int]:
    """The second, rearranged copy a CPU build keeps of the matmul weights it runs, per extra buffer.

    Which buffers exist is a property of the llama.cpp build (`app.build.info.cpu_buffers`): an AMX
    build packs into `AMX` what it can and repacks the rest; an x86 build with AVX2 repacks Q4_0 /
    Q4_K / IQ4_NL into `CPU_REPACK`; a build with neither keeps only the mapped file.
    """
    return dict(_cpu_extra_bytes(info, n_gpu_layers, tuple(buffers)))


@_per_model
def _cpu_extra_bytes(info: ModelInfo, n_gpu_layers: int, buffers: tuple[str, ...]) -> dict[str, int]:
    first = _first_gpu_layer(info, n_gpu_layers)
    output_on_gpu = n_gpu_layers >= 1
    tied = not any(t.name == "output.weight" for t in info.tensors)
    totals = {b: 0 for b in buffers if b in CPU_EXTRA_BUFFERS}
    for t in info.tensors:
        buf = _extra_buffer_of(t, buffers)
        if buf is None:
            continue
        size = _amx_bytes(t) if buf == "AMX" else t.n_bytes
        if t.name == "token_embd.weight":  # never moved as the input; a tied output copy on the CPU is
            totals[buf] += size if tied and not output_on_gpu else 0
            continue
        layer = _layer_of(t.name)
        if (layer is not None and layer < first) or (layer is None and not output_on_gpu):
            totals[buf] += size
    return totals


def cpu_repack_bytes(info: ModelInfo, n_gpu_layers: int = 0) -> int:
    """The repacked copy x86 CPUs with AVX2 keep of Q4_0 / Q4_K / IQ4_NL matmul weights run on the CPU."""
    return cpu_extra_bytes(info, n_gpu_layers, ("CPU_REPACK",))["CPU_REPACK"]


# -- buffers ----------------------------------------------------------------------------------

def compute_bytes(info: ModelInfo, cs: ContextShape, hidden: bool = False) -> int:
    """Estimate of the scheduler's compute buffer: the larger of the logits and the layer phase.
    The logits phase holds n_vocab floats per output row: a ubatch's worth unless the context caps
    its output rows (n_outputs_max). `hidden`: every token's hidden state is a graph output too (an MTP
    head's input), kept through the logits phase."""
    ub, n_vocab, n_embd = cs.n_ubatch, info.vocab.size, info.n_embd
    n_ff = info.n_ff or 4 * n_embd
    rows = min(ub, cs.n_outputs_max or ub)
    logits = 4 * (rows * n_vocab + (4 if hidden else 3) * ub * n_embd)
    n_kv = cs.n_ctx
    mask = 2 * n_kv * ub if cs.flash_attn else 4 * n_kv * ub
    if info.n_swa_layers:  # sliding-window layers have a mask of their own
        swa_cells = next(kv_cells(info, il, cs) for il in range(info.n_layers) if info.swa_layers[il])
        mask += (2 if cs.flash_attn else 4) * swa_cells * ub
    if cs.flash_attn:
        layer = mask + 4 * ub * (3 * n_ff + 3 * n_embd)
    else:
        layer = 4 * n_kv * ub * info.n_head + mask + 4 * ub * n_ff
    return max(logits, layer, _recurrent_phase(info, cs, mask))


def _recurrent_phase(info: ModelInfo, cs: ContextShape, mask: int) -> int:
    """A recurrent layer's working set: 3 x (n_embd + conv channels) floats per token, plus the
    per-sequence state copies the graph keeps when rollback snapshots are on (fitted to llama.cpp's
    qwen35 graphs at several shapes; over-estimates a little where the allocator finds room to reuse)."""
    if not info.n_recurrent_layers:
        return 0
    state, inner, groups = info.ssm.get("state_size", 0), info.ssm.get("inner_size", 0), info.ssm.get("group_count", 0)
    conv_dim = 2 * groups * state + inner
    snapshots = 4 * state * inner * cs.n_seq * (cs.n_rs_seq + 3) if cs.n_rs_seq else 0
    return mask + 4 * cs.n_ubatch * 3 * (info.n_embd + conv_dim) + snapshots


def output_bytes(info: ModelInfo, cs: ContextShape) -> int:
    """llama.cpp reserves a logits row per sequence (n_seq_max) at start and grows the buffer to the
    most rows a decode asks for."""
    return 4 * info.vocab.size * cs.n_seq * max(1, cs.n_outputs)
