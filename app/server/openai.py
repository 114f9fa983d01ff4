"""The OpenAI API (chat, completions) and llama.cpp's /infill, translated onto the server core."""


from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from app.engine.records import StepRecord
from app.engine.sampling import check_grammar
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.server.core import (
    ApiError,
    Service,
    check_model,
    collect,
    error_body,
    events,
    fim_tokens,
    finish_reason,
    require_ready,
    submit,
    timings,
    usage,
)
from app.server.metrics import Metrics
from app.server.scheduler import Done, Failed, Job
from app.server.schemas import ChatRequest, CompletionRequest, InfillRequest, Sampling
from app.server.settings import ServeSettings
from app.server.structured import (
    ToolCallHold,
    openai_tool_calls,
    parse_tool_calls,
    response_format_grammar,
    tool_call_grammar,
)
from app.server.textstream import TextStream

log = logging.getLogger("specdeck.server")




def add_openai_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        require_ready(service)
        check_model(body, service)
        tools = _active_tools(body, service.tokenizer)
        messages = [_message_dict(m) for m in body.messages]
        try:
            ids = service.tokenizer.chat_tokens(messages, [{"type": "function", "function": t} for t in tools])
        except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
            raise ApiError(400, f"cannot render these messages with the model's chat template: {e}") from None
        grammar = _grammar(body, service, _forced_tools(body, tools))
        return await _generate(request, service, settings, metrics, body, ids, "chat", grammar, tools)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        require_ready(service)
        check_model(body, service)
        ids = _completion_tokens(service.tokenizer, body)
        return await _generate(request, service, settings, metrics, body, ids, "text", _grammar(body, service))

    @app.post("/infill")
    async def infill(body: InfillRequest, request: Request):
        require_ready(service)
        ids = fim_tokens(service.tokenizer, body.input_prefix + body.prompt, body.input_suffix, body.input_extra)
        sampling = Sampling(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                            seed=body.seed, stop=body.stop or None, stream=body.stream, speculative=body.speculative,
                            max_tokens=body.n_predict if body.n_predict and body.n_predict > 0 else None)
        return await _generate(request, service, settings, metrics, sampling, ids, "infill")



def _active_tools(body: ChatRequest, tok: Tokenizer) -> list[dict]:
    """The function definitions to offer the model (none when tool_choice is "none")."""
    if not body.tools or body.tool_choice == "none":
        return []
    if not tok.supports_tools:
        raise ApiError(400, "this model's chat template has no tool support: send the request without `tools`", param="tools")
    return [t.function.model_dump(exclude_none=True) for t in body.tools]


def _forced_tools(body: ChatRequest, tools: list[dict]) -> list[dict] | None:
    """tool_choice "required" or a named function: the answer must be a call to one of these."""
    choice = body.tool_choice
    if not tools or choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return tools
    chosen = [t for t in tools if t["name"] == choice.function.name]
    if not chosen:
        raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools", param="tool_choice")
    return chosen


def _message_dict(m) -> dict:
    """A message as the chat template reads it (tool-call arguments as objects, as templates expect)."""
    d: dict = {"role": m.role, "content": m.text()}
    if m.name:
        d["name"] = m.name
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            args = c.function.arguments
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    raise ApiError(400, f"tool call {c.function.name!r}: arguments are not valid JSON",
                                   param="messages") from None
            calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
        d["tool_calls"] = calls
    return d


def _grammar(body: Sampling, service: Service, forced_tools: list[dict] | None = None) -> str | None:
    """The GBNF this request's output must follow: `grammar`, `response_format` or a required tool call
    (at most one of them); checked by llama.cpp's parser now, so a bad one is a 400, not a failed job."""
    asked = [g for g in (
        ("grammar", body.grammar),
        ("response_format", _format_grammar(body.response_format.type, body.response_format.schema_dict())
         if body.response_format else None),
        ("tool_choice", _format_grammar("tools", forced_tools) if forced_tools else None),
    ) if g[1] is not None]
    if len(asked) > 1:
        raise ApiError(400, f"{asked[0][0]} and {asked[1][0]} cannot be combined", param=asked[1][0])
    if not asked:
        return None
    param, grammar = asked[0]
    try:
        check_grammar(service.tokenizer.vocab, grammar)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param=param) from None
    return grammar


def _format_grammar(kind: str, what) -> str | None:
    try:
        return tool_call_grammar(what) if kind == "tools" else response_format_grammar(kind, what)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="tool_choice" if kind == "tools" else "response_format") from None


def _completion_tokens(tok: Tokenizer, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        bad = [x for x in prompt if not 0 <= x < tok.model.n_vocab]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary", param="prompt")
        return list(prompt)
    if isinstance(prompt, list):
        if len(prompt) > 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0] if prompt else ""
    if body.suffix is not None:
        return fim_tokens(tok, prompt, body.suffix, [])
    return tok.encode(prompt)


def _call_ids(n: int) -> list[str]:
    return ["call_" + os.urandom(12).hex() for _ in range(n)]


async def _generate(request: Request, service: Service, settings: ServeSettings, metrics: Metrics, body: Sampling,
                    ids: list[int], kind: str, grammar: str | None = None, tools: list[dict] | None = None):
    job = submit(service, settings, metrics, body, ids, grammar)
    created, rid = int(time.time()), ("chatcmpl-" if kind == "chat" else "cmpl-") + job.id
    text = TextStream(lambda t: service.tokenizer.piece_bytes(t), body.stops())
    if body.stream:
        return StreamingResponse(_stream(request, job, text, kind, rid, created, service, body, tools or []),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    content, record = await collect(request, job, text)
    finish = finish_reason(text, record)
    if kind == "infill":
        return {"content": content, "stop": True, "stop_type": finish, "tokens_predicted": len(record.completion),
                "tokens_evaluated": record.prompt_tokens, "timings": timings(record), "model": service.model_id}
    if kind == "chat":
        message = {"role": "assistant", "content": content}
        if tools:
            message["content"], calls = parse_tool_calls(content, {t["name"] for t in tools})
            if calls:
                message["tool_calls"] = openai_tool_calls(calls, _call_ids(len(calls)))
                finish = "tool_calls"
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": service.model_id, "choices": [choice],
            "usage": usage(record), "timings": timings(record)}


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _stream(request: Request, job: Job, text: TextStream, kind: str, rid: str, created: int, service: Service,
                  body: Sampling, tools: list[dict]) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    hold = ToolCallHold(bool(tools))

    def chunk(delta: str | None, finish: str | None, first: bool = False, calls: list[dict] | None = None) -> dict:
        if kind == "infill":
            return {"content": delta or "", "stop": finish is not None}
        if kind == "chat":
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            if calls:
                d["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
            c = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        return {"id": rid, "object": obj, "created": created, "model": service.model_id, "choices": [c]}

    first = True
    async for event in events(request, job):
        if isinstance(event, StepRecord):
            delta = hold.push(text.push(event.tokens))
            if text.stopped:
                job.cancel()
            if delta or first:
                yield _sse(chunk(delta, None, first))
                first = False
        elif isinstance(event, Failed):
            yield _sse(error_body(event.message, "server_error"))
            break
        elif isinstance(event, Done):
            rec = event.record
            tail = hold.push(text.flush())
            finish = finish_reason(text, rec)
            calls = []
            if hold.held:  # the whole answer was held back: a tool call, or text that looked like the start of one
                content, parsed = parse_tool_calls(hold.held, {t["name"] for t in tools})
                tail += content or ""
                if parsed:
                    calls, finish = openai_tool_calls(parsed, _call_ids(len(parsed))), "tool_calls"
            last = chunk(tail or None, finish, calls=calls)
            last["timings"] = timings(rec)
            if kind == "infill":
                last.update({"tokens_predicted": len(rec.completion), "timings": timings(rec)})
            yield _sse(last)
            if body.stream_options and body.stream_options.include_usage and kind != "infill":
                yield _sse({"id": rid, "object": obj, "created": created, "model": service.model_id, "choices": [],
                            "usage": usage(rec)})
    if kind != "infill":
        yield b"data: [DONE]\n\n"

