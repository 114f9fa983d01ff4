"""A fast reader of a GGUF file's key-value section and tensor table.

gguf's own `GGUFReader` builds a numpy view for every element of every array, which takes ~8 s on
a 152K-token vocabulary with its merges. This reader walks the same layout with `struct` over a
memory map, uses gguf's type tables (value types, quantization block sizes) and reads no tensor
data, so a header takes well under a second. Any damage is reported as one GGUFError.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFValueType,
)

from app.errors import GGUFError

MAX_COUNT = 1 << 28  # no real file has more keys, tensors or array elements than this
MAX_NESTING = 8  # arrays of arrays: real files nest at most one level
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1), GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2), GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4), GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4), GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8), GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_NUMPY = {t: np.dtype(fmt) for t, (fmt, _) in _SCALARS.items()}


class _Truncated(Exception):
    pass


@dataclass(frozen=True)
class RawTensor:
    name: str
    type: int
    dims: tuple[int, ...]
    offset: int  # relative to the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        return self.n_elements // block * size


@dataclass(frozen=True)
class RawHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[RawTensor, ...]
    data_offset: int


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Truncated()
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.take(size))[0]

    def count(self) -> int:
        n = self.unpack("<Q", 8)
        if n > MAX_COUNT:
            raise GGUFError(f"implausible count {n} in header")
        return n

    def string(self) -> str:
        return bytes(self.take(self.count())).decode("utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            sub = self.unpack("<I", 4)
            n = self.count()
            if sub == GGUFValueType.STRING:
                return tuple(self.string() for _ in range(n))
            if sub in _NUMPY:
                dt = _NUMPY[sub]
                arr = np.frombuffer(self.take(n * dt.itemsize), dtype=dt)
                return tuple(arr.tolist())
            if sub == GGUFValueType.ARRAY:
                if depth >= MAX_NESTING:
                    raise GGUFError(f"arrays nested more than {MAX_NESTING} deep")
                return tuple(self.value(GGUFValueType.ARRAY, depth + 1) for _ in range(n))
            raise GGUFError(f"unknown array element type {sub}")
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.unpack(fmt, size)
        raise GGUFError(f"unknown value type {vtype}")


def _parse(buf: memoryview) -> RawHeader:
    c = _Cursor(buf)
    if bytes(c.take(4)) != b"GGUF":
        raise GGUFError("not a GGUF file")
    version = c.unpack("<I", 4)
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version} (big-endian or too old)")
    n_tensors, n_kv = c.count(), c.count()
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.unpack("<I", 4))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I", 4)
        if n_dims > 8:
            raise GGUFError(f"tensor {name}: {n_dims} dimensions")
        dims = struct.unpack(f"<{n_dims}Q", c.take(8 * n_dims))
        ttype, offset = c.unpack("<I", 4), c.unpack("<Q", 8)
        try:
            GGMLQuantizationType(ttype)
        except ValueError:
            raise GGUFError(f"tensor {name}: unknown type {ttype}") from None
        tensors.append(RawTensor(name, ttype, tuple(dims), offset))
    align = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"general.alignment must be a positive power of two, not {align!r}"[:120])
    data_offset = (c.pos + align - 1) // align * align
    return RawHeader(version, meta, tuple(tensors), data_offset)


def parse_prefix(data: bytes, label: str) -> RawHeader | None:
    """Parse a header from the first bytes of a file; None when they end before the tensor table does."""
    view = memoryview(data)
    try:
        return _parse(view)
    except _Truncated:
        return None
    except GGUFError as e:
        raise GGUFError(f"{label}: {e.message}") from None
    except (ValueError, OverflowError, struct.error) as e:
        raise GGUFError(f"{label}: cannot read GGUF header: {e}") from None
    finally:
        view.release()


def read_header(path: Path) -> RawHeader:
    """Parse the header of the GGUF at `path` (no tensor data is read)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{path}: too short for a GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    return _parse(view)
                finally:
                    view.release()
    except _Truncated:
        raise GGUFError(f"{path}: truncated GGUF header") from None
    except GGUFError as e:
        if e.message.startswith(str(path)):
            raise
        raise GGUFError(f"{path}: {e.message}") from None
    except (OSError, ValueError, OverflowError, struct.error) as e:
        raise GGUFError(f"{path}: cannot read GGUF header: {e}") from None
