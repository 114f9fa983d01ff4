"""Thin, typed wrappers over llama-cpp-python's low-level API: model, context, batch, decode.

One place owns the ctypes details so the engine reads as the algorithm. Everything here is
synchronous and single-threaded: one worker owns a context.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import llama_cpp
import numpy as np

from app.errors import SpecdeckError
from app.llama.backend import init_llama
from app.llama import nextn
from app.llama.measure import KV_TYPE_IDS
from app.llama.nextn import EmbdBatch
from app.llama.params import ModelParams


LLAMA_ROPE_TYPE_IMROPE = 40  # llama.h's LLAMA_ROPE_TYPE_IMROPE (interleaved M-RoPE), not in the bindings


class DecodeError(SpecdeckError):
    """llama_decode refused a batch (no KV slot, out of memory, aborted)."""


_DECODE_ERRORS = {1: "no KV cache slot for the batch (context full)", 2: "aborted", -1: "invalid batch",
                  -2: "out of memory or compute error", -3: "compute error"}


class DecodeAborted(DecodeError):
    """A decode gave way (its `give_way` said so): llama.cpp took back what it had placed of the ubatch."""


class DecodeRunning(SpecdeckError):
    """A context's state was to be replaced or freed while a decode runs in it (another thread)."""


class LoadCancelled(SpecdeckError):
    """Loading was stopped on request (the server is stopping): not a fault of the model."""


class Model:
    """A loaded GGUF model (weights mapped once; contexts are made from it)."""

    def __init__(self, path: Path, n_gpu_layers: int = 0, use_extra_bufts: bool = True,
                 cancel: threading.Event | None = None, load_mtp: bool = False) -> None:
        init_llama()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.use_extra_bufts = use_extra_bufts
        mp.load_mtp = load_mtp  # the nextn (MTP) layers too, for an MTP draft context; skipped otherwise
        self.path = path
        if cancel is not None:  # llama.cpp asks after each part it loads whether to go on
            progress = llama_cpp.llama_progress_callback(lambda _progress, _data: not cancel.is_set())
            mp.progress_callback = progress
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.ptr and cancel is not None and cancel.is_set():
            raise LoadCancelled(f"{path.name}: loading stopped")
        if not self.ptr:
            raise SpecdeckError(f"{path}: llama.cpp could not load the model")
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.swa_window = int(llama_cpp.llama_model_n_swa(self.ptr))
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(self.ptr) or llama_cpp.llama_model_is_hybrid(self.ptr))
        self.n_nextn = int(llama_cpp.llama_model_n_layer_nextn(self.ptr))  # MTP layers the file has
        self.n_embd_out = int(llama_cpp.llama_model_n_embd_out(self.ptr))
        self.n_embd_inp = int(llama_cpp.llama_model_n_embd_inp(self.ptr))  # an input row's width (images' rows)
        # M-RoPE (Qwen2-VL and later, Qwen3.5's hybrids): an embedding row takes 4 positions
        self.mrope = int(llama_cpp.llama_model_rope_type(self.ptr)) in (llama_cpp.LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE)
        self.mtp_loaded = load_mtp

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


def _pooling_of(model: Model) -> int:
    """The pooling type a GGUF declares (`<arch>.pooling_type`), NONE when it declares none."""
    buf = ctypes.create_string_buffer(64)
    arch = buf.value.decode() if llama_cpp.llama_model_meta_val_str(model.ptr, b"general.architecture", buf, 64) > 0 else ""
    if llama_cpp.llama_model_meta_val_str(model.ptr, f"{arch}.pooling_type".encode(), buf, 64) > 0:
        return int(buf.value.decode())
    return llama_cpp.LLAMA_POOLING_TYPE_NONE


def _bytes_ptr(buf: np.ndarray):
    return buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


class Context:
    """A llama.cpp context created exactly from a plan's ModelParams. `mtp_of`: this is the MTP
    (nextn) draft context of that target context, made from the same model (loaded with its MTP
    layers): it holds only the nextn layers' cache and decodes (token, target hidden state) pairs."""

    def __init__(self, model: Model, p: ModelParams, n_threads: int, mtp_of: Context | None = None) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = p.n_ctx, p.n_batch, p.n_ubatch
        cp.n_seq_max, cp.kv_unified, cp.swa_full, cp.n_rs_seq = p.n_seq_max, p.kv_unified, p.swa_full, p.n_rs_seq
        cp.type_k, cp.type_v = KV_TYPE_IDS[p.type_k], KV_TYPE_IDS[p.type_v]
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if p.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.no_perf = True
        cp.n_outputs_max = p.n_outputs_max
        if p.embeddings:
            cp.embeddings = True
            cp.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN if _pooling_of(model) == llama_cpp.LLAMA_POOLING_TYPE_NONE \
                else llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED  # the GGUF's own pooling, else the mean of the tokens
        if mtp_of is not None:
            cp.ctx_type, cp.ctx_other, cp.n_rs_seq = llama_cpp.LLAMA_CONTEXT_TYPE_MTP, mtp_of.ptr, 0
        self.model = model
        self.params = p
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise SpecdeckError(f"{model.path.name}: llama.cpp could not create a context (n_ctx {p.n_ctx})")
        self.mem = llama_cpp.llama_get_memory(self.ptr)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ptr))
        self.batch = Batch(p.n_batch, p.n_seq_max)
        self.decode_seconds = 0.0  # time inside llama_decode (what is not Python)
        self.decodes = 0
        self.decoding = False  # a llama_decode is running: nothing may free or replace this context's state
        # told every batch this context decoded, right after the decode (an MTP drafter follows the
        # target's hidden states so)
        self.after_decode: Callable[[Batch], None] | None = None

    def _not_decoding(self, what: str) -> None:
        """Nothing frees or replaces a context's state under a decode (a restore, a saved prompt's
        load, a stop): the engine's thread does all of them between its decodes, and a call from
        anywhere else while one runs is refused here rather than left to crash llama.cpp."""
        if self.decoding:
            raise DecodeRunning(f"{self.model.path.name}: {what} while a decode runs")

    def _run(self, what: str, call: Callable[[], int]) -> None:
        """One decode call, timed, with `decoding` set while it runs; DecodeError where it refuses."""
        t = time.perf_counter()
        self.decoding = True
        try:
            rc = call()
        finally:
            self.decoding = False
        self.decode_seconds += time.perf_counter() - t
        self.decodes += 1
        if rc == 2:
            raise DecodeAborted(f"{what} gave way")
        if rc != 0:
            raise DecodeError(f"{what} failed ({rc}): {_DECODE_ERRORS.get(rc, 'unknown error')}")

    @contextlib.contextmanager
    def giving_way(self, ask: Callable[[], bool] | None) -> Iterator[None]:
        """Decodes within may stop part way, where `ask()` says so (DecodeAborted): llama.cpp asks its
        abort callback between the graph's nodes, so a decode of seconds gives way within
        milliseconds. `None`: they run to the end. (The callback re-enters Python at each node: it is
        set only for the decodes that may give way.)"""
        if ask is None:
            yield
            return

        def abort(_data) -> bool:
            try:
                return bool(ask())
            except Exception:  # noqa: BLE001 - never raise into llama.cpp: the decode goes on
                return False

        callback = llama_cpp.ggml_abort_callback(abort)
        llama_cpp.llama_set_abort_callback(self.ptr, callback, None)
        try:
            yield
        finally:
            llama_cpp.llama_set_abort_callback(self.ptr, llama_cpp.ggml_abort_callback(0), None)

    def _within_outputs(self, n_out: int) -> None:
        """A batch may ask for at most the context's n_outputs_max logits rows: llama.cpp aborts the
        process on more (its compute buffer was sized for that many). Refused here instead."""
        cap = self.params.n_outputs_max
        if cap and n_out > cap:
            raise DecodeError(f"a batch asks for {n_out} logits rows; this context was made for at most {cap} "
                              "(its plan's n_outputs_max)")

    def decode(self, batch: Batch) -> None:
        self._within_outputs(batch.n_out)
        self._run("llama_decode", lambda: llama_cpp.llama_decode(self.ptr, batch.raw))
        if self.after_decode is not None:
            self.after_decode(batch)

    def emit_hidden(self, masked: bool) -> None:
        """Keep hidden states from now on (an MTP head's input), see nextn.emit_hidden."""
        nextn.emit_hidden(self.ptr, masked)

    def decode_rows(self, rows: np.ndarray, pos: int, seq: int, logits_last: bool, non_causal: bool = False,
                    sections: np.ndarray | None = None) -> int:
        """Decode embedding rows (an image's, from its projector) at positions pos, pos + 1, ...;
        `non_causal`: the rows attend to each other both ways (Gemma 3's images); `sections`: an
        M-RoPE model's (4, n) positions. Returns the last row's batch index. Whoever follows this
        context's decodes is told, as for tokens."""
        batch = RowBatch(rows, pos, seq, logits_last, sections)
        n = len(batch)
        try:
            self._within_outputs(batch.n_out)
            if non_causal:
                llama_cpp.llama_set_causal_attn(self.ptr, False)
            try:
                self._run("llama_decode (image rows)", lambda: llama_cpp.llama_decode(self.ptr, batch.raw))
            finally:
                if non_causal:
                    llama_cpp.llama_set_causal_attn(self.ptr, True)
            if self.after_decode is not None:
                self.after_decode(batch)
        finally:
            batch.close()
        return n - 1

    def process(self, batch: EmbdBatch) -> None:
        """Decode an extended batch (tokens with hidden-state rows: an MTP context's input)."""
        self._within_outputs(batch.n_out)
        self._run("llama_process", lambda: llama_cpp.llama_process(self.ptr, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch.raw))

    def embedding(self, seq: int) -> np.ndarray:
        """The pooled embedding of a sequence after a decode of an embedding context (a copy)."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ptr, seq)
        if not ptr:
            raise SpecdeckError(f"no embedding for sequence {seq} (not an embedding context?)")
        n = int(llama_cpp.llama_model_n_embd(self.model.ptr))
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def logits(self, i: int) -> np.ndarray:
        """The logits at batch position i of the last decode (a view: copy before the next decode)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise SpecdeckError(f"no logits for batch position {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    @property
    def shares_cells(self) -> bool:
        """Can sequences share cells (`seq_cp`)? Only in one unified pool without sliding-window or
        recurrent state, whose per-sequence windows and states do not share cleanly."""
        return self.params.kv_unified and self.model.swa_window <= 0 and not self.model.is_recurrent

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let `dst` share `src`'s cells for positions [p0, p1) (a unified cache copies nothing)."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def save_seq(self, seq: int) -> np.ndarray:
        """A copy of what the cache holds for one sequence (llama.cpp's sequence state, in host
        memory): `load_seq` puts it back on any sequence, in whatever cells are free. (An uninitialised
        numpy buffer: a ctypes array would be zero-filled first, measured 1.3 x the time of the copy.)"""
        size = int(llama_cpp.llama_state_seq_get_size(self.ptr, seq))
        buf = np.empty(size, np.uint8)
        written = int(llama_cpp.llama_state_seq_get_data(self.ptr, _bytes_ptr(buf), size, seq))
        if written != size:
            raise SpecdeckError(f"llama.cpp saved {written:,} of {size:,} bytes of sequence {seq}")
        return buf

    def load_seq(self, seq: int, data: np.ndarray) -> bool:
        """Replace sequence `seq`'s cache with a `save_seq` copy; False (and the sequence empty)
        where llama.cpp refuses it (not enough free cells)."""
        self._not_decoding("a saved prompt's load")
        if int(llama_cpp.llama_state_seq_set_data(self.ptr, _bytes_ptr(data), len(data), seq)) == 0:
            self.seq_rm(seq, 0, -1)
            return False
        return True

    @property
    def needs_checkpoints(self) -> bool:
        """Is part of this context's state impossible to cut back to an earlier length (recurrent
        state, a sliding window's cells), so that only a saved partial state (a checkpoint) lets a
        sequence go back further than its rollback snapshots or its window?"""
        return self.model.is_recurrent or (self.model.swa_window > 0 and not self.params.swa_full)

    def save_partial(self, seq: int) -> np.ndarray:
        """A copy of the part of a sequence's state that cannot be cut back (recurrent state, the
        sliding-window cells), not the whole cache: llama.cpp's PARTIAL_ONLY sequence state."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq, flags))
        buf = np.empty(size, np.uint8)
        written = int(llama_cpp.llama_state_seq_get_data_ext(self.ptr, _bytes_ptr(buf), size, seq, flags))
        if written != size:
            raise SpecdeckError(f"llama.cpp saved {written:,} of {size:,} bytes of sequence {seq}'s partial state")
        return buf

    def load_partial(self, seq: int, data: np.ndarray) -> bool:
        """Put a `save_partial` copy back on its sequence (the rest of the cache stays as it is);
        False where llama.cpp refuses it."""
        self._not_decoding("a checkpoint's restore")
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        return int(llama_cpp.llama_state_seq_set_data_ext(self.ptr, _bytes_ptr(data), len(data), seq, flags)) != 0

    def pos_max(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq))

    def pos_min(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    def synchronize(self) -> None:
        llama_cpp.llama_synchronize(self.ptr)

    def close(self) -> None:
        if self.ptr:
            self._not_decoding("freeing the context")
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
        self.batch.close()

    def __del__(self) -> None:
        self.close()


class _RawBatch:
    """A llama_batch this object owns: its length, and freed once."""

    raw: llama_cpp.llama_batch | None

    def __len__(self) -> int:
        return int(self.raw.n_tokens)

    def close(self) -> None:
        if getattr(self, "raw", None) is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


class RowBatch(_RawBatch):
    """One decode's llama_batch of embedding rows (no token ids) at consecutive positions of one
    sequence. `token(i)` is None: what follows a decode reads a row's token only where it has one."""

    def __init__(self, rows: np.ndarray, pos: int, seq: int, logits_last: bool, sections: np.ndarray | None = None) -> None:
        n, n_embd = rows.shape
        # M-RoPE: (4, n) positions, section-major: a batch made for 4n rows has room for them
        self.raw = llama_cpp.llama_batch_init(n if sections is None else 4 * n, n_embd, 1)
        ctypes.memmove(self.raw.embd, np.ascontiguousarray(rows, dtype=np.float32).ctypes.data, rows.size * 4)
        for i in range(n):
            self.raw.pos[i] = pos + i
            self.raw.n_seq_id[i] = 1
            self.raw.seq_id[i][0] = seq
            self.raw.logits[i] = logits_last and i == n - 1
        self.raw.n_tokens = n
        self.n_out = int(logits_last)
        if sections is not None:
            flat = np.ascontiguousarray(sections, dtype=np.int32).reshape(-1)
            ctypes.memmove(self.raw.pos, flat.ctypes.data, flat.nbytes)

    def token(self, i: int) -> int | None:
        return None


class Batch(_RawBatch):
    """A reusable llama_batch: fill it with (token, position, sequence, wants-logits) rows."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, max(1, n_seq_max))
        self.n_out = 0

    def clear(self) -> None:
        self.raw.n_tokens = 0
        self.n_out = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its batch position (what `Context.logits` takes)."""
        i = self.raw.n_tokens
        if i >= self.capacity:
            raise SpecdeckError(f"batch over capacity ({self.capacity})")
        self.raw.token[i] = token
        self.raw.pos[i] = pos
        self.raw.n_seq_id[i] = 1
        self.raw.seq_id[i][0] = seq
        self.raw.logits[i] = logits
        self.raw.n_tokens = i + 1
        self.n_out += int(logits)
        return i

    def token(self, i: int) -> int | None:
        return int(self.raw.token[i])

