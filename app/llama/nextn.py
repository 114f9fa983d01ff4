"""What an MTP (nextn) draft head needs from libllama beyond llama-cpp-python's bindings.

A target with nextn layers can hand out its hidden state (before the output norm) for every token
it decodes, and an MTP context decodes (token, hidden state) pairs. The staging calls for the first
(`llama_set_embeddings_nextn`, `llama_get_embeddings_nextn_ith`, declared in llama.cpp's
`src/llama-ext.h`) are exported by libllama as C++ symbols only, so they are looked up here by their
mangled names; the second goes through the extended batch API (`llama_batch_ext_*`, `llama_process`),
which can carry a token and an embedding row together where `llama_batch` holds one or the other.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from app.errors import SpecdeckError

_SYMBOLS = {
    "set": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32],
            ctypes.POINTER(ctypes.c_float)),
    "all": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)),
}
_fns: dict[str, ctypes._CFuncPtr] = {}


class NextnUnavailable(SpecdeckError):
    """This libllama does not export the nextn staging calls (another llama.cpp than the one built)."""


def _fn(name: str):
    if name not in _fns:
        symbol, args, res = _SYMBOLS[name]
        try:
            f = getattr(llama_cpp.llama_cpp._lib, symbol)
        except AttributeError:
            raise NextnUnavailable(f"this libllama has no {symbol} (MTP drafting needs llama-cpp-python 0.3.36's)") from None
        f.argtypes, f.restype = args, res
        _fns[name] = f
    return _fns[name]


def check_available() -> None:
    """Raise NextnUnavailable now, not at the first draft, where the calls are missing."""
    for name in _SYMBOLS:
        _fn(name)


def emit_hidden(ctx_ptr, masked: bool) -> None:
    """From the next decode on, keep each token's hidden state: every token of the batch (`masked`
    False, the target's: its rows are indexed by batch position), or only those with outputs (the
    MTP context's own, indexed like logits)."""
    _fn("set")(ctx_ptr, True, masked)


def hidden_rows(ctx_ptr, n_rows: int, n_embd: int) -> np.ndarray:
    """The last decode's hidden states, one row per batch position (a view: copy before the next decode)."""
    ptr = _fn("all")(ctx_ptr)
    if not ptr:
        raise SpecdeckError("no hidden states after the decode (the context does not emit them)")
    return np.ctypeslib.as_array(ptr, shape=(n_rows, n_embd))


def hidden_row(ctx_ptr, i: int, n_embd: int) -> np.ndarray:
    """The hidden state at output i of the last decode (a view)."""
    ptr = _fn("ith")(ctx_ptr, i)
    if not ptr:
        raise SpecdeckError(f"no hidden state for output {i}")
    return np.ctypeslib.as_array(ptr, shape=(n_embd,))


class EmbdBatch:
    """A batch of (token, position, sequence, hidden-state row, wants-logits) entries for an MTP
    context (llama.cpp's extended batch: the row goes in beside the token). The batch copies each
    row when it is added."""

    def __init__(self, ctx_ptr, n_embd: int) -> None:
        self.raw = llama_cpp.llama_batch_ext_init(ctx_ptr)
        if not self.raw:
            raise SpecdeckError("llama.cpp could not create an extended batch")
        self.n_embd = n_embd
        self.n = 0
        self.n_out = 0  # entries that asked for logits
        self._pos = (llama_cpp.llama_pos * 4)()

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.raw)
        self.n = self.n_out = 0

    def add(self, token: int, pos: int, seq: int, row: np.ndarray, logits: bool) -> int:
        """Append one entry; returns its index (what `Context.logits` and `hidden_row` take)."""
        idx = llama_cpp.llama_batch_ext_add_token(self.raw, seq, token)
        if idx < 0:
            raise SpecdeckError(f"extended batch refused a token ({idx}): over capacity or a bad sequence")
        self._pos[0] = pos
        row = np.ascontiguousarray(row, dtype=np.float32)
        embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        if not (llama_cpp.llama_batch_ext_set_pos(self.raw, idx, self._pos)
                and llama_cpp.llama_batch_ext_set_embd_token(self.raw, idx, embd)):
            raise SpecdeckError("extended batch refused a position or a hidden-state row")
        if logits:
            llama_cpp.llama_batch_ext_set_output_logits(self.raw, idx, True)
            self.n_out += 1
        self.n += 1
        return idx

    def __len__(self) -> int:
        return self.n

    def close(self) -> None:
        if getattr(self, "raw", None):
            llama_cpp.llama_batch_ext_free(self.raw)
            self.raw = None

    def __del__(self) -> None:
        self.close()
