"""The FastAPI app, built by `create_app(settings, service)`: OpenAI routes, llama.cpp's /infill,
health, status and Prometheus metrics. Handlers only translate and enqueue; the scheduler's
worker thread owns the engine."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psutil
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine.engine import Request as EngineRequest
from ..engine.engine import SpecParams
from ..engine.records import RequestRecord, StepRecord
from ..engine.sampling import SamplingParams, check_grammar
from ..errors import SpecdeckError
from ..engine.text import Tokenizer
from ..hardware import read_gpus
from .metrics import Metrics
from .scheduler import Done, Failed, Job, QueueFull, Scheduler
from .schemas import MAX_STOP_STRINGS, ChatRequest, CompletionRequest, InfillRequest, Sampling
from .limits import BodyLimit
from .settings import ServeSettings
from .structured import ToolCallHold, openai_tool_calls, parse_tool_calls, response_format_grammar, tool_call_grammar
from .stats import LiveStats
from .textstream import TextStream

log = logging.getLogger("specdeck.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None) -> None:
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers or {}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class Service:
    """What the app serves: a scheduler over an engine, its tokenizer, the plan and names.
    Until the models are loaded (`ready`), generation answers 503 and /health says loading."""

    model_id: str
    scheduler: Scheduler | None = None
    tokenizer: Tokenizer | None = None
    n_ctx: int = 0
    plan: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    ready: bool = False
    speculative_default: bool = True
    details: dict = field(default_factory=dict)  # the target's GGUF facts (Ollama's tags / show)
    stats: LiveStats = field(default_factory=LiveStats)  # live figures for /v1/status and the dashboard


def create_app(settings: ServeSettings, service: Service) -> FastAPI:
    app = FastAPI(title="specdeck", version=__version__, description="OpenAI-compatible API over a speculative llama.cpp engine")
    metrics = Metrics()
    app.state.service, app.state.metrics, app.state.settings = service, metrics, settings
    app.state.count = lambda job, rec: _finished(metrics, settings, service, job, rec)  # the scheduler reports here
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        t = time.perf_counter()
        key = settings.api_key
        if key and request.url.path not in ("/health",) and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), key.encode()):
                metrics.requests.labels(request.url.path, "401").inc()
                return JSONResponse(error_body("invalid or missing API key", "authentication_error", code="invalid_api_key"), 401)
        response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        log.info(json.dumps({"path": request.url.path, "status": response.status_code,
                             "ms": round((time.perf_counter() - t) * 1e3, 1)}))
        return response

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        metrics.errors.labels(e.type).inc()
        return JSONResponse(error_body(e.message, e.type, e.param), e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        metrics.errors.labels("invalid_request_error").inc()
        if request.url.path.startswith("/api/"):  # Ollama's routes answer in Ollama's error shape
            where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
            return JSONResponse({"error": f"{where}: {first.get('msg')}"}, 400)
        if first.get("type") == "json_invalid":  # loc is ("body", character offset)
            where, why = first.get("loc", ("?",))[-1], first.get("ctx", {}).get("error", first.get("msg"))
            return JSONResponse(error_body(f"the body is not valid JSON (character {where}: {why})", "invalid_request_error"), 400)
        param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
        return JSONResponse(error_body(f"{param or 'body'}: {first.get('msg')}", "invalid_request_error", param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        return JSONResponse(error_body(str(e.detail), "invalid_request_error"), e.status_code)

    # -- health, status, metrics -------------------------------------------------------------

    @app.get("/health")
    async def health():
        if not service.ready:
            return JSONResponse({"status": "loading"}, 503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_id, "object": "model", "created": 0, "owned_by": "specdeck"}]}

    @app.get("/v1/status")
    async def status():
        _require_ready(service)
        return _status(service, metrics)

    @app.get("/metrics")
    async def prometheus():
        if service.ready:
            _refresh_gauges(service, metrics)
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    # -- generation ------------------------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        _require_ready(service)
        _check_model(body, service)
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
        _require_ready(service)
        _check_model(body, service)
        ids = _completion_tokens(service.tokenizer, body)
        return await _generate(request, service, settings, metrics, body, ids, "text", _grammar(body, service))

    @app.post("/infill")
    async def infill(body: InfillRequest, request: Request):
        _require_ready(service)
        ids = _fim_tokens(service.tokenizer, body.input_prefix + body.prompt, body.input_suffix, body.input_extra)
        sampling = Sampling(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                            seed=body.seed, stop=body.stop or None, stream=body.stream, speculative=body.speculative,
                            max_tokens=body.n_predict if body.n_predict and body.n_predict > 0 else None)
        return await _generate(request, service, settings, metrics, sampling, ids, "infill")

    from .ollama import add_ollama_routes  # (imports this module's helpers)

    add_ollama_routes(app, settings, service, metrics)
    return app


# -- helpers --------------------------------------------------------------------------------------

def _require_ready(service: Service) -> None:
    if not service.ready:
        raise ApiError(503, "the models are still loading", "server_error", headers={"Retry-After": "5"})


def _check_model(body: Sampling, service: Service) -> None:
    if body.model and body.model not in (service.model_id, "specdeck") and body.model not in service.models:
        raise ApiError(404, f"model '{body.model}' is not served here (served: {service.model_id})", "not_found_error",
                       "model")


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
        return _fim_tokens(tok, prompt, body.suffix, [])
    return tok.encode(prompt)


def _fim_tokens(tok: Tokenizer, prefix: str, suffix: str, extra) -> list[int]:
    import llama_cpp

    v = tok.vocab
    pre, suf, mid, sep = (int(llama_cpp.llama_vocab_fim_pre(v)), int(llama_cpp.llama_vocab_fim_suf(v)),
                          int(llama_cpp.llama_vocab_fim_mid(v)), int(llama_cpp.llama_vocab_fim_sep(v)))
    if min(pre, suf, mid) < 0:
        raise ApiError(400, "this model has no fill-in-the-middle tokens", param="suffix")
    ids = [tok.bos] if tok.add_bos else []
    for chunk in extra:
        if sep >= 0:
            ids += [sep] + tok.encode(f"{chunk.filename}\n{chunk.text}", add_special=False, parse_special=False)
    ids += [pre] + tok.encode(prefix, add_special=False, parse_special=False)
    ids += [suf] + tok.encode(suffix, add_special=False, parse_special=False) + [mid]
    return ids


def _engine_request(body: Sampling, ids: list[int], service: Service, settings: ServeSettings,
                    grammar: str | None = None) -> EngineRequest:
    n_ctx = service.n_ctx
    if len(ids) >= n_ctx:
        raise ApiError(400, f"the prompt is {len(ids):,} tokens; this server's context is {n_ctx:,} tokens",
                       param="messages", type_="invalid_request_error")
    if len(body.stops()) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > n_ctx:
        raise ApiError(400, f"max_tokens is {asked:,}; this server's context is {n_ctx:,} tokens", param="max_tokens")
    max_tokens = asked or min(settings.max_tokens, n_ctx - len(ids))
    max_tokens = min(max_tokens, settings.max_tokens, n_ctx - len(ids))
    spec = body.speculative
    enabled = service.speculative_default and (spec.enabled if spec else True)
    n_max = spec.n_max if spec and spec.n_max is not None else settings.draft_max
    return EngineRequest(
        prompt=ids, max_tokens=max(1, max_tokens),
        sampling=SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                                repeat_penalty=body.repeat_penalty, frequency_penalty=body.frequency_penalty,
                                presence_penalty=body.presence_penalty,
                                seed=body.seed if body.seed is not None else int.from_bytes(os.urandom(4), "little"),
                                grammar=grammar),
        speculative=SpecParams(enabled=enabled and n_max > 0, n_max=min(n_max, settings.draft_max)),
        stop_tokens=set() if body.ignore_eos else service.tokenizer.stop_tokens,
    )



def _timings(rec: RequestRecord) -> dict:
    gen = len(rec.completion)
    return {
        "prompt_n": rec.prompt_tokens - rec.reused_tokens, "prompt_cached": rec.reused_tokens,
        "prompt_ms": rec.t_prompt * 1e3, "prompt_per_second": rec.prompt_tps,
        "predicted_n": gen, "predicted_ms": rec.t_generate * 1e3, "predicted_per_second": rec.generation_tps,
        "ttft_ms": rec.ttft * 1e3, "draft_n": rec.drafted, "draft_n_accepted": rec.accepted,
        "acceptance": rec.acceptance, "tokens_per_step": rec.tokens_per_decode,
    }


def _usage(rec: RequestRecord) -> dict:
    n = len(rec.completion)
    return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": n, "total_tokens": rec.prompt_tokens + n}


FINISH = {"stop": "stop", "length": "length", "context": "length", "time_limit": "length", "cancelled": "stop", "error": "stop"}


async def _events(request: Request, job: Job) -> AsyncIterator:
    """The job's events; if the client goes away, the job is cancelled (its slot freed at once)."""
    try:
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    return
                continue
            yield event
            if isinstance(event, (Done, Failed)):
                return
    finally:
        job.cancel()  # no-op when finished; frees the slot when the consumer stopped early


def _submit(service: Service, settings: ServeSettings, metrics: Metrics, body: Sampling, ids: list[int],
            grammar: str | None) -> Job:
    req = _engine_request(body, ids, service, settings, grammar)
    quiet = not body.stream and not body.stops()  # a whole answer with no stop string to watch: no per-step events
    job = Job(req, asyncio.get_running_loop(), time.monotonic() + settings.request_timeout, quiet=quiet)
    try:
        service.scheduler.submit(job)
    except QueueFull:
        metrics.errors.labels("queue_full").inc()
        raise ApiError(429, "the server is busy: too many queued requests", "rate_limit_error",
                       headers={"Retry-After": "1"}) from None
    return job


async def _collect(request: Request, job: Job, text: TextStream) -> tuple[str, RequestRecord]:
    """The whole answer of a job (not streamed); a failed job is raised as its API error."""
    parts, record, failed = [], None, None
    async for event in _events(request, job):
        if isinstance(event, StepRecord):
            parts.append(text.push(event.tokens))
            if text.stopped:
                job.cancel()
        elif isinstance(event, Done):
            record = event.record
            if job.quiet:  # no steps were sent: the whole answer at once
                parts.append(text.push(record.completion))
        elif isinstance(event, Failed):
            failed = event
    if failed is not None:
        kind = "server_error" if failed.status >= 500 else "rate_limit_error" if failed.status == 429 else "invalid_request_error"
        raise ApiError(failed.status, failed.message, kind, headers={"Retry-After": "1"} if failed.status == 429 else None)
    if record is None:
        raise ApiError(499, "client closed the request")
    parts.append(text.flush())
    return "".join(parts), record


def _finish(text: TextStream, record: RequestRecord) -> str:
    return "stop" if text.stopped else FINISH.get(record.finish_reason or "stop", "stop")


def _call_ids(n: int) -> list[str]:
    return ["call_" + os.urandom(12).hex() for _ in range(n)]


async def _generate(request: Request, service: Service, settings: ServeSettings, metrics: Metrics, body: Sampling,
                    ids: list[int], kind: str, grammar: str | None = None, tools: list[dict] | None = None):
    job = _submit(service, settings, metrics, body, ids, grammar)
    created, rid = int(time.time()), ("chatcmpl-" if kind == "chat" else "cmpl-") + job.id
    text = TextStream(lambda t: service.tokenizer.piece_bytes(t), body.stops())
    if body.stream:
        return StreamingResponse(_stream(request, job, text, kind, rid, created, service, body, tools or []),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    content, record = await _collect(request, job, text)
    finish = _finish(text, record)
    if kind == "infill":
        return {"content": content, "stop": True, "stop_type": finish, "tokens_predicted": len(record.completion),
                "tokens_evaluated": record.prompt_tokens, "timings": _timings(record), "model": service.model_id}
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
            "usage": _usage(record), "timings": _timings(record)}


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
    async for event in _events(request, job):
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
            finish = _finish(text, rec)
            calls = []
            if hold.held:  # the whole answer was held back: a tool call, or text that looked like the start of one
                content, parsed = parse_tool_calls(hold.held, {t["name"] for t in tools})
                tail += content or ""
                if parsed:
                    calls, finish = openai_tool_calls(parsed, _call_ids(len(parsed))), "tool_calls"
            last = chunk(tail or None, finish, calls=calls)
            last["timings"] = _timings(rec)
            if kind == "infill":
                last.update({"tokens_predicted": len(rec.completion), "timings": _timings(rec)})
            yield _sse(last)
            if body.stream_options and body.stream_options.include_usage and kind != "infill":
                yield _sse({"id": rid, "object": obj, "created": created, "model": service.model_id, "choices": [],
                            "usage": _usage(rec)})
    if kind != "infill":
        yield b"data: [DONE]\n\n"


def _finished(metrics: Metrics, settings: ServeSettings, service: Service, job: Job, rec: RequestRecord) -> None:
    """Count a finished request and log one structured line (text only when --log-prompts)."""
    _count(metrics, rec)
    line = {"request": job.id, "finish": rec.finish_reason, "prompt_tokens": rec.prompt_tokens,
            "cached_tokens": rec.reused_tokens, "completion_tokens": len(rec.completion),
            "ttft_ms": round(rec.ttft * 1e3, 1), "tok_s": round(rec.generation_tps or 0.0, 1),
            "drafted": rec.drafted, "accepted": rec.accepted}
    if settings.log_prompts and service.tokenizer is not None:
        line["prompt"] = service.tokenizer.decode(job.request.prompt)
        line["completion"] = service.tokenizer.decode(rec.completion)
    log.info(json.dumps(line))


def _count(metrics: Metrics, rec: RequestRecord) -> None:
    metrics.prompt_tokens.inc(rec.prompt_tokens)
    metrics.reused_tokens.inc(rec.reused_tokens)
    metrics.completion_tokens.inc(len(rec.completion))
    metrics.drafted.inc(rec.drafted)
    metrics.accepted.inc(rec.accepted)
    metrics.ttft.observe(rec.ttft)


def _recent_tps(service: Service, window: float = 10.0) -> float:
    now = time.monotonic()
    n = sum(k for t, k in list(service.scheduler.recent) if now - t <= window)
    return n / window


def _refresh_gauges(service: Service, metrics: Metrics) -> list:
    """Update the gauges; returns the GPUs it read (so callers need not ask NVML twice)."""
    metrics.queue_depth.set(service.scheduler.queue_depth())
    metrics.busy_slots.set(service.scheduler.busy_slots())
    metrics.tokens_per_second.set(_recent_tps(service))
    drafted = metrics.drafted._value.get()
    metrics.acceptance.set(metrics.accepted._value.get() / drafted if drafted else 0.0)
    metrics.ram_used.set(psutil.Process().memory_info().rss)
    gpus = read_gpus()
    if gpus:
        metrics.vram_used.set(gpus[0].total - gpus[0].free)
    return list(gpus)


def _status(service: Service, metrics: Metrics) -> dict:
    gpus = _refresh_gauges(service, metrics)
    eng = service.scheduler.engine
    slots = []
    for s in eng.slots:
        job = service.scheduler.active.get(s.id)
        slots.append({"id": s.id, "state": "generating" if job else "idle", "cached_tokens": len(s.cached),
                      "generated": s.generated if job else 0, **service.stats.slot(s.id)})
    drafted = metrics.drafted._value.get()
    vm = psutil.virtual_memory()
    return {
        "models": service.models, "plan": service.plan, "slots": slots,
        "queue": service.scheduler.queue_depth(), "busy_slots": service.scheduler.busy_slots(),
        "speculative_default": service.speculative_default,
        "draft_max": getattr(eng, "draft_limit", None),
        "recent_tokens_per_second": _recent_tps(service),
        "acceptance": metrics.accepted._value.get() / drafted if drafted else None,
        "gpu": [{"name": g.name, "total": g.total, "free": g.free, "utilization": g.utilization} for g in gpus],
        "host": {"total": vm.total, "available": vm.available, "rss": psutil.Process().memory_info().rss,
                 "cpu_percent": service.stats.cpu_percent()},
        "model_id": service.model_id, "version": __version__,
        "errors": sum(m.value for f in metrics.errors.collect() for m in f.samples if m.name.endswith("_total")),
        **service.stats.snapshot(),
    }
