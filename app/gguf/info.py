"""Read what specdeck needs from a GGUF header, with `gguf`, without loading any weights."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType, LlamaFileType

from app.errors import GGUFError
from app.gguf.header import RawHeader, read_header

GGUF_MAGIC = b"GGUF"

# Sliding-window layout llama.cpp hard-codes where the file carries no pattern key:
# layer i uses the window when i % n < n - 1 (n - 1 local layers, then one global).
SWA_PATTERN_BY_ARCH = {"gemma2": 2, "gemma3": 6, "cohere2": 4}
RECURRENT_ONLY_ARCHS = {"mamba", "mamba2", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2"}
VOCAB_TYPE_NAMES = {"llama": "SPM", "gpt2": "BPE", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV", "plamo2": "PLaMo2"}
FIM_KEYS = ("pre", "suf", "mid", "pad", "rep", "sep")


@dataclass(frozen=True)
class VocabInfo:
    """The tokenizer as the GGUF keys state it. `None` means the key is absent (llama.cpp's default applies)."""

    model: str  # tokenizer.ggml.model: llama (SPM), gpt2 (BPE), ...
    pre: str | None
    tokens: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    fim_ids: dict[str, int | None]
    chat_template: str | None

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def type_name(self) -> str:
        return VOCAB_TYPE_NAMES.get(self.model, self.model)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    offset: int = 0  # within the data section


@dataclass(frozen=True)
class ModelInfo:
    """One GGUF file's architecture, tensors and vocabulary."""

    path: Path
    file_size: int
    data_offset: int  # where tensor data starts
    architecture: str
    name: str | None
    file_type: str | None
    n_params: int
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer (0 for a layer without attention)
    key_length: int
    value_length: int
    n_ff: int | None
    context_length: int
    sliding_window: int | None
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding window
    recurrent_layers: tuple[bool, ...]  # per layer: recurrent (SSM / DeltaNet) instead of attention
    ssm: dict[str, int]
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    vocab: VocabInfo = field(repr=False)
    n_nextn: int = 0  # MTP (nextn) blocks: the last n_nextn of the n_layers blocks, loaded only to draft with

    @property
    def n_trunk(self) -> int:
        """The blocks a forward pass runs (all but the MTP blocks)."""
        return self.n_layers - self.n_nextn

    def is_nextn(self, layer: int) -> bool:
        return layer >= self.n_trunk

    @cached_property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @cached_property
    def quantization(self) -> str:
        """The file type, else the tensor type that holds most bytes."""
        if self.file_type:
            return self.file_type
        by_bytes: Counter[str] = Counter()
        for t in self.tensors:
            by_bytes[t.type] += t.n_bytes
        return by_bytes.most_common(1)[0][0] if by_bytes else "?"

    @property
    def n_attention_layers(self) -> int:
        return sum(1 for r in self.recurrent_layers if not r)

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    @property
    def n_recurrent_layers(self) -> int:
        return sum(self.recurrent_layers)


def _check_magic(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot read: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    return size


def _file_type_name(value: int | None) -> str | None:
    if value is None:
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file_type {value}"


MAX_LAYERS = 4096  # the deepest released models have a few hundred


def _per_layer(value: Any, n_layers: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * n_layers
    if isinstance(value, tuple):
        if len(value) != n_layers:
            raise GGUFError(f"per-layer array has {len(value)} entries for {n_layers} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layers


def _swa_layers(arch: str, meta: dict[str, Any], n_layers: int) -> tuple[bool, ...]:
    window = meta.get(f"{arch}.attention.sliding_window")
    if not window:
        return (False,) * n_layers
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, tuple):
        return tuple(bool(v) for v in pattern[:n_layers])
    n = int(pattern) if pattern else SWA_PATTERN_BY_ARCH.get(arch)
    if n is None:
        return (False,) * n_layers  # the key is present but llama.cpp does not use a window for this arch
    return tuple(i % n < n - 1 for i in range(n_layers))


def _recurrent_layers(arch: str, meta: dict[str, Any], n_layers: int, n_nextn: int = 0) -> tuple[bool, ...]:
    if arch in RECURRENT_ONLY_ARCHS:
        return (True,) * n_layers
    interval = meta.get(f"{arch}.full_attention_interval")
    if interval:  # MTP blocks after the trunk are attention blocks
        return tuple(i < n_layers - n_nextn and (i + 1) % int(interval) != 0 for i in range(n_layers))
    return (False,) * n_layers


def _vocab(meta: dict[str, Any]) -> VocabInfo:
    tokens = meta.get("tokenizer.ggml.tokens") or ()
    return VocabInfo(
        model=meta.get("tokenizer.ggml.model", "none"),
        pre=meta.get("tokenizer.ggml.pre"),
        tokens=tokens,
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_id=meta.get("tokenizer.ggml.eos_token_id"),
        eot_id=meta.get("tokenizer.ggml.eot_token_id"),
        pad_id=meta.get("tokenizer.ggml.padding_token_id"),
        add_bos=meta.get("tokenizer.ggml.add_bos_token"),
        add_eos=meta.get("tokenizer.ggml.add_eos_token"),
        fim_ids={k: meta.get(f"tokenizer.ggml.fim_{k}_token_id") for k in FIM_KEYS},
        chat_template=meta.get("tokenizer.chat_template"),
    )


def _tensors(header: RawHeader) -> tuple[TensorInfo, ...]:
    out = []
    for t in header.tensors:
        type_name = GGMLQuantizationType(t.type).name
        out.append(TensorInfo(t.name, type_name, t.dims, t.n_elements, t.n_bytes, t.offset))
    return tuple(out)


def read_model_info(path: str | os.PathLike[str], file_size: int | None = None) -> ModelInfo:
    """Parse a GGUF file's header and tensor table. Raises GGUFError with a one-line reason.

    `file_size` is the size of the whole file when `path` holds only its first bytes (a header
    read from the hub with range requests): tensor offsets are checked against it instead.
    """
    path = Path(path)
    on_disk = _check_magic(path)
    file_size = on_disk if file_size is None else file_size
    header = read_header(path)
    meta = header.metadata
    arch = meta.get("general.architecture")
    if not arch:
        raise GGUFError(f"{path}: GGUF without general.architecture")
    tensors = _tensors(header)
    data_end = header.data_offset + max((t.offset + t.n_bytes for t in header.tensors), default=0)
    if data_end > file_size:
        raise GGUFError(f"{path}: truncated: tensor data needs {data_end} bytes, file has {file_size}")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    try:
        n_layers = int(key("block_count", 0))
        if not 0 <= n_layers <= MAX_LAYERS or (tensors and n_layers > len(tensors)):
            # each layer has tensors; a damaged count would size per-layer tables of billions
            raise GGUFError(f"{path}: block_count {n_layers} is not a layer count for {len(tensors)} tensors")
        n_embd = int(key("embedding_length", 0))
        head_count = key("attention.head_count", 0)
        n_head = int(max(head_count) if isinstance(head_count, tuple) else head_count)
        kv = _per_layer(key("attention.head_count_kv"), n_layers, n_head)
        n_nextn = int(key("nextn_predict_layers", 0))
        if not 0 <= n_nextn <= n_layers:
            raise GGUFError(f"{path}: nextn_predict_layers {n_nextn} is not within block_count {n_layers}")
        recurrent = _recurrent_layers(arch, meta, n_layers, n_nextn)
        kv = tuple(0 if r else h for h, r in zip(kv, recurrent))
        head_dim = n_embd // n_head if n_head else 0
        ff = key("feed_forward_length")
        ssm = {k.split(".", 2)[2]: int(v) for k, v in meta.items() if k.startswith(f"{arch}.ssm.") and isinstance(v, int)}
        return ModelInfo(
            path=path,
            file_size=file_size,
            data_offset=header.data_offset,
            architecture=arch,
            name=meta.get("general.name"),
            file_type=_file_type_name(meta.get("general.file_type")),
            n_params=sum(t.n_elements for t in tensors),
            n_layers=n_layers,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=kv,
            key_length=int(key("attention.key_length", head_dim)),
            value_length=int(key("attention.value_length", head_dim)),
            n_ff=int(max(ff) if isinstance(ff, tuple) else ff) if ff is not None else None,
            context_length=int(key("context_length", 0)),
            sliding_window=key("attention.sliding_window"),
            swa_layers=_swa_layers(arch, meta, n_layers),
            recurrent_layers=recurrent,
            ssm=ssm,
            metadata={k: v for k, v in meta.items() if not isinstance(v, tuple) or len(v) <= 64},
            tensors=tensors,
            vocab=_vocab(meta),
            n_nextn=n_nextn,
        )
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{path}: unexpected header values for '{arch}': {e}") from None
