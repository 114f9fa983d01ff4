"""Ollama's API over the same engine, limits, auth and metrics as the OpenAI routes:
POST /api/chat, POST /api/generate (newline-delimited JSON streaming, or `"stream": false`),
GET /api/tags, POST /api/show, GET /api/version. Field names, defaults and error shapes
(`{"error": "..."}`) follow Ollama's API documentation (docs/api.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from app.chat.format import Call
from app.chat.stream import CallEnd, ChatStream, ReasoningDelta, TextDelta
from app.engine.records import RequestRecord
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.llama.media import text_only
from app.server.answer import Answer, Failure, Final, chat_prompt
from app.server.conversation import Chat, Message, image_limits, pictures
from app.server.core import (
    STREAM_HEADERS,
    Service,
    fim_tokens,
    require_ready,
    submit,
)
from app.server.errors import ApiError
from app.server.images import from_base64
from app.server.metrics import Metrics
from app.server.schemas import Sampling, StrictBody, Tool
from app.server.settings import ServeSettings
from app.server.structured import json_grammar

API_VERSION = "0.12.0"  # the Ollama API level these routes follow (clients check it for features)

# Ollama's defaults where a request leaves an option out (docs/modelfile.md, "PARAMETER")
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1}


class Options(StrictBody):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, ge=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    num_predict: int | None = Field(None, ge=-2)
    stop: str | list[str] | None = None
    num_ctx: int | None = Field(None, ge=1)  # the server's context is fixed by its plan: accepted, not applied


class GenerateRequest(StrictBody):
    model: str
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    context: list[int] | None = None
    stream: bool = True
    raw: bool = False
    format: Literal["json"] | dict[str, Any] | None = None
    options: Options | None = None
    images: list[str] | None = None
    keep_alive: str | int | None = None
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    think: bool | Literal["high", "medium", "low"] | None = None


class ToolCallFunction(StrictBody):
    name: str
    arguments: dict[str, Any] = {}


class ToolCallIn(StrictBody):
    function: ToolCallFunction


class OllamaMessage(StrictBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # an earlier answer's reasoning, sent back


class ChatRequest(StrictBody):
    model: str
    messages: list[OllamaMessage] = []
    tools: list[Tool] | None = None
    format: Literal["json"] | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: str | int | None = None
    think: bool | Literal["high", "medium", "low"] | None = None  # the template's thinking switch (levels: on)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)


class ShowRequest(StrictBody):
    model: str | None = None
    name: str | None = None  # the older field name
    verbose: bool = False


def add_ollama_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/api/show")
    async def show(body: ShowRequest):
        d = service.details
        arch = d.get("architecture", "")
        caps = ["completion"] + (["vision"] if service.vision is not None else [])
        if service.tokenizer is not None and service.supports_tools:
            caps.append("tools")
        if service.tokenizer is not None and _has_fim(service):
            caps.append("insert")
        return {"modelfile": "", "parameters": "", "template": d.get("chat_template") or "",
                "details": _details(service), "capabilities": caps,
                "model_info": {"general.name": service.model_id, "general.architecture": arch, "general.parameter_count": d.get("n_params"),
                               f"{arch}.context_length": d.get("context_length"),
                               f"{arch}.block_count": d.get("n_layers"), f"{arch}.embedding_length": d.get("n_embd"),
                               f"{arch}.attention.head_count": d.get("n_head")},
                "modified_at": _iso(d.get("mtime", 0.0)), "digest": service.digests.get("target") or ""}

    @app.post("/api/generate")
    async def generate(body: GenerateRequest, request: Request):
        if not body.prompt and body.suffix is None and not body.images:  # Ollama: an empty prompt only loads the model
            require_ready(service)
            return {"model": service.model_id, "created_at": _now(), "response": "", "done": True, "done_reason": "load"}
        require_ready(service)
        sampling = _sampling(body.options, body.stream, body.logprobs, body.top_logprobs)
        ids, chat, pics = await _generate_tokens(service, settings, body, sampling)
        grammar = _format_grammar(body.format)
        job = submit(service, settings, metrics, sampling, ids, grammar, pictures=pics)
        answer = Answer(service, job, sampling.stops(), chat)

        def final(f: Final) -> dict:
            return {"model": service.model_id, "created_at": _now(), "response": "", "done": True, "done_reason": _done_reason(f),
                    "context": text_only(ids) + f.record.completion, **_durations(f.record)}

        def chunk(kind: str, value) -> dict:
            out = {"model": service.model_id, "created_at": _now(), "response": value if kind == "content" else "", "done": False}
            if kind == "thinking":
                out["thinking"] = value
            return out

        if body.stream:
            return _ndjson(_stream(request, answer, chunk, final, service.tokenizer if body.logprobs else None))
        f = await answer.whole(request)
        out = final(f)
        out["response"] = f.parsed.content
        if f.parsed.reasoning:
            out["thinking"] = f.parsed.reasoning
        if body.logprobs:
            out["logprobs"] = _logprobs(service.tokenizer, f.record.logprobs)
        return out

    @app.post("/api/chat")
    async def chat(body: ChatRequest, request: Request):
        if not body.messages:  # Ollama: no messages only loads the model
            require_ready(service)
            return {"model": service.model_id, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done": True, "done_reason": "load"}
        require_ready(service)
        if body.tools and not service.supports_tools:
            raise ApiError(400, f"{service.model_id} does not support tools")
        sampling = _sampling(body.options, body.stream, body.logprobs, body.top_logprobs)
        prompt = await chat_prompt(service, settings, Chat(
            [_message(m, f"messages.{i}") for i, m in enumerate(body.messages)], sampling,
            tools=[t.function.model_dump(exclude_none=True) for t in body.tools or []], thinking=_think(body.think)))
        format_grammar = _format_grammar(body.format)
        grammar, triggers = (format_grammar, ()) if format_grammar is not None else (prompt.grammar, prompt.triggers)
        job = submit(service, settings, metrics, sampling, prompt.ids, grammar, triggers=triggers, pictures=prompt.pictures)
        answer = Answer(service, job, sampling.stops(), prompt.stream(service))

        def final(f: Final) -> dict:
            return {"model": service.model_id, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done": True, "done_reason": _done_reason(f), **_durations(f.record)}

        def chunk(kind: str, value) -> dict:
            message: dict = {"role": "assistant", "content": value if kind == "content" else ""}
            if kind == "thinking":
                message["thinking"] = value
            elif kind == "call":
                message["tool_calls"] = [_ollama_call(value)]
            return {"model": service.model_id, "created_at": _now(), "message": message, "done": False}

        if body.stream:
            return _ndjson(_stream(request, answer, chunk, final, service.tokenizer if body.logprobs else None))
        f = await answer.whole(request)
        out = final(f)
        out["message"]["content"] = f.parsed.content
        if f.parsed.reasoning:
            out["message"]["thinking"] = f.parsed.reasoning
        if f.parsed.calls:
            out["message"]["tool_calls"] = [_ollama_call(c) for c in f.parsed.calls]
        if body.logprobs:
            out["logprobs"] = _logprobs(service.tokenizer, f.record.logprobs)
        return out


# -- helpers --------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _params_label(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _details(service: Service) -> dict:
    d = service.details
    arch = d.get("architecture", "")
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else [],
            "parameter_size": _params_label(d.get("n_params")), "quantization_level": d.get("file_type") or ""}


def model_entry(service: Service) -> dict:
    """A model as Ollama's /api/tags lists it (from its GGUF header)."""
    d = service.details
    return {"name": service.model_id, "model": service.model_id, "modified_at": _iso(d.get("mtime", 0.0)),
            "size": d.get("size", 0), "digest": service.digests.get("target") or "",
            "details": _details(service)}


def _has_fim(service: Service) -> bool:
    import llama_cpp

    v = service.tokenizer.vocab
    return min(int(llama_cpp.llama_vocab_fim_pre(v)), int(llama_cpp.llama_vocab_fim_suf(v)),
               int(llama_cpp.llama_vocab_fim_mid(v))) >= 0


def _sampling(options: Options | None, stream: bool, logprobs: bool = False, top: int = 0) -> Sampling:
    """Ollama's options as the OpenAI routes' sampling body (Ollama's defaults where left out)."""
    o = options or Options()
    pick = lambda name: getattr(o, name) if getattr(o, name) is not None else DEFAULTS[name]  # noqa: E731
    n = o.num_predict
    return Sampling(max_tokens=n if n is not None and n > 0 else None, temperature=pick("temperature"),
                    top_k=pick("top_k"), top_p=pick("top_p"), min_p=pick("min_p"), repeat_penalty=pick("repeat_penalty"),
                    presence_penalty=o.presence_penalty or 0.0, frequency_penalty=o.frequency_penalty or 0.0,
                    seed=o.seed, stop=o.stop, stream=stream, logprobs=logprobs or None, top_logprobs=top)


def _format_grammar(fmt: str | dict | None) -> str | None:
    if fmt is None:
        return None
    try:
        return json_grammar(None if fmt == "json" else fmt)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="format") from None


def _think(value: bool | str | None) -> bool | None:
    """Ollama's `think`: true or a level ("high", "medium", "low") is on, false off, absent the template's."""
    return None if value is None else value is not False


def _ollama_call(call: Call) -> dict:
    return {"function": {"name": call.name, "arguments": call.arguments}}


def _done_reason(f: Final) -> str:
    """Ollama's done_reason: stop (a call too), length, or abort (the server stopped)."""
    return "stop" if f.finish == "tool_calls" else f.finish


async def _generate_tokens(service: Service, settings: ServeSettings, body: GenerateRequest,
                           sampling: Sampling) -> tuple[list[int], ChatStream | None, dict]:
    """The prompt's ids, the chat format's parser when the prompt went through the template, and the
    images by key (each before the prompt's text, as one user message)."""
    tok, chat, pics = service.tokenizer, None, {}
    images = [from_base64(img, f"images.{i}") for i, img in enumerate(body.images or [])]
    if body.suffix is not None:
        if images:
            raise ApiError(400, "images cannot go with suffix (fill-in-the-middle)", param="images")
        ids = fim_tokens(tok, body.prompt, body.suffix, [])
    elif body.raw or not tok.chat_template:
        if images:  # the raw prompt after the images' markers
            got = await pictures(images, image_limits(settings), service.vision is not None)
            text = service.vision.marker * len(got) + body.prompt
            ids = service.vision.tokenize(text, got, add_special=tok.add_bos and not body.context)
            pics = {p.key: p for p in got}
        else:
            ids = tok.encode(body.prompt, add_special=not body.context)
    else:
        messages = ([Message("system", [body.system])] if body.system else []) + [Message("user", [*images, body.prompt])]
        prompt = await chat_prompt(service, settings, Chat(messages, sampling, thinking=_think(body.think)))
        ids, pics = prompt.ids, prompt.pictures
        chat = ChatStream(service.chat, None, prompt.started)
        if body.context and ids and tok.add_bos and ids[0] == tok.bos:
            ids = ids[1:]
    if body.context:
        bad = [t for t in body.context if not 0 <= t < tok.model.n_vocab]
        if bad:
            raise ApiError(400, f"context token {bad[0]} is outside the vocabulary")
        ids = list(body.context) + ids
    if len(ids) >= service.n_ctx:
        raise ApiError(400, f"the prompt is {len(ids):,} tokens; this server's context is {service.n_ctx:,} tokens")
    return ids, chat, pics


def _message(m: OllamaMessage, where: str) -> Message:
    """An Ollama message: its images (base64) before its text."""
    images = [from_base64(img, f"{where}.images.{i}") for i, img in enumerate(m.images or [])]  # checked once it is known to see
    calls = [{"type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in m.tool_calls] if m.tool_calls else None
    return Message(m.role, [*images, m.content], name=m.tool_name, reasoning=m.thinking, tool_calls=calls)


def _durations(rec: RequestRecord) -> dict:
    ns = lambda s: int(s * 1e9)  # noqa: E731
    return {"total_duration": ns(rec.t_prompt + rec.t_generate), "load_duration": 0,
            "prompt_eval_count": rec.prompt_tokens - rec.reused_tokens, "prompt_eval_duration": ns(rec.t_prompt),
            "eval_count": len(rec.completion), "eval_duration": ns(rec.t_generate)}


def _ndjson(lines: AsyncIterator[dict]) -> StreamingResponse:
    async def body():
        async for obj in lines:
            yield (json.dumps(obj) + "\n").encode()

    return StreamingResponse(body(), media_type="application/x-ndjson", headers=STREAM_HEADERS)


def _logprobs(tok: Tokenizer, lps: list) -> list[dict]:
    """Ollama's logprobs: token, logprob, bytes and top_logprobs per generated token."""
    def entry(t: int, lp: float) -> dict:
        b = tok.piece_bytes(t)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    return [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, lp) for t, lp in x.top]} for x in lps]


async def _stream(request: Request, answer: Answer, chunk: Callable[[str, object], dict],
                  final: Callable[[Final], dict], lp_tok: Tokenizer | None = None) -> AsyncIterator[dict]:
    async for item in answer.stream(request):
        if isinstance(item, TextDelta):
            obj = chunk("content", item.text)
            if lp_tok is not None:
                obj["logprobs"] = _logprobs(lp_tok, answer.take_logprobs())
            yield obj
        elif isinstance(item, ReasoningDelta):
            yield chunk("thinking", item.text)
        elif isinstance(item, CallEnd):
            yield chunk("call", item.call)
        elif isinstance(item, Failure):
            yield {"error": item.message}
            return
        elif isinstance(item, Final):
            last = final(item)
            pending = answer.take_logprobs()
            if lp_tok is not None and pending:
                last["logprobs"] = _logprobs(lp_tok, pending)
            yield last
