"""Embeddings: OpenAI's `POST /v1/embeddings` and Ollama's `POST /api/embed`, from the optional
embedding model (`--embedding-model`, or the preset's). Without one, both answer 501 naming the
flag, as llama-server answers when started without `--embeddings`."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from fastapi import FastAPI
from pydantic import Field

from app.engine.embed import Embedder, InputTooLong
from app.server.core import Service, check_vocab, require_ready
from app.server.errors import ApiError
from app.server.metrics import Metrics
from app.server.schemas import StrictBody
from app.server.settings import ServeSettings

MAX_INPUTS = 256


class EmbeddingRequest(StrictBody):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    dimensions: int | None = Field(None, ge=1)


class OllamaEmbedRequest(StrictBody):
    model: str
    input: str | list[str] = ""
    truncate: bool = True


def add_embedding_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        emb = _embedder(service)
        inputs = _inputs(body.input, emb)
        vectors = await asyncio.to_thread(_embed_all, emb, inputs)
        if body.dimensions is not None:
            vectors = [_shorten(v, body.dimensions) for v in vectors]
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        n = sum(len(x) for x in inputs)
        return {"object": "list", "data": data, "model": emb.name, "usage": {"prompt_tokens": n, "total_tokens": n}}

    @app.post("/api/embed")
    async def ollama_embed(body: OllamaEmbedRequest):
        emb = _embedder(service)
        texts = [body.input] if isinstance(body.input, str) else body.input
        inputs = [_fit(emb.tokens(t), emb, body.truncate) for t in texts]
        t0 = time.perf_counter()
        vectors = await asyncio.to_thread(_embed_all, emb, inputs)
        return {"model": body.model, "embeddings": [v.tolist() for v in vectors],
                "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                "prompt_eval_count": sum(len(x) for x in inputs)}


def _embedder(service: Service) -> Embedder:
    require_ready(service)
    if service.embedder is None:
        raise ApiError(501, "no embedding model is loaded: start the server with --embedding-model MODEL "
                            "(or a preset that names one)", "not_supported_error", param="model")
    return service.embedder


def _inputs(given, emb: Embedder) -> list[list[int]]:
    """Text, a list of texts, token ids, or a list of token-id lists: token ids for each input."""
    if isinstance(given, str):
        items = [emb.tokens(given)]
    elif given and all(isinstance(x, int) for x in given):
        items = [list(given)]
    elif given and all(isinstance(x, list) for x in given):
        items = [list(x) for x in given]
    else:
        items = [emb.tokens(t) for t in given]
    if not items or len(items) > MAX_INPUTS:
        raise ApiError(400, f"input must hold 1 to {MAX_INPUTS} items", param="input")
    for ids in items:
        check_vocab(ids, emb.tokenizer.model.n_vocab, "input")
        _fit(ids, emb, truncate=False)
    return items


def _fit(ids: list[int], emb: Embedder, truncate: bool) -> list[int]:
    limit = emb.ctx.params.n_ubatch
    if not ids:
        raise ApiError(400, "an input is empty", param="input")
    if len(ids) > limit:
        if truncate:
            return ids[:limit]
        raise ApiError(400, f"an input is {len(ids):,} tokens; the embedding model takes at most {limit:,}", param="input")
    return ids


def _embed_all(emb: Embedder, inputs: list[list[int]]) -> list[np.ndarray]:
    try:
        return [emb.embed(ids) for ids in inputs]
    except InputTooLong as e:
        raise ApiError(400, e.message, param="input") from None


def _shorten(v: np.ndarray, n: int) -> np.ndarray:
    """OpenAI's `dimensions`: the first n components, renormalised (Matryoshka-style)."""
    v = v[:n]
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def _encode(v: np.ndarray, fmt: str):
    return base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()
