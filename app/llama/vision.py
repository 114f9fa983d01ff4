"""A vision projector (`mmproj-*.gguf`) beside the target, through llama.cpp's libmtmd: the prompt's
text and images as one token list (media ids where images go, app/llama/media.py), and an image's
embedding rows, encoded once and kept by the hash of its pixels."""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from llama_cpp import mtmd_cpp as M

from app.llama import media
from app.llama.media import Picture
from app.errors import SpecdeckError
from app.llama.backend import init_llama
from app.llama.context import Model

CHUNK_TEXT, CHUNK_IMAGE = 0, 1
CACHE_BYTES = 256 << 20  # encoded images kept (a 27B's 1,000-row image is ~20 MiB)


class Projector:
    """An mtmd context made from a projector file for one loaded target."""

    def __init__(self, path: Path, model: Model, n_threads: int, use_gpu: bool = False,
                 cache_bytes: int = CACHE_BYTES) -> None:
        init_llama()
        p = M.mtmd_context_params_default()
        p.use_gpu, p.n_threads, p.print_timings, p.warmup = use_gpu, n_threads, False, True
        self.path = path
        self.ctx = M.mtmd_init_from_file(str(path).encode(), model.ptr, p)
        if not self.ctx:
            raise SpecdeckError(f"{path.name}: llama.cpp could not load this vision projector for {model.path.name}",
                                hint="`specdeck check --mmproj FILE` says whether it fits the model; "
                                     "SPECDECK_LLAMA_LOG=1 shows llama.cpp's own reason")
        if not M.mtmd_support_vision(self.ctx):
            self.close()
            raise SpecdeckError(f"{path.name}: this projector has no vision encoder (an audio projector?)")
        self.n_embd = model.n_embd_inp
        self.marker = (M.mtmd_get_marker(self.ctx) or M.mtmd_default_marker()).decode()
        self.non_causal = False
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_bytes, self._limit = 0, cache_bytes
        self._widths: dict[int, int] = {}  # an image's width in patches (its M-RoPE layout), by key
        self._lock = threading.Lock()  # the server's threads tokenize while the engine's thread encodes
        self.encoded = 0  # images encoded (not taken from the cache)
        self.encode_seconds = 0.0
        self.tokens_per_image = self._probe()

    def _probe(self) -> int:
        """Tokens an image takes at the projector's own size (it resizes to it), and whether its rows
        attend both ways; read from a tokenized blank image."""
        side = 64
        chunks = self._chunks(self.marker, [Picture(side, side, bytes(side * side * 3))], add_special=False)
        try:
            for i in range(M.mtmd_input_chunks_size(chunks)):
                ch = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(ch) == CHUNK_IMAGE:
                    self.non_causal = bool(M.mtmd_decode_use_non_causal(self.ctx, ch))
                    return int(M.mtmd_input_chunk_get_n_tokens(ch))
        finally:
            M.mtmd_input_chunks_free(chunks)
        raise SpecdeckError(f"{self.path.name}: the projector made no image chunk from an image")

    def _chunks(self, text: str, pictures: list[Picture], add_special: bool):
        """mtmd's chunks of `text`, whose markers stand for `pictures` in order."""
        bitmaps = []
        for pic in pictures:
            buf = (ctypes.c_ubyte * len(pic.rgb)).from_buffer_copy(pic.rgb)
            bmp = M.mtmd_bitmap_init(pic.width, pic.height, buf)
            if not bmp:
                raise SpecdeckError(f"llama.cpp could not take an image of {pic.width}x{pic.height}")
            bitmaps.append(bmp)
        raw = text.encode()
        keep = ctypes.create_string_buffer(raw)
        inp = M.mtmd_input_text()
        inp.text, inp.text_len = ctypes.cast(keep, ctypes.c_char_p), len(raw)
        inp.add_special, inp.parse_special = add_special, True
        chunks = M.mtmd_input_chunks_init()
        arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        try:
            with self._lock:
                rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
        finally:
            for bmp in bitmaps:
                M.mtmd_bitmap_free(bmp)
        if rc != 0:
            M.mtmd_input_chunks_free(chunks)
            what = {1: "the prompt's image markers and its images do not match in number",
                    2: "the projector could not preprocess an image"}.get(rc, f"error {rc}")
            raise SpecdeckError(f"llama.cpp could not read the images: {what}")
        return chunks

    def tokenize(self, text: str, pictures: list[Picture], add_special: bool) -> list[int]:
        """The prompt's ids: text tokens, and each image's media ids (as many as it takes), around
        the begin/end tokens the model's projector wraps images in."""
        chunks = self._chunks(text, pictures, add_special)
        out: list[int] = []
        images = iter(pictures)
        try:
            for i in range(M.mtmd_input_chunks_size(chunks)):
                ch = M.mtmd_input_chunks_get(chunks, i)
                n = int(M.mtmd_input_chunk_get_n_tokens(ch))
                if M.mtmd_input_chunk_get_type(ch) == CHUNK_TEXT:
                    n_out = ctypes.c_size_t()
                    ptr = M.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(n_out))
                    out += [int(ptr[j]) for j in range(n_out.value)]
                else:
                    key = next(images).key
                    self._widths[key] = int(M.mtmd_image_tokens_get_nx(M.mtmd_input_chunk_get_tokens_image(ch)))
                    out += media.image_tokens(key, n)
        finally:
            M.mtmd_input_chunks_free(chunks)
        return out

    def width(self, picture: Picture) -> int:
        """The image's width in patches, as tokenized (the column of a row in M-RoPE positions)."""
        key = picture.key
        if key not in self._widths:
            self.tokenize(self.marker, [picture], add_special=False)
        return max(1, self._widths[key])

    def rows(self, picture: Picture) -> np.ndarray:
        """The image's embedding rows (n_tokens x n_embd): from the cache, or encoded now."""
        key = picture.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        out = self._encode(picture)
        with self._lock:
            self._cache[key] = out
            self._cache_bytes += out.nbytes
            while self._cache_bytes > self._limit and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.nbytes
        return out

    def forget_images(self) -> None:
        """Empty the cache of encoded images (the next use of each encodes it again)."""
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0

    def _encode(self, picture: Picture) -> np.ndarray:
        chunks = self._chunks(self.marker, [picture], add_special=False)
        t = time.perf_counter()
        try:
            for i in range(M.mtmd_input_chunks_size(chunks)):
                ch = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(ch) != CHUNK_IMAGE:
                    continue
                n = int(M.mtmd_input_chunk_get_n_tokens(ch))
                with self._lock:
                    if M.mtmd_encode_chunk(self.ctx, ch) != 0:
                        raise SpecdeckError("llama.cpp could not encode an image")
                    ptr = M.mtmd_get_output_embd(self.ctx)
                    out = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).copy().reshape(n, self.n_embd)
                self.encoded += 1
                self.encode_seconds += time.perf_counter() - t
                return out
        finally:
            M.mtmd_input_chunks_free(chunks)
        raise SpecdeckError("the projector made no image chunk")

    def close(self) -> None:
        if getattr(self, "ctx", None):
            M.mtmd_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()
