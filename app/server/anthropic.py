"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), translated onto the
server core: Claude Code and other agents that speak it run on the same engine, queue, prompt
cache, limits and speculation as the OpenAI routes.

Content blocks become the chat template's messages: text, `tool_use` (an assistant's tool calls)
and `tool_result` (a tool message). Harmless extras are ignored (`cache_control`, `metadata`,
`thinking` on a template without a thinking mode, `thinking` blocks in the history, server-side
tools the model cannot run); what cannot be honoured is a 400 in Anthropic's envelope (images and
documents on this text-only model, a tool_choice naming a tool that is not offered)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from app.engine.records import RequestRecord, StepRecord
from app.errors import SpecdeckError
from app.server.core import (
    STREAM_HEADERS,
    Service,
    chat_ids,
    check_model,
    collect,
    events,
    refuse_images,
    require_ready,
    stopping_error,
    submit,
)
from app.server.errors import ApiError, shaped
from app.server.metrics import Metrics
from app.server.scheduler import Done, Failed, Job
from app.server.schemas import Sampling, StrictBody
from app.server.settings import ServeSettings
from app.server.structured import (
    ToolCallHold,
    json_grammar,
    parse_tool_calls,
    tool_call_grammar,
)
from app.server.textstream import TextStream

IGNORED_BLOCKS = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result",
                  "web_fetch_tool_result", "code_execution_tool_result", "mcp_tool_use", "mcp_tool_result"}
UNREADABLE_BLOCKS = {"image", "document"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "context": "max_tokens", "time_limit": "max_tokens",
                "cancelled": "end_turn", "error": "end_turn"}


class Message(StrictBody):
    role: Literal["user", "assistant", "system"]  # Claude Code sends system messages between the turns
    content: str | list[dict[str, Any]]


class Tool(StrictBody):
    name: str = Field(min_length=1, max_length=128)
    type: str | None = None  # "custom" or absent for the agent's own tools; e.g. "web_search_20250305" for server tools
    description: str | None = None
    input_schema: dict[str, Any] | None = None

    @property
    def is_server_tool(self) -> bool:
        return self.input_schema is None and self.type not in (None, "custom")


class ToolChoice(StrictBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountRequest(StrictBody):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema": ...}}: by grammar


def add_anthropic_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        require_ready(service)
        sampling = _sampling(body, service.n_ctx)
        check_model(sampling, service, settings)
        tools = _tools(body, service)
        ids = chat_ids(service, _chat_messages(body), tools, _thinking(body))
        grammar = _forced_grammar(body, tools)
        try:
            job = submit(service, settings, metrics, sampling, ids, grammar)
        except ApiError as e:
            if e.status == 429:  # the queue is full: Anthropic's "overloaded", which its SDKs retry
                raise ApiError(529, e.message, headers=e.headers) from None
            raise
        text = TextStream(lambda t: service.tokenizer.piece_bytes(t), sampling.stops())
        names = {t["name"] for t in tools}
        if body.stream:
            return StreamingResponse(_stream(request, job, text, service, names, len(ids)),
                                     media_type="text/event-stream", headers=STREAM_HEADERS)
        content, rec = await collect(request, job, text)
        blocks, stop = _blocks(content, names, bool(tools))
        return {"id": "msg_" + job.id, "type": "message", "role": "assistant", "model": service.model_id,
                "content": blocks, "stop_reason": stop or _stop_reason(text, rec),
                "stop_sequence": text.stopped_by, "usage": _usage(rec)}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountRequest):
        require_ready(service)
        tools = _tools(body, service)
        return {"input_tokens": len(chat_ids(service, _chat_messages(body), tools, _thinking(body)))}


# -- request -----------------------------------------------------------------------------------

def _sampling(body: MessagesRequest, n_ctx: int) -> Sampling:
    """max_tokens is a cap (Claude Code asks 32,000 of any model): what fits the context is generated."""
    return Sampling(model=body.model, max_tokens=min(body.max_tokens, n_ctx), temperature=body.temperature,
                    top_p=body.top_p or 1.0, top_k=body.top_k or 0, stop=body.stop_sequences, stream=body.stream)


def _thinking(body: CountRequest) -> bool | None:
    """`thinking` {"type": "enabled" | "disabled"}: the template's thinking mode, where it has one."""
    kind = (body.thinking or {}).get("type")
    return {"enabled": True, "disabled": False}.get(kind) if isinstance(kind, str) else None


def _text_of(blocks: str | list[dict], where: str) -> str:
    """The text of a string or a list of blocks (a system prompt, a tool result)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind in UNREADABLE_BLOCKS:
            raise refuse_images(where)
        elif kind not in IGNORED_BLOCKS:
            raise ApiError(400, f"{where}: content block type {kind!r} is not supported here", param=where)
    return "\n".join(parts) if where == "system" else "".join(parts)


def _chat_messages(body: CountRequest) -> list[dict]:
    """Anthropic's system prompt and messages as the chat template's messages."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, m in enumerate(body.messages):
        out += _one_message(m, f"messages.{i}")
    return out


def _one_message(m: Message, where: str) -> list[dict]:
    if m.role == "system":
        return [{"role": "system", "content": _text_of(m.content, where)}]
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts: list[str] = []
    calls: list[dict] = []
    results: list[dict] = []
    for j, b in enumerate(m.content):
        kind = b.get("type") if isinstance(b, dict) else None
        at = f"{where}.content.{j}"
        if kind == "text":
            texts.append(str(b.get("text", "")))
        elif kind == "tool_use" and m.role == "assistant":
            args = b.get("input") if isinstance(b.get("input"), dict) else {}
            calls.append({"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": args}})
        elif kind == "tool_result" and m.role == "user":
            content = b.get("content", "")
            text = _text_of(content if isinstance(content, (str, list)) else str(content), at)
            if b.get("is_error"):
                text = "Error: " + text
            results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
        elif kind in UNREADABLE_BLOCKS:
            raise refuse_images(at)
        elif kind in IGNORED_BLOCKS:
            continue
        else:
            raise ApiError(400, f"{at}: content block type {kind!r} is not supported in a {m.role} message", param=at)
    if m.role == "assistant":
        msg: dict = {"role": "assistant", "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tools(body: CountRequest, service: Service) -> list[dict]:
    """The agent's tools as function definitions (server tools, which run on Anthropic's side, are
    left out; none at all with tool_choice "none")."""
    choice = body.tool_choice
    own = [t for t in body.tools or [] if not t.is_server_tool]
    if not own or (choice is not None and choice.type == "none"):
        return []
    if not service.tokenizer.supports_tools:
        raise ApiError(400, "this model's chat template has no tool support: send the request without `tools`", param="tools")
    if choice is not None and choice.type == "tool" and choice.name not in {t.name for t in own}:
        raise ApiError(400, f"tool_choice names {choice.name!r}, which is not among the tools", param="tool_choice")
    return [{"name": t.name, "description": t.description or "", "parameters": t.input_schema or {"type": "object"}}
            for t in own]


def _forced_grammar(body: MessagesRequest, tools: list[dict]) -> str | None:
    """tool_choice "any" (one of the tools) or "tool" (that one): the answer is a call; or
    output_config.format json_schema: the answer is JSON valid against it. Both by grammar."""
    fmt = (body.output_config or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        try:
            return json_grammar(fmt.get("schema"))
        except SpecdeckError as e:
            raise ApiError(400, e.message, param="output_config.format") from None
    choice = body.tool_choice
    if not tools or choice is None or choice.type in ("auto", "none"):
        return None
    chosen = tools if choice.type == "any" else [t for t in tools if t["name"] == choice.name]
    return tool_call_grammar(chosen)


# -- answer ------------------------------------------------------------------------------------

def _tool_use_id() -> str:
    return "toolu_" + os.urandom(12).hex()


def _blocks(content: str, names: set[str], with_tools: bool) -> tuple[list[dict], str | None]:
    """The answer's content blocks (text, then tool_use) and "tool_use" when it calls one."""
    text, calls = parse_tool_calls(content, names) if with_tools else (content, [])
    blocks = [{"type": "text", "text": text}] if text or not calls else []
    blocks += [{"type": "tool_use", "id": _tool_use_id(), "name": c["name"], "input": c["arguments"]} for c in calls]
    return blocks, "tool_use" if calls else None


def _stop_reason(text: TextStream, rec: RequestRecord) -> str:
    return "stop_sequence" if text.stopped else STOP_REASONS.get(rec.finish_reason or "stop", "end_turn")


def _usage(rec: RequestRecord | None, n_prompt: int = 0, cached: int = 0) -> dict:
    """Anthropic counts input tokens read from the prompt cache apart from the rest."""
    if rec is not None:
        n_prompt, cached = rec.prompt_tokens, rec.reused_tokens
    return {"input_tokens": n_prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": len(rec.completion) if rec is not None else 0}


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class _Blocks:
    """The stream's content blocks: a text block opened at the first text, closed before a tool_use."""

    def __init__(self) -> None:
        self.index = -1
        self.text_open = False

    def text(self, delta: str) -> list[bytes]:
        out = []
        if not self.text_open:
            self.index += 1
            self.text_open = True
            out.append(_event("content_block_start", {"index": self.index, "content_block": {"type": "text", "text": ""}}))
        out.append(_event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": delta}}))
        return out

    def close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        return [_event("content_block_stop", {"index": self.index})]

    def tool_use(self, call: dict) -> list[bytes]:
        self.index += 1
        start = {"type": "tool_use", "id": _tool_use_id(), "name": call["name"], "input": {}}
        return [_event("content_block_start", {"index": self.index, "content_block": start}),
                _event("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(call["arguments"])}}),
                _event("content_block_stop", {"index": self.index})]


async def _stream(request: Request, job: Job, text: TextStream, service: Service, names: set[str],
                  n_prompt: int) -> AsyncIterator[bytes]:
    """Anthropic's event sequence: message_start, ping, content blocks (text deltas; a tool call as
    one input_json_delta once it is whole), message_delta (stop reason, usage), message_stop."""
    hold, blocks, started = ToolCallHold(bool(names)), _Blocks(), False

    def start() -> bytes:
        cached = job.slot.record.reused_tokens if job.slot is not None and job.slot.record is not None else 0
        message = {"id": "msg_" + job.id, "type": "message", "role": "assistant", "model": service.model_id,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(None, n_prompt, cached)}
        return _event("message_start", {"message": message}) + _event("ping", {})

    async for event in events(request, job):
        if not started and not isinstance(event, Failed):
            started = True
            yield start()
        if isinstance(event, StepRecord):
            delta = hold.push(text.push(event.tokens))
            if text.stopped:
                job.cancel()
            for chunk in blocks.text(delta) if delta else []:
                yield chunk
        elif isinstance(event, Failed):
            yield _event("error", {"error": shaped("/v1/messages", ApiError(event.status, event.message))["error"]})
            return
        elif isinstance(event, Done):
            rec = event.record
            tail = hold.push(text.flush())
            content, calls = parse_tool_calls(hold.held, names) if hold.held else (None, [])
            tail += content or ""
            for chunk in blocks.text(tail) if tail or (blocks.index < 0 and not calls) else []:
                yield chunk
            for chunk in blocks.close_text():
                yield chunk
            for call in calls:
                for chunk in blocks.tool_use(call):
                    yield chunk
            if rec.finish_reason == "shutdown":  # the server stopped mid-answer: Anthropic's overload error ends it
                yield _event("error", {"error": shaped("/v1/messages", stopping_error())["error"]})
                return
            stop = "tool_use" if calls else _stop_reason(text, rec)
            yield _event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": text.stopped_by},
                                           "usage": _usage(rec)})
            yield _event("message_stop", {})

