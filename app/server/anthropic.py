"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), translated onto the
server core: Claude Code and other agents that speak it run on the same engine, queue, prompt
cache, limits and speculation as the OpenAI routes.

Content blocks become the chat template's messages: text, `tool_use` (an assistant's tool calls)
and `tool_result` (a tool message). Harmless extras are ignored (`cache_control`, `metadata`,
`thinking` on a template without a thinking mode, server-side tools the model cannot run).
Reasoning comes back as `thinking` blocks (`thinking_delta` events when streaming), and thinking
blocks an agent sends back reach the template as the assistant message's reasoning. Image blocks
(base64, or a URL where the server fetches them), in a user message or a tool result, reach the
model's projector. What cannot be honoured is a 400 in Anthropic's envelope (documents, an image on
a model without a projector, a tool_choice naming a tool that is not offered)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from app.chat.format import Call
from app.chat.stream import Parsed
from app.engine.records import RequestRecord
from app.errors import SpecdeckError
from app.server.answer import Answer, Failure, Final, Idle, chat_prompt, delta_events
from app.server.conversation import Chat, Message
from app.server.conversation import ToolChoice as Choice
from app.server.core import (
    STREAM_HEADERS,
    Service,
    require_ready,
    stopping_error,
    submit,
)
from app.server.errors import ApiError, shaped
from app.server.images import ImageIn, from_base64, from_url
from app.server.metrics import Metrics
from app.server.schemas import Sampling, StrictBody
from app.server.settings import ServeSettings
from app.server.structured import json_grammar

IGNORED_BLOCKS = {"redacted_thinking", "server_tool_use", "web_search_tool_result",
                  "web_fetch_tool_result", "code_execution_tool_result", "mcp_tool_use", "mcp_tool_result"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicMessage(StrictBody):
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
    messages: list[AnthropicMessage] = Field(min_length=1)
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
        chat = to_chat(body, sampling)
        schema_grammar = _output_grammar(body)
        if schema_grammar is not None and chat.tool_choice.mode in ("required", "named") and chat.tools:
            raise ApiError(400, "output_config.format and a forced tool_choice cannot be combined", param="tool_choice")
        prompt = await chat_prompt(service, settings, chat)
        grammar, triggers = (schema_grammar, ()) if schema_grammar is not None else (prompt.grammar, prompt.triggers)
        job = submit(service, settings, metrics, sampling, prompt.ids, grammar, triggers=triggers, pictures=prompt.pictures)
        answer = Answer(service, job, sampling.stops(), prompt.stream(service))
        if body.stream:
            return StreamingResponse(_stream(request, answer, service, len(prompt.ids), settings.keep_alive),
                                     media_type="text/event-stream", headers=STREAM_HEADERS)
        final = await answer.whole(request)
        return {"id": "msg_" + job.id, "type": "message", "role": "assistant", "model": service.model_id,
                "content": _blocks(final.parsed), "stop_reason": _stop_reason(final),
                "stop_sequence": final.stopped_by, "usage": _usage(final.record)}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountRequest):
        require_ready(service)
        prompt = await chat_prompt(service, settings, to_chat(body, Sampling()))
        return {"input_tokens": len(prompt.ids)}


# -- request -----------------------------------------------------------------------------------

def _sampling(body: MessagesRequest, n_ctx: int) -> Sampling:
    """max_tokens is a cap (Claude Code asks 32,000 of any model): what fits the context is generated."""
    return Sampling(model=body.model, max_tokens=min(body.max_tokens, n_ctx), top_p=body.top_p or 1.0,
                    top_k=body.top_k or 0, stop=body.stop_sequences, stream=body.stream,
                    **{k: body.temperature for k in ("temperature",) if k in body.model_fields_set})


def _thinking(body: CountRequest) -> bool | None:
    """`thinking` {"type": "enabled" | "adaptive" | "disabled"}: the template's thinking mode, where it has one."""
    kind = (body.thinking or {}).get("type")
    return {"enabled": True, "adaptive": True, "disabled": False}.get(kind) if isinstance(kind, str) else None


def to_chat(body: CountRequest, sampling: Sampling) -> Chat:
    """An Anthropic body as the one chat request: the system prompt first, content blocks as parts,
    the agent's own tools (server tools, which run on Anthropic's side, are left out)."""
    messages = [Message("system", [_text_of(body.system, "system")])] if body.system else []
    for i, m in enumerate(body.messages):
        messages += _one_message(m, f"messages.{i}")
    choice = body.tool_choice
    mode = {"any": "required", "tool": "named"}.get(choice.type, choice.type) if choice is not None else "auto"
    return Chat(messages, sampling,
                tools=[{"name": t.name, "description": t.description or "", "parameters": t.input_schema or {"type": "object"}}
                       for t in body.tools or [] if not t.is_server_tool],
                tool_choice=Choice(mode, choice.name if choice is not None else None),
                parallel=not (choice and choice.disable_parallel_tool_use), thinking=_thinking(body))


def _text_of(blocks: str | list[dict], where: str) -> str:
    """The text of a string or a list of blocks (a system prompt)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind not in IGNORED_BLOCKS:
            at = f"{where}.{j}"
            raise ApiError(400, f"{at}: content block type {kind!r} is not supported here", param=at)
    return "\n".join(parts)


def _image(b: dict, where: str) -> ImageIn:
    """An image block: base64 ({"type": "base64", "media_type", "data"}) or a URL ({"type": "url"})."""
    src = b.get("source") if isinstance(b.get("source"), dict) else {}
    if src.get("type") == "base64":
        return from_base64(src.get("data"), where)
    if src.get("type") == "url":
        return from_url(src.get("url"), where)
    raise ApiError(400, f"{where}: an image's source must be base64 or url", param=where, code="invalid_image")


def _result_parts(content: Any, where: str) -> list:
    """A tool result's content: text, or blocks of text and images (a screenshot tool's)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return [str(content)]
    out: list = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            out.append(str(b.get("text", "")))
        elif kind == "image":
            out.append(_image(b, f"{where}.{j}"))
        elif kind not in IGNORED_BLOCKS:
            raise ApiError(400, f"{where}.{j}: content block type {kind!r} is not supported here", param=f"{where}.{j}")
    return out


def _one_message(m: AnthropicMessage, where: str) -> list[Message]:
    if m.role == "system":
        return [Message("system", [_text_of(m.content, where)])]
    if isinstance(m.content, str):
        return [Message(m.role, [m.content])]
    parts: list = []
    thoughts: list[str] = []
    calls: list[dict] = []
    results: list[Message] = []
    for j, b in enumerate(m.content):
        kind = b.get("type") if isinstance(b, dict) else None
        at = f"{where}.content.{j}"
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind == "image" and m.role == "user":
            parts.append(_image(b, at))
        elif kind == "thinking" and m.role == "assistant":
            thoughts.append(str(b.get("thinking", "")))
        elif kind == "tool_use" and m.role == "assistant":
            args = b.get("input") if isinstance(b.get("input"), dict) else {}
            calls.append({"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": args}})
        elif kind == "tool_result" and m.role == "user":
            content = _result_parts(b.get("content", ""), f"{at}.content")
            if b.get("is_error"):
                content = ["Error: "] + content
            results.append(Message("tool", content, tool_call_id=b.get("tool_use_id")))
        elif kind in IGNORED_BLOCKS:
            continue
        else:
            raise ApiError(400, f"{at}: content block type {kind!r} is not supported in a {m.role} message", param=at)
    if m.role == "assistant":
        return [Message("assistant", ["".join(p for p in parts if isinstance(p, str))],
                        reasoning="\n".join(thoughts) if thoughts else None, tool_calls=calls or None)]
    return results + ([Message("user", parts)] if parts or not results else [])


def _output_grammar(body: MessagesRequest) -> str | None:
    """output_config.format json_schema: the answer is JSON valid against it (by grammar)."""
    fmt = (body.output_config or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        try:
            return json_grammar(fmt.get("schema"))
        except SpecdeckError as e:
            raise ApiError(400, e.message, param="output_config.format") from None
    return None


# -- answer ------------------------------------------------------------------------------------

def _tool_use_id() -> str:
    return "toolu_" + os.urandom(12).hex()


def _blocks(parsed: Parsed) -> list[dict]:
    """The answer's content blocks: thinking, text, then tool_use."""
    blocks = [{"type": "thinking", "thinking": parsed.reasoning, "signature": ""}] if parsed.reasoning else []
    if parsed.content or not (parsed.calls or parsed.reasoning):
        blocks.append({"type": "text", "text": parsed.content})
    return blocks + [{"type": "tool_use", "id": _tool_use_id(), "name": c.name, "input": c.arguments}
                     for c in parsed.calls]


def _stop_reason(final: Final) -> str:
    if final.stopped_by is not None:
        return "stop_sequence"
    return STOP_REASONS.get(final.finish, "end_turn")


def _usage(rec: RequestRecord | None, n_prompt: int = 0, cached: int = 0) -> dict:
    """Anthropic counts input tokens read from the prompt cache apart from the rest."""
    if rec is not None:
        n_prompt, cached = rec.prompt_tokens, rec.reused_tokens
    return {"input_tokens": n_prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": len(rec.completion) if rec is not None else 0}


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class _Blocks:
    """The stream's content blocks, one open at a time: thinking, text, tool_use in the order they come."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" or "text"

    def _switch(self, kind: str) -> list[bytes]:
        if self.open == kind:
            return []
        out = self.close()
        self.index += 1
        self.open = kind
        start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
        return out + [_event("content_block_start", {"index": self.index, "content_block": start})]

    def reasoning(self, delta: str) -> list[bytes]:
        return self._switch("thinking") + [
            _event("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta", "thinking": delta}})]

    def text(self, delta: str) -> list[bytes]:
        return self._switch("text") + [
            _event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": delta}})]

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Anthropic ends a thinking block with its signature (none here)
            out.append(_event("content_block_delta", {"index": self.index, "delta": {"type": "signature_delta", "signature": ""}}))
        self.open = None
        return out + [_event("content_block_stop", {"index": self.index})]

    def call(self, call: Call) -> list[bytes]:
        out = self.close()
        self.index += 1
        start = {"type": "tool_use", "id": _tool_use_id(), "name": call.name, "input": {}}
        return out + [_event("content_block_start", {"index": self.index, "content_block": start}),
                      _event("content_block_delta", {"index": self.index, "delta": {
                          "type": "input_json_delta", "partial_json": call.arguments_json}}),
                      _event("content_block_stop", {"index": self.index})]


# A keep-alive: a ping, and a message_delta that changes nothing (no stop reason yet). Claude Code's
# stream watchdog (CLAUDE_STREAM_IDLE_TIMEOUT_MS, 300 s) skips pings: without the delta it gives up
# on a prompt that takes longer than that to evaluate (seen with 2.1.197: "Stream idle timeout").
KEEP_ALIVE = (_event("ping", {}) + _event("message_delta", {"delta": {"stop_reason": None, "stop_sequence": None},
                                                            "usage": {"output_tokens": 0}}))


async def _stream(request: Request, answer: Answer, service: Service, n_prompt: int,
                  keep_alive: float) -> AsyncIterator[bytes]:
    """Anthropic's event sequence: message_start, ping, content blocks (thinking and text deltas; a tool
    call as one input_json_delta once it is whole), message_delta (stop reason, usage), message_stop."""
    blocks, job = _Blocks(), answer.job

    def start() -> bytes:  # the prompt's cached part is not known yet: message_delta's usage has it
        message = {"id": "msg_" + job.id, "type": "message", "role": "assistant", "model": service.model_id,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(None, n_prompt, 0)}
        return _event("message_start", {"message": message}) + _event("ping", {})

    yield start()  # at once: the client sees its stream open before the prompt is read
    async for item in answer.stream(request, keep_alive):
        out = delta_events(item, blocks)
        if isinstance(item, Idle):
            yield KEEP_ALIVE
        elif out is not None:
            for chunk in out:
                yield chunk
        elif isinstance(item, Failure):
            yield _event("error", {"error": shaped("/v1/messages", item.error())["error"]})
            return
        elif isinstance(item, Final):
            out = []
            if blocks.index < 0 and item.finish != "abort":  # an empty answer is still one (empty) text block
                out += blocks.text("")
            out += blocks.close()
            for chunk in out:
                yield chunk
            if item.finish == "abort":  # the server stopped mid-answer: Anthropic's overload error ends it
                yield _event("error", {"error": shaped("/v1/messages", stopping_error())["error"]})
                return
            yield _event("message_delta", {"delta": {"stop_reason": _stop_reason(item), "stop_sequence": item.stopped_by},
                                           "usage": _usage(item.record)})
            yield _event("message_stop", {})
            return
