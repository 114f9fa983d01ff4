"""OpenAI's Responses API (`POST /v1/responses`), translated onto the server core: Codex CLI and
other agents that speak only it run on the same engine, queue, prompt cache and speculation.

Input items become the chat template's messages (`message`, `function_call`,
`function_call_output`; a `reasoning` item's text becomes the next assistant message's reasoning).
Reasoning comes back as a `reasoning` output item (`response.reasoning_text.delta` events when
streaming); `reasoning.effort` switches the template's thinking mode. Function tools are offered to the model;
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

from app.chat.format import Call
from app.chat.stream import Parsed
from app.engine.records import RequestRecord
from app.engine.sampling import check_grammar
from app.errors import SpecdeckError
from app.server.answer import Answer, Failure, Final, Idle, chat_prompt, delta_events, thinking_of
from app.server.core import (
    STREAM_HEADERS,
    Service,
    prompt_progress,
    require_ready,
    submit,
)
from app.server.conversation import Chat, Message, ToolChoice
from app.server.errors import ApiError
from app.server.images import from_url
from app.server.metrics import Metrics
from app.server.scheduler import SHUTTING_DOWN, Progress
from app.server.schemas import Sampling, StrictBody
from app.server.settings import ServeSettings
from app.server.structured import response_format_grammar

TEXT_PARTS = {"input_text", "output_text", "text", "summary_text"}


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
    reasoning: dict[str, Any] | None = None  # {"effort": "none" | "minimal" | "low" | "medium" | "high", "summary": ...}
    return_progress: bool = False  # llama-server's: response.in_progress events with the prompt's progress


def add_responses_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        require_ready(service)
        if body.previous_response_id:
            raise ApiError(400, "this server keeps no responses: send the whole conversation in `input` "
                                "(previous_response_id is not supported)", param="previous_response_id")
        sampling = Sampling(model=body.model, max_tokens=body.max_output_tokens, top_p=body.top_p, stream=body.stream,
                            return_progress=body.return_progress, **{k: body.temperature for k in ("temperature",) if k in body.model_fields_set})
        chat = to_chat(body, sampling)
        text_grammar = _text_grammar(body, service)
        if text_grammar is not None and chat.tool_choice.mode in ("required", "named") and chat.tools:
            raise ApiError(400, "text.format and a required tool call cannot be combined", param="text.format")
        prompt = await chat_prompt(service, settings, chat)
        grammar, triggers = (text_grammar, ()) if text_grammar is not None else (prompt.grammar, prompt.triggers)
        job = submit(service, settings, metrics, sampling, prompt.ids, grammar, triggers=triggers, pictures=prompt.pictures)
        answer = Answer(service, job, [], prompt.stream(service))
        shell = _response(body, service, "resp_" + job.id, "in_progress", [], None)
        if body.stream:
            return StreamingResponse(_stream(request, answer, shell, service, settings.keep_alive),
                                     media_type="text/event-stream",
                                     headers=STREAM_HEADERS)
        final = await answer.whole(request)
        return _finished(shell, _output_items(final.parsed), final, service)


# -- request -----------------------------------------------------------------------------------

def to_chat(body: ResponsesRequest, sampling: Sampling) -> Chat:
    """A Responses body as the one chat request: `instructions` first, the input items as messages
    (consecutive function calls join the assistant message before them), function tools only."""
    choice = body.tool_choice
    named = isinstance(choice, dict) and choice.get("type") == "function"
    effort = (body.reasoning or {}).get("effort")
    return Chat(_messages(body), sampling,
                tools=[{"name": t["name"], "description": t.get("description") or "",
                        "parameters": t.get("parameters") or {"type": "object"}}
                       for t in body.tools or [] if isinstance(t, dict) and t.get("type") == "function" and t.get("name")],
                tool_choice=ToolChoice("named", choice.get("name")) if named
                else ToolChoice(choice if choice in ("none", "required") else "auto"),
                parallel=body.parallel_tool_calls is not False,
                thinking=thinking_of(effort if isinstance(effort, str) else None, None))


def _parts(content: Any, where: str) -> list:
    """Text and image parts (input_image: a data: URI, or a URL where the server fetches them)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: content must be a string or a list of parts", param=where)
    out: list = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        at = f"{where}.{j}"
        if kind in TEXT_PARTS:
            out.append(str(p.get("text", "")))
        elif kind == "input_image":
            if p.get("file_id") and not p.get("image_url"):
                raise ApiError(400, f"{at}: this server keeps no files: send the image as image_url (a data: URI)",
                               param=at)
            out.append(from_url(p.get("image_url"), at))
        else:
            raise ApiError(400, f"{at}: content part type {kind!r} is not supported", param=at)
    return out


def _messages(body: ResponsesRequest) -> list[Message]:
    """`instructions` and the input items as messages; consecutive function calls join the assistant
    message before them."""
    out: list[Message] = [Message("system", [body.instructions])] if body.instructions else []
    items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    thought: list[str] = []  # reasoning items waiting for the assistant message they belong to
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where}: an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}: unknown role {role!r}", param=f"{where}.role")
            out.append(Message("system" if role == "developer" else role,
                               _parts(item.get("content", ""), f"{where}.content")))
            if role == "assistant" and thought:
                out[-1].reasoning, thought = "\n".join(thought), []
        elif kind == "function_call":
            try:
                args = json.loads(item.get("arguments") or "{}")
            except (json.JSONDecodeError, TypeError):
                raise ApiError(400, f"{where}: arguments are not valid JSON", param=f"{where}.arguments") from None
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": item.get("name"), "arguments": args}}
            if out and out[-1].role == "assistant" and not thought:
                out[-1].tool_calls = (out[-1].tool_calls or []) + [call]
            else:
                out.append(Message("assistant", [""], tool_calls=[call]))
                if thought:
                    out[-1].reasoning, thought = "\n".join(thought), []
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append(Message("tool", _parts(output, f"{where}.output"), tool_call_id=item.get("call_id")))
        elif kind == "reasoning":
            parts = (item.get("content") or []) + ([] if item.get("content") else item.get("summary") or [])
            text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            if text:
                thought.append(text)
        elif kind == "item_reference":
            continue
        else:
            raise ApiError(400, f"{where}: input item type {kind!r} is not supported", param=f"{where}.type")
    return out


def _text_grammar(body: ResponsesRequest, service: Service) -> str | None:
    """text.format (json_object / json_schema) as GBNF."""
    fmt = body.text.format if body.text else None
    if fmt is None:
        return None
    try:
        grammar = response_format_grammar(fmt.type, fmt.schema_)
        if grammar is not None:
            check_grammar(service.tokenizer.vocab, grammar)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="text.format") from None
    return grammar


# -- answer ------------------------------------------------------------------------------------

def _id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def _message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or _id("msg_"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []}


def _call_item(call: Call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": _id("fc_"), "call_id": _id("call_"), "name": call.name,
            "arguments": call.arguments_json if status == "completed" else "", "status": status}


def _reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "reasoning", "id": item_id or _id("rs_"), "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def _output_items(parsed: Parsed) -> list[dict]:
    items = [_reasoning_item(parsed.reasoning)] if parsed.reasoning else []
    if parsed.content or not (parsed.calls or parsed.reasoning):
        items.append(_message_item(parsed.content))
    return items + [_call_item(c) for c in parsed.calls]


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


def _usage(rec: RequestRecord, reasoning_tokens: int = 0) -> dict:
    n = len(rec.completion)
    return {"input_tokens": rec.prompt_tokens, "input_tokens_details": {"cached_tokens": rec.reused_tokens},
            "output_tokens": n, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": rec.prompt_tokens + n}


def _finished(shell: dict, items: list[dict], final: Final, service: Service) -> dict:
    """The whole response: completed, or incomplete when it ran out of tokens."""
    rec = final.record
    short = final.finish == "length"
    reasoning = len(service.tokenizer.encode(final.parsed.reasoning, add_special=False)) if final.parsed.reasoning else 0
    out = {**shell, "status": "incomplete" if short else "completed", "output": items,
           "usage": _usage(rec, min(reasoning, len(rec.completion))),
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


class _Items:
    """The streamed output items in the order they come: reasoning, the message, function calls. A
    reasoning or message item stays open while its text grows and is closed when another begins."""

    def __init__(self, ev: _Events) -> None:
        self.ev = ev
        self.done: list[dict] = []
        self.open: str | None = None  # "reasoning" or "message"
        self.id = ""
        self.parts: list[str] = []

    def _start(self, kind: str) -> list[bytes]:
        if self.open == kind:
            return []
        out = self.close()
        self.open, self.parts = kind, []
        index = len(self.done)
        if kind == "reasoning":
            self.id = _id("rs_")
            return out + [self.ev("response.output_item.added", output_index=index, item=_reasoning_item("", "in_progress", self.id))]
        self.id = _id("msg_")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return out + [self.ev("response.output_item.added", output_index=index, item=_message_item("", "in_progress", self.id)),
                      self.ev("response.content_part.added", item_id=self.id, output_index=index, content_index=0, part=part)]

    def reasoning(self, delta: str) -> list[bytes]:
        out = self._start("reasoning")
        self.parts.append(delta)
        return out + [self.ev("response.reasoning_text.delta", item_id=self.id, output_index=len(self.done),
                              content_index=0, delta=delta)]

    def text(self, delta: str) -> list[bytes]:
        out = self._start("message")
        self.parts.append(delta)
        return out + [self.ev("response.output_text.delta", item_id=self.id, output_index=len(self.done), content_index=0,
                              delta=delta, logprobs=[])]

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        whole, index, kind = "".join(self.parts), len(self.done), self.open
        self.open = None
        if kind == "reasoning":
            item = _reasoning_item(whole, "completed", self.id)
            out = [self.ev("response.reasoning_text.done", item_id=self.id, output_index=index, content_index=0, text=whole)]
        else:
            item = _message_item(whole, "completed", self.id)
            out = [self.ev("response.output_text.done", item_id=self.id, output_index=index, content_index=0, text=whole,
                           logprobs=[]),
                   self.ev("response.content_part.done", item_id=self.id, output_index=index, content_index=0,
                           part=item["content"][0])]
        self.done.append(item)
        return out + [self.ev("response.output_item.done", output_index=index, item=item)]

    def call(self, call: Call) -> list[bytes]:
        out = self.close()
        item, index = _call_item(call), len(self.done)
        self.done.append(item)
        return out + [
            self.ev("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"}),
            self.ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=item["arguments"]),
            self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=index, name=item["name"],
                    arguments=item["arguments"]),
            self.ev("response.output_item.done", output_index=index, item=item)]


async def _stream(request: Request, answer: Answer, shell: dict, service: Service,
                  keep_alive: float) -> AsyncIterator[bytes]:
    ev = _Events()
    items = _Items(ev)
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    async for item in answer.stream(request, keep_alive):
        out = delta_events(item, items)
        if isinstance(item, Idle):  # an event, not an SSE comment: Codex's idle timer counts events
            yield ev("response.in_progress", response=shell)
        elif isinstance(item, Progress):  # return_progress, as llama-server reports it
            yield ev("response.in_progress", response=shell, **prompt_progress(item))
        elif out is not None:
            for chunk in out:
                yield chunk
        elif isinstance(item, Failure) or (isinstance(item, Final) and item.finish == "abort"):
            message = item.message if isinstance(item, Failure) else SHUTTING_DOWN
            yield ev("response.failed", response={**shell, "status": "failed",
                                                  "error": {"code": "server_error", "message": message}})
            return
        elif isinstance(item, Final):
            out = []
            if not items.done and items.open is None:  # an empty answer is still one (empty) message
                out += items.text("")
            out += items.close()
            for chunk in out:
                yield chunk
            final = _finished(shell, items.done, item, service)
            yield ev("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
            return
