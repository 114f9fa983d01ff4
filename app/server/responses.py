"""OpenAI's Responses API (`POST /v1/responses`), translated onto the server core: Codex CLI and
other agents that speak only it run on the same engine, queue, prompt cache and speculation.

Input items become the chat template's messages (`message`, `function_call`,
`function_call_output`; `reasoning` items are dropped). Function tools are offered to the model;
other tool types an agent sends (`web_search`, `local_shell`, custom tools) are skipped. Nothing is
stored: `previous_response_id` is a 400 that says to send the whole input (what `store: false`
agents do anyway)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from app.engine.records import RequestRecord, StepRecord
from app.engine.sampling import check_grammar
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
    submit,
)
from app.server.errors import ApiError
from app.server.metrics import Metrics
from app.server.scheduler import SHUTTING_DOWN, Done, Failed, Job
from app.server.schemas import Sampling, StrictBody
from app.server.settings import ServeSettings
from app.server.structured import (
    ToolCallHold,
    parse_tool_calls,
    response_format_grammar,
    tool_call_grammar,
)
from app.server.textstream import TextStream

TEXT_PARTS = {"input_text", "output_text", "text", "summary_text"}
IMAGE_PARTS = {"input_image", "input_file", "input_audio"}


class TextFormat(StrictBody):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(StrictBody):
    format: TextFormat | None = None


class ResponsesRequest(StrictBody):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    text: TextOptions | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Any] | None = None


def add_responses_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        require_ready(service)
        if body.previous_response_id:
            raise ApiError(400, "this server keeps no responses: send the whole conversation in `input` "
                                "(previous_response_id is not supported)", param="previous_response_id")
        sampling = Sampling(model=body.model, max_tokens=body.max_output_tokens, temperature=body.temperature,
                            top_p=body.top_p, stream=body.stream)
        check_model(sampling, service, settings)
        tools = _function_tools(body, service)
        ids = chat_ids(service, _messages(body), tools)
        grammar = _grammar(body, tools, service)
        job = submit(service, settings, metrics, sampling, ids, grammar)
        text = TextStream(lambda t: service.tokenizer.piece_bytes(t), [])
        names = {t["name"] for t in tools}
        shell = _response(body, service, "resp_" + job.id, "in_progress", [], None)
        if body.stream:
            return StreamingResponse(_stream(request, job, text, shell, names), media_type="text/event-stream",
                                     headers=STREAM_HEADERS)
        content, rec = await collect(request, job, text)
        items = _output_items(content, names)
        return _finished(shell, items, rec)


# -- request -----------------------------------------------------------------------------------

def _part_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: content must be a string or a list of parts", param=where)
    out = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in TEXT_PARTS:
            out.append(str(p.get("text", "")))
        elif kind in IMAGE_PARTS:
            raise refuse_images(f"{where}.{j}")
        else:
            raise ApiError(400, f"{where}.{j}: content part type {kind!r} is not supported", param=f"{where}.{j}")
    return "".join(out)


def _messages(body: ResponsesRequest) -> list[dict]:
    """`instructions` and the input items as the chat template's messages; consecutive function
    calls join the assistant message before them."""
    out: list[dict] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where}: an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}: unknown role {role!r}", param=f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _part_text(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            try:
                args = json.loads(item.get("arguments") or "{}")
            except (json.JSONDecodeError, TypeError):
                raise ApiError(400, f"{where}: arguments are not valid JSON", param=f"{where}.arguments") from None
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": item.get("name"), "arguments": args}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else _part_text(output, f"{where}.output")})
        elif kind in ("reasoning", "item_reference"):
            continue
        else:
            raise ApiError(400, f"{where}: input item type {kind!r} is not supported", param=f"{where}.type")
    return out


def _function_tools(body: ResponsesRequest, service: Service) -> list[dict]:
    """Function tools as the template's function definitions; other tool types are skipped."""
    if body.tool_choice == "none":
        return []
    tools = [{"name": t["name"], "description": t.get("description") or "",
              "parameters": t.get("parameters") or {"type": "object"}}
             for t in body.tools or [] if isinstance(t, dict) and t.get("type") == "function" and t.get("name")]
    if tools and not service.tokenizer.supports_tools:
        raise ApiError(400, "this model's chat template has no tool support: send the request without `tools`", param="tools")
    return tools


def _grammar(body: ResponsesRequest, tools: list[dict], service: Service) -> str | None:
    """text.format (json_object / json_schema) or a required tool call, as GBNF."""
    choice = body.tool_choice
    forced = None
    if tools and choice == "required":
        forced = tools
    elif tools and isinstance(choice, dict) and choice.get("type") == "function":
        forced = [t for t in tools if t["name"] == choice.get("name")]
        if not forced:
            raise ApiError(400, f"tool_choice names {choice.get('name')!r}, which is not among the tools", param="tool_choice")
    fmt = body.text.format if body.text else None
    if forced and fmt is not None and fmt.type != "text":
        raise ApiError(400, "text.format and a required tool call cannot be combined", param="text.format")
    try:
        grammar = tool_call_grammar(forced) if forced else (
            response_format_grammar(fmt.type, fmt.schema_) if fmt is not None else None)
        if grammar is not None:
            check_grammar(service.tokenizer.vocab, grammar)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="tool_choice" if forced else "text.format") from None
    return grammar


# -- answer ------------------------------------------------------------------------------------

def _id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def _message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or _id("msg_"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []}


def _call_item(call: dict, status: str = "completed") -> dict:
    return {"type": "function_call", "id": _id("fc_"), "call_id": _id("call_"), "name": call["name"],
            "arguments": json.dumps(call["arguments"]) if status == "completed" else "", "status": status}


def _output_items(content: str, names: set[str]) -> list[dict]:
    text, calls = parse_tool_calls(content, names) if names else (content, [])
    items = [_message_item(text)] if text or not calls else []
    return items + [_call_item(c) for c in calls]


def _response(body: ResponsesRequest, service: Service, rid: str, status: str, output: list[dict],
              rec: RequestRecord | None) -> dict:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "error": None,
            "incomplete_details": None, "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": service.model_id, "output": output, "parallel_tool_calls": bool(body.parallel_tool_calls),
            "previous_response_id": None, "store": False, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": (body.text.format.model_dump(by_alias=True, exclude_none=True)
                                if body.text and body.text.format else {"type": "text"})},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "truncation": "disabled",
            "metadata": body.metadata or {}, "usage": _usage(rec) if rec is not None else None}


def _usage(rec: RequestRecord) -> dict:
    n = len(rec.completion)
    return {"input_tokens": rec.prompt_tokens, "input_tokens_details": {"cached_tokens": rec.reused_tokens},
            "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": rec.prompt_tokens + n}


def _finished(shell: dict, items: list[dict], rec: RequestRecord) -> dict:
    """The whole response: completed, or incomplete when it ran out of tokens."""
    short = rec.finish_reason in ("length", "context", "time_limit")
    out = {**shell, "status": "incomplete" if short else "completed", "output": items, "usage": _usage(rec),
           "incomplete_details": {"reason": "max_output_tokens"} if short else None}
    out["output_text"] = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    return out


class _Events:
    """Numbered SSE events (every Responses event carries its sequence_number)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **data) -> bytes:
        payload = {"type": kind, "sequence_number": self.n, **data}
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


async def _stream(request: Request, job: Job, text: TextStream, shell: dict, names: set[str]) -> AsyncIterator[bytes]:
    ev, hold = _Events(), ToolCallHold(bool(names))
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    msg_id, streamed, opened = _id("msg_"), [], False

    def open_message() -> list[bytes]:
        item = _message_item("", "in_progress", msg_id)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [ev("response.output_item.added", output_index=0, item=item),
                ev("response.content_part.added", item_id=msg_id, output_index=0, content_index=0, part=part)]

    def delta(d: str) -> list[bytes]:
        nonlocal opened
        out = [] if opened else open_message()
        opened = True
        streamed.append(d)
        return out + [ev("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0, delta=d,
                         logprobs=[])]

    async for event in events(request, job):
        if isinstance(event, StepRecord):
            d = hold.push(text.push(event.tokens))
            for chunk in delta(d) if d else []:
                yield chunk
        elif isinstance(event, Failed) or (isinstance(event, Done) and event.record.finish_reason == "shutdown"):
            message = event.message if isinstance(event, Failed) else SHUTTING_DOWN
            yield ev("response.failed", response={**shell, "status": "failed",
                                                  "error": {"code": "server_error", "message": message}})
            return
        elif isinstance(event, Done):
            tail = hold.push(text.flush())
            content, calls = parse_tool_calls(hold.held, names) if hold.held else (None, [])
            tail += content or ""
            for chunk in delta(tail) if tail or not calls else []:
                yield chunk
            items = []
            if opened:
                whole = "".join(streamed)
                item = _message_item(whole, "completed", msg_id)
                yield ev("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=whole, logprobs=[])
                yield ev("response.content_part.done", item_id=msg_id, output_index=0, content_index=0,
                         part=item["content"][0])
                yield ev("response.output_item.done", output_index=0, item=item)
                items.append(item)
            for call in calls:
                item, index = _call_item(call), len(items)
                yield ev("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"})
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                         delta=item["arguments"])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                         name=item["name"], arguments=item["arguments"])
                yield ev("response.output_item.done", output_index=index, item=item)
                items.append(item)
            final = _finished(shell, items, event.record)
            yield ev("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
