"""The OpenAI API (chat, completions), translated onto the server core."""


from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from app.chat.format import Call
from app.chat.stream import CallEnd, ChatStream, ReasoningDelta, TextDelta
from app.engine.sampling import check_grammar
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.server.answer import SSE_KEEP_ALIVE, Answer, Failure, Final, Idle, chat_prompt, thinking_of
from app.server.conversation import Chat, Message, ToolChoice
from app.server.core import (
    STREAM_HEADERS,
    Progress,
    Service,
    check_vocab,
    fim_tokens,
    prompt_progress,
    require_ready,
    submit,
    timings,
    usage,
)
from app.server.errors import ApiError, error_body
from app.server.metrics import Metrics
from app.server.images import from_url
from app.server.schemas import ChatRequest, CompletionRequest, NamedToolChoice, Sampling
from app.server.settings import ServeSettings
from app.server.structured import response_format_grammar

log = logging.getLogger("specdeck.server")




def add_openai_routes(app: FastAPI, settings: ServeSettings, service: Service, metrics: Metrics) -> None:
    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        require_ready(service)
        _check_budget(body)
        prompt = await chat_prompt(service, settings, to_chat(body))
        other = _grammar(body, service)
        if other is not None and prompt.grammar is not None and not prompt.triggers:
            other_name = "grammar" if body.grammar is not None else "response_format"
            raise ApiError(400, f"{other_name} and tool_choice cannot be combined", param="tool_choice")
        grammar, triggers = (other, ()) if other is not None else (prompt.grammar, prompt.triggers)
        return await _generate(request, service, settings, metrics, body, prompt.ids, "chat", grammar,
                               chat=prompt.stream(service), triggers=triggers, pictures=prompt.pictures)

    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(body: ChatRequest):
        """llama-server's count of a chat request's prompt tokens, through the model's template."""
        require_ready(service)
        prompt = await chat_prompt(service, settings, to_chat(body))
        return {"input_tokens": len(prompt.ids)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        require_ready(service)
        _check_budget(body)
        ids = _completion_tokens(service.tokenizer, body)
        prompt = _prompt_text(service.tokenizer, body, ids)
        return await _generate(request, service, settings, metrics, body, ids, "text", _grammar(body, service),
                               echo=prompt if body.echo else "", offset=len(prompt))


def _prompt_text(tok: Tokenizer, body: CompletionRequest, ids: list[int]) -> str:
    """The prompt as given (text), or its tokens' text (ids): what `echo` repeats, where text_offset starts."""
    if isinstance(body.prompt, str):
        return body.prompt
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
        return body.prompt[0]
    return tok.decode(ids[1:] if ids and ids[0] == tok.bos else ids)


def _check_budget(body: Sampling) -> None:
    """OpenAI's routes generate at least one token (0 is llama.cpp's "evaluate only", on /completion and /infill)."""
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(body, name) == 0:
            raise ApiError(400, f"{name} must be at least 1 (or -1: up to the context)", param=name)


def to_chat(body: ChatRequest) -> Chat:
    """An OpenAI chat body as the one chat request (llama-server's rules for a final assistant
    message: continued)."""
    roles = [m.role for m in body.messages]
    if any(a == b == "assistant" for a, b in zip(roles, roles[1:])):
        raise ApiError(400, "two assistant messages in a row: merge them, or end with one to continue it", param="messages")
    if body.continue_final_message and body.add_generation_prompt:
        raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true", param="messages")
    if body.continue_final_message and roles[-1] != "assistant":
        raise ApiError(400, "continue_final_message needs an assistant message last", param="messages")
    choice = body.tool_choice
    return Chat(
        [_message(m, f"messages.{i}") for i, m in enumerate(body.messages)], body,
        tools=[t.function.model_dump(exclude_none=True) for t in body.tools or []],
        tool_choice=ToolChoice("named", choice.function.name) if isinstance(choice, NamedToolChoice)
        else ToolChoice(choice or "auto"),
        parallel=body.parallel_tool_calls is not False,
        thinking=thinking_of(body.reasoning_effort, body.chat_template_kwargs),
        template_kwargs=body.chat_template_kwargs)


def _parts(content, where: str) -> list:
    """A message's content as text and image parts (image_url: a data: URI, or a URL where allowed)."""
    if content is None or isinstance(content, str):
        return [content or ""]
    out: list = []
    for j, p in enumerate(content):
        at = f"{where}.content.{j}"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "text":
            out.append(str(p.get("text", "")))
        elif kind == "image_url":
            url = p.get("image_url")
            out.append(from_url(url.get("url") if isinstance(url, dict) else url, at))
        else:
            raise ApiError(400, f"{at}: content part type {kind!r} is not supported (text, image_url)", param=at)
    return out


def _message(m, where: str) -> Message:
    """A message as the chat request holds it (tool-call arguments as objects, as templates expect)."""
    calls = None
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
    return Message(m.role, _parts(m.content, where), name=m.name, tool_call_id=m.tool_call_id,
                   reasoning=m.reasoning_content, tool_calls=calls)


def _grammar(body: Sampling, service: Service) -> str | None:
    """The GBNF this request's output must follow: `grammar` or `response_format` (not both); checked by
    llama.cpp's parser now, so a bad one is a 400, not a failed job."""
    asked = [g for g in (
        ("grammar", body.grammar),
        ("response_format", _format_grammar(body.response_format.type, body.response_format.schema_dict())
         if body.response_format else None),
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
        return response_format_grammar(kind, what)
    except SpecdeckError as e:
        raise ApiError(400, e.message, param="response_format") from None


def _completion_tokens(tok: Tokenizer, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        check_vocab(prompt, tok.model.n_vocab, "prompt")
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
                    ids: list[int], kind: str, grammar: str | None = None, chat: ChatStream | None = None,
                    echo: str = "", offset: int = 0, triggers: tuple[str, ...] = (), pictures: dict | None = None):
    job = submit(service, settings, metrics, body, ids, grammar, triggers=triggers, pictures=pictures)
    created, rid = int(time.time()), ("chatcmpl-" if kind == "chat" else "cmpl-") + job.id
    answer = Answer(service, job, body.stops(), chat, live=body.stream and body.timings_per_token)
    head = {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
            "model": service.model_id, "system_fingerprint": service.fingerprint}
    if body.stream:
        return StreamingResponse(_stream(request, answer, kind, head, service, body, echo, offset, settings.keep_alive),
                                 media_type="text/event-stream", headers=STREAM_HEADERS)
    final = await answer.whole(request)
    record, parsed = final.record, final.parsed
    lps = _logprobs(service.tokenizer, kind, record.logprobs, offset) if job.request.logprobs is not None else None
    if kind == "chat":
        message: dict = {"role": "assistant", "content": parsed.content or (None if parsed.calls else "")}
        if parsed.reasoning:
            message["reasoning_content"] = parsed.reasoning
        if parsed.calls:
            message["tool_calls"] = _tool_calls(parsed.calls)
        choice = {"index": 0, "message": message, "finish_reason": final.finish, "logprobs": lps}
    else:
        choice = {"index": 0, "text": echo + parsed.content, "finish_reason": final.finish, "logprobs": lps}
    return {**head, "choices": [choice], "usage": usage(record), "timings": timings(record)}


def _tool_calls(calls: list[Call]) -> list[dict]:
    """Parsed calls in OpenAI's shape (arguments as a JSON string)."""
    return [{"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c, i in zip(calls, _call_ids(len(calls)))]


def _token_entry(tok: Tokenizer, t: int, lp: float) -> dict:
    b = tok.piece_bytes(t)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}


def _logprobs(tok: Tokenizer, kind: str, lps: list, offset: int = 0) -> dict:
    """The target's log-probabilities in OpenAI's shapes: chat's `content` list, or the legacy
    completions object (tokens, token_logprobs, top_logprobs, text_offset)."""
    if kind == "chat":
        return {"content": [{**_token_entry(tok, x.token, x.logprob),
                             "top_logprobs": [_token_entry(tok, t, lp) for t, lp in x.top]} for x in lps],
                "refusal": None}
    tokens = [tok.piece_bytes(x.token).decode("utf-8", errors="replace") for x in lps]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [{tok.piece_bytes(t).decode("utf-8", errors="replace"): lp for t, lp in x.top} for x in lps],
            "text_offset": offsets}


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _stream(request: Request, answer: Answer, kind: str, head: dict, service: Service, body: Sampling,
                  echo: str, offset: int, keep_alive: float) -> AsyncIterator[bytes]:
    head = {**head, "object": "chat.completion.chunk" if kind == "chat" else "text_completion"}
    want_lps = answer.job.request.logprobs is not None
    sent = offset

    def chunk(delta: dict | str | None, finish: str | None = None) -> dict:
        nonlocal sent
        lps = None
        if want_lps and (delta or finish):
            text = delta.get("content") or "" if isinstance(delta, dict) else delta or ""
            lps = _logprobs(service.tokenizer, kind, answer.take_logprobs(), sent)
            sent += len(text)
        if kind == "chat":
            c = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": lps}
        else:
            c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": lps}
        return {**head, "choices": [c]}

    def live(c: dict) -> dict:
        return {**c, "timings": answer.live_timings()} if body.timings_per_token else c

    if echo:
        yield _sse({**head, "choices": [{"index": 0, "text": echo, "finish_reason": None, "logprobs": None}]})
    if kind == "chat":  # the role at once: a client sees its stream open before the prompt is read
        yield _sse(chunk({"role": "assistant", "content": ""}))
    calls = 0
    async for item in answer.stream(request, keep_alive):
        if isinstance(item, Idle):
            yield SSE_KEEP_ALIVE
        elif isinstance(item, Progress):  # llama-server's return_progress
            yield _sse({**chunk({"role": "assistant", "content": None} if kind == "chat" else ""), **prompt_progress(item)})
        elif isinstance(item, TextDelta):
            yield _sse(live(chunk({"content": item.text} if kind == "chat" else item.text)))
        elif isinstance(item, ReasoningDelta):
            yield _sse(live(chunk({"reasoning_content": item.text})))
        elif isinstance(item, CallEnd):
            call = _tool_calls([item.call])[0]
            yield _sse(chunk({"tool_calls": [{"index": calls, **call}]}))
            calls += 1
        elif isinstance(item, Failure):
            yield _sse(error_body(item.message, "server_error"))
            break
        elif isinstance(item, Final):
            last = chunk(None, item.finish)
            last["timings"] = timings(item.record)
            yield _sse(last)
            if body.stream_options and body.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": usage(item.record)})
    yield b"data: [DONE]\n\n"
