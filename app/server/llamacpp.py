"""llama-server's own surface, translated onto the server core: `/completion` (and `/completions`),
`/infill` with the budgets editor plugins send, `/tokenize`, `/detokenize`, `/apply-template`,
`/props` and `/slots`, plus the OpenAI routes without their `/v1` prefix, as llama-server serves
them. Field names and answer shapes are llama-server's (tools/server/README.md), so llama.vscode,
llama.vim, Continue's llama.cpp provider and scripts written for llama-server work unchanged."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field

from app import __version__
from app.chat.stream import TextDelta
from app.engine.sampling import check_grammar
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.server.answer import SSE_KEEP_ALIVE, Answer, Failure, Final, Idle
from app.server.core import (
    STREAM_HEADERS,
    Progress,
    Service,
    check_vocab,
    fim_tokens,
    prompt_progress,
    require_ready,
    stopping_error,
    submit,
    timings,
)
from app.server.conversation import image_limits, pictures
from app.server.errors import ApiError
from app.server.images import from_base64
from app.server.metrics import Metrics
from app.server.schemas import ChatMessage, Sampling, StrictBody
from app.server.settings import ServeSettings
from app.server.structured import json_grammar

STOP_TYPES = {"stop": "eos", "length": "limit", "context": "limit", "time_limit": "limit", "cancelled": "none",
              "error": "none", "shutdown": "none"}


class NativeSampling(Sampling):
    """llama-server's request fields on top of the common ones."""
    temperature: float = Field(0.8, ge=0.0, le=2.0)  # llama-server's defaults
    top_k: int = Field(40, ge=0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    n_probs: int = Field(0, ge=0, le=20)
    cache_prompt: bool = True  # the prompt cache is always kept: accepted for compatibility
    return_tokens: bool = False
    json_schema: dict[str, Any] | None = None
    t_max_predict_ms: int = Field(0, ge=0, description="after this long generating, stop at the next new line")
    t_max_prompt_ms: int = Field(0, ge=0, description="accepted; the prompt is always evaluated whole (as llama-server)")
    id_slot: int = -1


class MultimodalPrompt(StrictBody):
    """llama-server's prompt with images: the text, with one `<__media__>` marker per image, and the
    images as base64 in the same order."""

    prompt_string: str
    multimodal_data: list[str] = []


class CompletionBody(NativeSampling):
    prompt: str | list[int | str] | MultimodalPrompt = ""


class InfillExtra(StrictBody):
    filename: str
    text: str


class InfillBody(NativeSampling):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] = []
    prompt: str = ""
    temperature: float = Field(0.0, ge=0.0, le=2.0)


class TokenizeBody(StrictBody):
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(StrictBody):
    tokens: list[int] = []


class TemplateBody(StrictBody):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True


def add_llamacpp_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/completion")
    @app.post("/completions")
    async def completion(body: CompletionBody, request: Request):
        require_ready(service)
        if isinstance(body.prompt, MultimodalPrompt):
            ids, pics = await _multimodal_tokens(service, settings, body.prompt)
            return await _native(request, service, settings, metrics, body, ids, pics)
        ids = _prompt_tokens(service.tokenizer, body.prompt)
        return await _native(request, service, settings, metrics, body, ids)

    @app.post("/infill")
    async def infill(body: InfillBody, request: Request):
        require_ready(service)
        ids = fim_tokens(service.tokenizer, body.input_prefix + body.prompt, body.input_suffix, body.input_extra)
        return await _native(request, service, settings, metrics, body, ids)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody):
        require_ready(service)
        tok = service.tokenizer
        ids = tok.encode(body.content, add_special=body.add_special, parse_special=body.parse_special)
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(tok, t)} for t in ids]}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody):
        require_ready(service)
        tok = service.tokenizer
        check_vocab(body.tokens, tok.model.n_vocab, "tokens")
        return {"content": tok.decode(body.tokens)}

    @app.post("/apply-template")
    async def apply_template(body: TemplateBody):
        require_ready(service)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            return {"prompt": service.tokenizer.render_chat(messages, generation_prompt=body.add_generation_prompt)}
        except SpecdeckError as e:
            raise ApiError(400, e.message, param="messages") from None
        except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
            raise ApiError(400, f"cannot render these messages with the model's chat template: {e}") from None

    @app.get("/props")
    async def props():
        require_ready(service)
        return _props(service, settings)

    @app.get("/slots")
    async def slots():
        if not settings.slots_endpoint:
            return JSONResponse({"error": {"code": 501, "message": "This server does not support the slots endpoint: "
                                           "start it with --slots", "type": "not_supported_error"}}, 501)
        require_ready(service)
        return _slots(service)


# -- helpers -----------------------------------------------------------------------------------

def _piece(tok: Tokenizer, t: int) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (as llama-server answers)."""
    b = tok.piece_bytes(t, special=True)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


async def _multimodal_tokens(service: Service, settings: ServeSettings, prompt: MultimodalPrompt) -> tuple[list[int], dict]:
    """The prompt's ids with its images where its markers stand, and the images by key."""
    limits = image_limits(settings)
    images = [from_base64(d, f"prompt.multimodal_data.{i}") for i, d in enumerate(prompt.multimodal_data)]
    got = await pictures(images, limits, service.vision is not None)
    if not got:
        return service.tokenizer.encode(prompt.prompt_string), {}
    marker = service.vision.marker
    if prompt.prompt_string.count(marker) != len(got):
        raise ApiError(400, f"the prompt has {prompt.prompt_string.count(marker)} {marker} marker(s) for {len(got)} "
                            "image(s): one marker where each image goes", param="prompt.prompt_string")
    try:
        ids = service.vision.tokenize(prompt.prompt_string, got, add_special=service.tokenizer.add_bos)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="prompt", code="invalid_image") from None
    return ids, {p.key: p for p in got}


def _prompt_tokens(tok: Tokenizer, prompt: str | list[int | str]) -> list[int]:
    """Text (with BOS, as llama-server adds it), token ids, or a mix of both."""
    if isinstance(prompt, str):
        return tok.encode(prompt)
    ids: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, int):
            check_vocab([part], tok.model.n_vocab, "prompt")
            ids.append(part)
        else:
            ids += tok.encode(part, add_special=i == 0)
    return ids


def _grammar(body: NativeSampling, service: Service) -> str | None:
    if body.grammar and body.json_schema:
        raise ApiError(400, "grammar and json_schema cannot be combined", param="json_schema")
    grammar = body.grammar
    try:
        if body.json_schema is not None:
            grammar = json_grammar(body.json_schema)
        if grammar:
            check_grammar(service.tokenizer.vocab, grammar)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="json_schema" if body.json_schema is not None else "grammar") from None
    return grammar or None


def _probs(tok: Tokenizer, lps: list) -> list[dict]:
    def entry(t: int, lp: float) -> dict:
        b = tok.piece_bytes(t)
        return {"id": t, "token": b.decode("utf-8", errors="replace"), "bytes": list(b), "logprob": lp}

    return [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, lp) for t, lp in x.top]} for x in lps]


class _Budget:
    """t_max_predict_ms: once generation has run this long, stop at the next new line (llama-server's rule)."""

    def __init__(self, ms: int) -> None:
        self.ms, self.t0, self.hit = ms, None, False

    def over(self, delta: str) -> bool:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        if self.ms and "\n" in delta and (time.perf_counter() - self.t0) * 1e3 > self.ms:
            self.hit = True
        return self.hit


def _final(body: NativeSampling, service: Service, final: Final, budget: _Budget, content: str) -> dict:
    rec = final.record
    stop_type = ("word" if final.stopped_by is not None else "limit" if budget.hit
                 else STOP_TYPES.get(rec.finish_reason or "stop", "none"))
    out = {"content": content, "id_slot": 0, "stop": True, "model": service.model_id,
           "tokens_predicted": len(rec.completion), "tokens_evaluated": rec.prompt_tokens,
           "tokens_cached": rec.reused_tokens + len(rec.completion), "truncated": False, "stop_type": stop_type,
           "stopping_word": final.stopped_by or "", "has_new_line": "\n" in content,
           "generation_settings": _generation_settings(body, service), "timings": timings(rec),
           "tokens": rec.completion if body.return_tokens else []}
    if body.n_probs:
        out["completion_probabilities"] = _probs(service.tokenizer, rec.logprobs)
    return out


async def _native(request: Request, service: Service, settings: ServeSettings, metrics: Metrics,
                  body: NativeSampling, ids: list[int], pictures: dict | None = None):
    if body.n_probs and body.logprobs is None:
        body = body.model_copy(update={"logprobs": body.n_probs})
    job = submit(service, settings, metrics, body, ids, _grammar(body, service),
                 quiet=False if body.t_max_predict_ms else None, pictures=pictures)
    answer, budget = Answer(service, job, body.stops(), every_step=True), _Budget(body.t_max_predict_ms)
    if body.stream:
        return StreamingResponse(_stream(request, answer, budget, body, service, settings.keep_alive),
                                 media_type="text/event-stream",
                                 headers=STREAM_HEADERS)
    parts, final = [], None
    async for item in answer.stream(request):
        if isinstance(item, TextDelta):
            parts.append(item.text)
            if budget.over(item.text):
                job.cancel()
        elif isinstance(item, Failure):
            raise item.error()
        elif isinstance(item, Final):
            final = item
    if final is None:
        raise ApiError(499, "client closed the request")
    if final.finish == "abort":
        raise stopping_error()
    return _final(body, service, final, budget, "".join(parts))


async def _stream(request: Request, answer: Answer, budget: _Budget, body: NativeSampling,
                  service: Service, keep_alive: float) -> AsyncIterator[bytes]:
    sse = lambda obj: f"data: {json.dumps(obj)}\n\n".encode()  # noqa: E731
    async for item in answer.stream(request, keep_alive):
        if isinstance(item, Idle):
            yield SSE_KEEP_ALIVE
        elif isinstance(item, Progress):  # return_progress: the prompt's evaluation so far
            yield sse({"content": "", "tokens": [], "stop": False, "id_slot": 0, "index": 0, **prompt_progress(item)})
        elif isinstance(item, TextDelta):
            if budget.over(item.text):
                answer.job.cancel()
            chunk = {"content": item.text, "tokens": answer.step_tokens, "stop": False,  # llama-server sends them in every chunk
                     "id_slot": 0, "index": 0}
            if body.n_probs:
                chunk["completion_probabilities"] = _probs(service.tokenizer, answer.take_logprobs())
            yield sse(chunk)
        elif isinstance(item, Failure):
            yield sse({"error": {"code": item.status, "message": item.message, "type": "server_error"}})
            return
        elif isinstance(item, Final):
            final = _final(body, service, item, budget, "")
            final.pop("completion_probabilities", None)
            final["tokens"] = []
            yield sse(final)


def _generation_settings(body: NativeSampling | None, service: Service) -> dict:
    b = body or NativeSampling()
    return {"n_ctx": service.n_ctx, "n_predict": b.budget() if b.budget() is not None else -1,
            "model": service.model_id, "temperature": b.temperature, "top_k": b.top_k, "top_p": b.top_p,
            "min_p": b.min_p, "repeat_penalty": b.repeat_penalty, "presence_penalty": b.presence_penalty,
            "frequency_penalty": b.frequency_penalty, "seed": b.seed if b.seed is not None else -1,
            "stop": b.stops(), "n_probs": b.n_probs, "ignore_eos": b.ignore_eos, "stream": b.stream,
            "grammar": b.grammar or "", "speculative": service.speculative_default,
            "speculative.n_max": service.plan.draft_max}


def _props(service: Service, settings: ServeSettings) -> dict:
    tok = service.tokenizer
    return {"default_generation_settings": {**_generation_settings(None, service), "params": _generation_settings(None, service)},
            "total_slots": len(service.scheduler.engine.slots), "model_alias": service.model_id,
            "model_path": str(service.models.get("target") or ""), "modalities": {"vision": service.vision is not None, "audio": False},
            "endpoint_slots": settings.slots_endpoint, "endpoint_props": True, "endpoint_metrics": True,
            "chat_template": tok.chat_template or "", "chat_template_caps": {"supports_tools": service.supports_tools, "supports_reasoning": service.chat.reasoning is not None},
            "chat_format": service.chat.name,
            "bos_token": tok.piece(tok.bos), "eos_token": tok.piece(tok.eos),
            "build_info": f"specdeck {__version__}", "is_sleeping": False}


def _slots(service: Service) -> list[dict]:
    eng, out = service.scheduler.engine, []
    for s in eng.slots:
        job = service.scheduler.active.get(s.id) or service.scheduler.starting.get(s.id)
        out.append({"id": s.id, "n_ctx": service.n_ctx, "is_processing": job is not None, "id_task": job.id if job else -1,
                    "n_cached": len(s.cached), "n_generated": s.generated if job else 0,
                    "params": _generation_settings(None, service)})
    return out


def add_unprefixed_routes(app: FastAPI) -> None:
    """llama-server also answers the OpenAI routes without `/v1`: the same handlers, other paths."""
    for route in list(app.router.routes):
        path = getattr(route, "path", "")
        if path in ("/v1/chat/completions", "/v1/chat/completions/input_tokens", "/v1/models", "/v1/embeddings",
                    "/v1/responses"):
            app.add_api_route(path[3:], route.endpoint, methods=list(route.methods))

