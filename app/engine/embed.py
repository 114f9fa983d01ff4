"""Embeddings from an optional small embedding model, in its own pooled context (one sequence at a
time, under a lock: the engine's target and draft contexts are never touched)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.gguf.info import ModelInfo
from app.llama.context import Context, Model
from app.llama.params import ModelParams


class InputTooLong(SpecdeckError):
    """An input longer than the embedding context."""


class Embedder:
    def __init__(self, info: ModelInfo, params: ModelParams, threads: int) -> None:
        self.name = Path(info.path).stem
        self.ctx = Context(Model(Path(info.path), params.n_gpu_layers), params, threads)
        self.tokenizer = Tokenizer(self.ctx.model, None)
        self.lock = threading.Lock()

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def tokens(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True, parse_special=False)

    def embed(self, ids: list[int]) -> np.ndarray:
        """The L2-normalised pooled embedding of one input (token ids), as llama-server answers by default."""
        if not ids:
            raise InputTooLong("an input is empty")
        if len(ids) > self.ctx.params.n_ubatch:
            raise InputTooLong(f"an input is {len(ids):,} tokens; the embedding model takes at most "
                               f"{self.ctx.params.n_ubatch:,}")
        with self.lock:
            if self.ctx.ptr is None:  # closed under a request that outlived the server's stop
                raise SpecdeckError("the embedding model is closed: the server is stopping")
            self.ctx.clear()
            b = self.ctx.batch
            b.clear()
            for i, t in enumerate(ids):
                b.add(t, i, 0, True)
            self.ctx.decode(b)
            v = self.ctx.embedding(0)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else v

    def close(self) -> None:
        with self.lock:  # never while an input is being embedded
            self.ctx.close()
            self.ctx.model.close()
