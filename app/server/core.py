"""The API-agnostic core of the server: what is served (`Service`), errors, submitting a request to
the scheduler, following its events, the usage and timing figures, and the live status. The OpenAI
and Ollama routes are thin translators over these functions."""


from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field

import psutil

from app import __version__
from app.chat.spec import ChatSpec
from app.engine.embed import Embedder
from app.engine.engine import Request as EngineRequest
from app.engine.engine import SpecParams
from app.engine.records import RequestRecord
from app.engine.sampling import SamplingParams, check_grammar
from app.engine.text import Tokenizer
from app.llama.media import text_only
from app.llama.vision import Projector
from app.plan.hardware import read_gpus
from app.plan.planner import Plan
from app.server.audit import current_usage
from app.server.errors import OVERLOADED, ApiError
from app.server.metrics import Metrics
from app.server.scheduler import (
    SHUTTING_DOWN,
    Failed,
    Job,
    Progress,
    QueueFull,
    Scheduler,
    ShuttingDown,
)
from app.server.schemas import MAX_STOP_STRINGS, Sampling
from app.server.settings import ServeSettings
from app.server.stats import LiveStats
from app.server.watch import AlertWatcher

log = logging.getLogger("specdeck.server")
# "shutdown": the server stopped mid-answer; "abort" is the finish reason vLLM gives a request it aborted
FINISH = {"stop": "stop", "length": "length", "context": "length", "time_limit": "length", "cancelled": "stop", "error": "stop",
          "shutdown": "abort"}


def require_ready(service: Service) -> None:
    if not service.ready:
        raise ApiError(503, "the models are still loading", "server_error", headers={"Retry-After": "5"})


def check_vocab(ids: list[int], n_vocab: int, param: str) -> None:
    """Token ids a client sent must be in the vocabulary (400 naming the first that is not)."""
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the vocabulary", param=param)


def context_error(n_prompt: int, n_ctx: int, param: str = "messages", images: str = "") -> ApiError:
    """A prompt that does not fit: llama-server's error type and OpenAI's code, with both sizes, so an
    agent can trim its history and retry."""
    return ApiError(400, f"the request is {n_prompt:,} tokens{images}; this server's context is {n_ctx:,} tokens",
                    "exceed_context_size_error", param, code="context_length_exceeded",
                    extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})


def fim_tokens(tok: Tokenizer, prefix: str, suffix: str, extra) -> list[int]:
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


def engine_request(body: Sampling, ids: list[int], service: Service, settings: ServeSettings,
                    grammar: str | None = None, triggers: tuple[str, ...] = (),
                    pictures: dict | None = None) -> EngineRequest:
    n_ctx = service.n_ctx
    if len(ids) >= n_ctx:
        n_image = len(ids) - len(text_only(ids))
        raise context_error(len(ids), n_ctx, images=f", {n_image:,} of them for its {len(pictures)} image(s): send "
                                                     "fewer or smaller images" if pictures else "")
    if len(body.stops()) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    asked = body.budget()
    if asked is not None and asked > n_ctx:
        raise ApiError(400, f"max_tokens is {asked:,}; this server's context is {n_ctx:,} tokens", param="max_tokens")
    max_tokens = min(settings.max_tokens, n_ctx - len(ids)) if asked is None else asked
    max_tokens = min(max_tokens, settings.max_tokens, n_ctx - len(ids))
    try:
        n_logprobs = body.n_logprobs()
    except ValueError as e:
        raise ApiError(400, str(e), param="logprobs") from None
    spec = body.speculative
    enabled = service.speculative_default and (spec.enabled if spec else True)
    limit = service.plan.draft_max  # the plan is the one place draft_max is fixed
    n_max = spec.n_max if spec and spec.n_max is not None else limit
    key = request_partition()
    return EngineRequest(
        prompt=ids, pictures=pictures or {}, max_tokens=max(0, max_tokens), logprobs=n_logprobs,
        sampling=SamplingParams(temperature=temperature(body, settings), top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                                repeat_penalty=body.repeat_penalty, frequency_penalty=body.frequency_penalty,
                                presence_penalty=body.presence_penalty,
                                seed=body.seed if body.seed is not None and body.seed >= 0 else int.from_bytes(os.urandom(4), "little"),
                                grammar=grammar, grammar_triggers=triggers if grammar else ()),
        speculative=SpecParams(enabled=enabled and n_max > 0, n_max=min(n_max, limit)),
        stop_tokens=set() if body.ignore_eos else service.tokenizer.stop_tokens,
        partition=key if spec is None or spec.cross_request else None,
        owner=key,
    )


def temperature(body: Sampling, settings: ServeSettings) -> float:
    """The request's temperature; the server's --temp where the request set none."""
    if "temperature" not in body.model_fields_set and settings.temperature is not None:
        return settings.temperature
    return body.temperature


def request_partition() -> str:
    """Whose text the request is: its API key's name (drafts learned from earlier requests and
    cached prompt prefixes come only from the same key's), "" without keys."""
    usage = current_usage.get()
    return (usage.key or "") if usage is not None else ""


def timings(rec: RequestRecord) -> dict:
    gen = len(rec.completion)
    return {
        "prompt_n": rec.prompt_tokens - rec.reused_tokens, "prompt_cached": rec.reused_tokens, "cache_n": rec.reused_tokens,
        "prompt_ms": rec.t_prompt * 1e3, "prompt_per_second": rec.prompt_tps,
        "predicted_n": gen, "predicted_ms": rec.t_generate * 1e3, "predicted_per_second": rec.generation_tps,
        "ttft_ms": rec.ttft * 1e3, "draft_n": rec.drafted, "draft_n_accepted": rec.accepted,
        "acceptance": rec.acceptance, "tokens_per_step": rec.tokens_per_decode, "drafters": rec.drafters,
    }


def prompt_progress(p: Progress) -> dict:
    """llama-server's `prompt_progress` object and the `timings` that come with it."""
    n = p.processed - p.cache
    return {"prompt_progress": {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": round(p.time_ms, 1)},
            "timings": {"cache_n": p.cache, "prompt_n": n, "prompt_ms": p.eval_ms,
                        "prompt_per_token_ms": p.eval_ms / n if n else 0.0,
                        "prompt_per_second": n / p.eval_ms * 1e3 if p.eval_ms > 0 else 0.0,
                        "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}}


def usage(rec: RequestRecord) -> dict:
    n = len(rec.completion)
    return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": n, "total_tokens": rec.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": rec.reused_tokens}}


# streamed answers: never cached, and never held back by a proxy (nginx honours X-Accel-Buffering
# even where its own proxy_buffering is on)
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def submit(service: Service, settings: ServeSettings, metrics: Metrics, body: Sampling, ids: list[int],
            grammar: str | None, quiet: bool | None = None, triggers: tuple[str, ...] = (),
            pictures: dict | None = None) -> Job:
    """Queue a request: its prompt's ids, and the images whose media ids it holds (by key)."""
    req = engine_request(body, ids, service, settings, grammar, triggers, pictures)
    if quiet is None:  # a whole answer with no stop string to watch: no per-step events
        quiet = not body.stream and not body.stops() and not service.chat.stops
    usage = current_usage.get()
    arrived = usage.arrived if usage is not None else time.monotonic()  # a wait for the model to load counts
    job = Job(req, asyncio.get_running_loop(), arrived + settings.request_timeout, quiet=quiet,
              progress=body.stream and body.return_progress, usage=usage)
    if job.usage is not None:
        job.usage.locate = job.whereabouts
    try:
        service.scheduler.submit(job)
    except QueueFull as e:
        metrics.errors.labels("queue_full").inc()
        raise ApiError(429, f"the server is busy: {e.message}; retry shortly", "rate_limit_error",
                       headers={"Retry-After": "1"}, code=OVERLOADED) from None
    except ShuttingDown:
        raise stopping_error() from None
    return job


def stopping_error() -> ApiError:
    """What a request gets when the server stops under it before its answer is whole."""
    return ApiError(503, SHUTTING_DOWN, "server_error", headers={"Retry-After": "5"})


def failed_error(failed: Failed) -> ApiError:
    """A job the scheduler could not serve, as an API error (busy and unavailable say when to retry)."""
    kind = "server_error" if failed.status >= 500 else "rate_limit_error" if failed.status == 429 else "invalid_request_error"
    retry = {429: "1", 503: "5"}.get(failed.status)
    return ApiError(failed.status, failed.message, kind, headers={"Retry-After": retry} if retry else None,
                    code=OVERLOADED if failed.status == 429 else None)


def finished(metrics: Metrics, settings: ServeSettings, service: Service, job: Job, rec: RequestRecord) -> None:
    """Count a finished request and log one structured line (text only when --log-prompts)."""
    count_tokens(metrics, rec)
    line = {"request": job.id, "finish": rec.finish_reason, "prompt_tokens": rec.prompt_tokens,
            "cached_tokens": rec.reused_tokens, "completion_tokens": len(rec.completion),
            "ttft_ms": round(rec.ttft * 1e3, 1), "tok_s": round(rec.generation_tps or 0.0, 1),
            "drafted": rec.drafted, "accepted": rec.accepted}
    texts = {}
    if settings.log_prompts and service.tokenizer is not None:
        texts = {"prompt": service.tokenizer.decode(text_only(job.request.prompt)), "completion": service.tokenizer.decode(rec.completion)}
    if job.usage is not None:
        job.usage.add(rec.prompt_tokens, rec.reused_tokens, len(rec.completion), texts)
    log.info(json.dumps({**line, **texts}))


def count_tokens(metrics: Metrics, rec: RequestRecord) -> None:
    metrics.prompt_tokens.inc(rec.prompt_tokens)
    metrics.reused_tokens.inc(rec.reused_tokens)
    metrics.completion_tokens.inc(len(rec.completion))
    metrics.drafted.inc(rec.drafted)
    metrics.accepted.inc(rec.accepted)
    metrics.ttft.observe(rec.ttft)


def recent_tps(service: Service, window: float = 10.0) -> float:
    now = time.monotonic()
    n = sum(k for t, k in list(service.scheduler.recent) if now - t <= window)
    return n / window


def refresh_gauges(service: Service, metrics: Metrics, snap: dict | None = None) -> list:
    """Update the gauges (`snap`: the live figures' snapshot where the caller has taken it); returns
    the GPUs it read (so callers need not ask NVML twice)."""
    metrics.queue_depth.set(service.scheduler.queue_depth())
    metrics.busy_slots.set(service.scheduler.busy_slots())
    metrics.tokens_per_second.set(recent_tps(service))
    metrics.acceptance.set(metrics.acceptance_rate() or 0.0)
    metrics.ram_used.set(psutil.Process().memory_info().rss)
    metrics.queue_limit.set(service.scheduler.max_queue)
    metrics.slots.set(len(service.scheduler.engine.slots))
    used, cells = kv_cells(service)
    metrics.kv_usage.set(used / cells if cells else 0.0)
    metrics.cache_info.clear()
    metrics.cache_info.labels("1", str(cells)).set(1)
    metrics.fallback.set(1 if service.fallback else 0)
    for s in service.scheduler.engine.slots:
        live = service.stats.slot(s.id)
        for gauge, key in ((metrics.slot_tokens_per_decode, "recent_tokens_per_decode"),
                           (metrics.slot_head_acceptance, "recent_head_acceptance")):
            if live.get(key) is not None:
                gauge.labels(str(s.id)).set(live[key])
    snap = service.stats.snapshot() if snap is None else snap
    for q, key in (("0.5", "tbt_s_p50"), ("0.95", "tbt_s_p95")):
        if snap[key] is not None:
            metrics.tbt.labels(q).set(snap[key])
    saved = service.scheduler.engine.cache.saved
    metrics.saved_bytes.set(saved.nbytes)
    metrics.cache_host_bytes.set(service.scheduler.engine.cache.host_bytes())
    metrics.saved_prompts.set(len(saved))
    if service.plan.device == "cuda":
        metrics.vram_planned.set(service.plan.used)
    gpus = read_gpus()
    if gpus:
        metrics.vram_used.set(gpus[0].total - gpus[0].free)
    for g in gpus:
        i = str(g.index)
        metrics.gpu_memory_used.labels(i).set(g.total - g.free)
        metrics.gpu_memory_total.labels(i).set(g.total)
        for gauge, value in ((metrics.gpu_temperature, g.temperature_c), (metrics.gpu_slowdown, g.temperature_slowdown_c),
                             (metrics.gpu_power, g.power_w), (metrics.gpu_power_limit, g.power_limit_w),
                             (metrics.gpu_utilization, None if g.utilization is None else g.utilization / 100)):
            if value is not None:
                gauge.labels(i).set(value)
    return list(gpus)


def kv_cells(service: Service) -> tuple[int, int]:
    """The KV cells held by the slots serving a request (a prompt being read holds its whole
    length), and the context's cells. Idle slots' cached prompts do not count: they give way."""
    eng = service.scheduler.engine
    busy = set(service.scheduler.active) | set(service.scheduler.starting)
    return sum(eng.cache.cells(s) for s in eng.slots if s.id in busy), eng.cache.target.n_ctx


def capacity(service: Service) -> dict:
    """What a load balancer reads: ready or not, free slots, the queue and its limit."""
    if not service.ready:
        return {"ready": False, "slots_total": 0, "slots_free": 0, "queue": 0, "queue_limit": 0}
    sched = service.scheduler
    total = len(sched.engine.slots)
    return {"ready": True, "slots_total": total, "slots_free": total - sched.busy_slots(),
            "queue": sched.queue_depth(), "queue_limit": sched.max_queue}


def machine_json(gpus, cpu_percent: float | None) -> dict:
    """The machine's part of a status: each GPU and the host (the server's resident memory too)."""
    vm = psutil.virtual_memory()
    return {
        "gpu": [{"name": g.name, "total": g.total, "free": g.free, "utilization": g.utilization,
                 "temperature_c": g.temperature_c, "temperature_slowdown_c": g.temperature_slowdown_c,
                 "power_w": g.power_w, "power_limit_w": g.power_limit_w} for g in gpus],
        "host": {"total": vm.total, "available": vm.available, "rss": psutil.Process().memory_info().rss,
                 "cpu_percent": cpu_percent},
    }


def status_json(service: Service, metrics: Metrics) -> dict:
    live = service.stats.snapshot()
    gpus = refresh_gauges(service, metrics, live)
    eng = service.scheduler.engine
    slots = []
    for s in eng.slots:
        job = service.scheduler.active.get(s.id)
        state = "generating" if job else "prompt" if s.id in service.scheduler.starting else "idle"
        slots.append({"id": s.id, "state": state, "cached_tokens": len(s.cached),
                      "generated": s.generated if job else 0, **service.stats.slot(s.id)})
    return {
        "models": service.models, "plan": service.plan.to_json(), "slots": slots,
        "queue": service.scheduler.queue_depth(), "busy_slots": service.scheduler.busy_slots(),
        "kv_cache": dict(zip(("used_cells", "cells"), kv_cells(service), strict=True)),
        "speculative_default": service.speculative_default,
        "draft_max": eng.draft_limit,
        # beside answers, a prompt's tokens in their verify decode: the setting, and whether the last try paid (None: not tried)
        "mixed_batch": {"mode": service.scheduler.mixed, "pays": service.scheduler.mix_pays},
        "recent_tokens_per_second": recent_tps(service),
        "acceptance": metrics.acceptance_rate(),
        **machine_json(gpus, service.stats.cpu_percent()),
        "model_id": service.model_id, "version": __version__,
        "errors": sum(m.value for f in metrics.errors.collect() for m in f.samples if m.name.endswith("_total")),
        **capacity(service),
        "revision": service.revision, "fallback": service.fallback, "machine": service.machine,
        "model_digests": service.digests,
        "alerts": service.alerts.to_json() if service.alerts is not None else [],
        **live,
    }


@dataclass
class Service:
    """What the app serves: a scheduler over an engine, its tokenizer, the plan and names.
    Until the models are loaded (`ready`), generation answers 503 and /health says loading."""

    model_id: str
    scheduler: Scheduler | None = None
    tokenizer: Tokenizer | None = None
    n_ctx: int = 0
    plan: Plan | None = None  # the memory plan being served (typed: read as fields, never by key)
    models: dict = field(default_factory=dict)
    ready: bool = False
    speculative_default: bool = True
    details: dict = field(default_factory=dict)  # the target's GGUF facts (Ollama's tags / show)
    stats: LiveStats = field(default_factory=LiveStats)  # live figures for /v1/status and the dashboard
    embedder: Embedder | None = None  # the optional embedding model (/v1/embeddings, /api/embed)
    alerts: AlertWatcher | None = None  # raised alerts for /v1/status, /metrics and the dashboard
    revision: int | None = None  # the configuration revision being served (specdeck config history)
    fallback: dict | None = None  # {"from": revision, "reason": ...} when it serves in place of a failed start
    machine: dict = field(default_factory=dict)  # CPU, cores, GPUs, build: what a baseline is tied to
    digests: dict = field(default_factory=dict)  # role -> SHA-256 of the model files
    chat: ChatSpec = field(default_factory=ChatSpec)  # the chat template's format (tool calls, reasoning)
    markup_ids: set = field(default_factory=set)  # special tokens the chat format's markup is made of
    thinking_default: bool | None = None  # the template's thinking switch where a request does not set it (None: the template's)

    def detach(self) -> None:
        """The engine is gone (the model was unloaded): 503 again until the next attach."""
        self.ready = False
        self.scheduler = self.tokenizer = self.embedder = self.alerts = None

    def use_chat(self, spec: ChatSpec) -> None:
        """Serve answers in this chat format (its markup shown in the text even where it is special tokens)."""
        self.chat = spec
        self.markup_ids = self.tokenizer.markup_tokens(spec.markup) if self.tokenizer is not None else set()

    @property
    def vision(self) -> Projector | None:
        """The target's vision projector (None: images get a clear 400)."""
        return self.scheduler.engine.vision if self.scheduler is not None else None

    @property
    def supports_tools(self) -> bool:
        """Can tools be offered: the template renders them, or the chat format writes them in itself."""
        fmt = self.chat.tools
        return self.tokenizer is not None and (self.tokenizer.supports_tools or (fmt is not None and not fmt.native))

    def piece(self, token: int) -> bytes:
        """A token's text in an answer (the chat format's markup tokens included)."""
        return self.tokenizer.piece_bytes(token, special=token in self.markup_ids)

    def check_grammar(self, grammar: str, triggers: tuple[str, ...] = ()) -> None:
        check_grammar(self.tokenizer.vocab, grammar, triggers)

    @property
    def fingerprint(self) -> str:
        """OpenAI's system_fingerprint: changes when the build or the model files do (their SHA-256)."""
        import hashlib

        seed = json.dumps([__version__, self.model_id, self.digests.get("target"), self.digests.get("draft")])
        return "fp_" + hashlib.sha256(seed.encode()).hexdigest()[:12]

