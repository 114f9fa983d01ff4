"""One model's service through its life: built whole from its typed plan (`open_service`: answers
503 until loaded), loaded (`load_model`), put live behind its service (`go_live`), shut down
(`shutdown`). The fleet (app/server/fleet.py) does this for each model when it loads or unloads it."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from app.chat.detect import detect
from app.chat.fallback import CHATML, FALLBACK
from app.chat.fallback import STOPS as FALLBACK_STOPS
from app.chat.fallback import NOTE as FALLBACK_NOTE
from app.chat.spec import ChatSpec
from app.engine.embed import Embedder
from app.engine.loader import Loaded, load
from app.gguf.info import ModelInfo
from app.server.app import Service, create_app
from app.server.costs import keep_costs, saved_costs
from app.server.model_start import ModelStart, Start
from app.server.scheduler import Scheduler
from app.server.settings import ServeSettings
from app.server.watch import AlertWatcher

log = logging.getLogger("specdeck.server")


def open_service(m: ModelStart, settings: ServeSettings, start: Start) -> tuple[Service, object]:
    """The model's service with its whole identity (name, plan, files, and the start's revision,
    machine, digests and fallback) and its app; it answers 503 until `go_live`."""
    plan = m.plan
    service = Service(model_id=m.name, n_ctx=plan.ctx, speculative_default=True, plan=plan,
                      models={"target": str(m.target.path),
                              "draft": str(m.draft.path) if m.draft else m.head.name if m.head else None},
                      details=model_details(m.target), revision=start.revision, machine=start.machine,
                      digests=model_digests(start.digests, m.name), fallback=start.fallback)
    if m.template_origin == FALLBACK:
        log.warning("specdeck: %s: %s", m.name, FALLBACK_NOTE)
    return service, create_app(model_settings(settings, m), service)


def model_digests(digests: dict, name: str) -> dict:
    """The model's own files' digests (a start of several records them as NAME:role)."""
    own = {k.split(":", 1)[1]: v for k, v in digests.items() if k.startswith(f"{name}:")}
    return own or {k: v for k, v in digests.items() if ":" not in k}


def model_settings(settings: ServeSettings, m: ModelStart) -> ServeSettings:
    """The settings a model's routes read: the server's, with the model's own other names."""
    return settings.model_copy(update={"model_aliases": list(m.aliases)})


def load_model(m: ModelStart, threads: int, settings: ServeSettings, cancel: threading.Event | None = None,
               costs=None) -> Loaded:
    """The model's contexts and engine; `costs`: the speculation costs its earlier load measured, else
    those an earlier start of the same models, plan, build and machine kept (app/server/costs.py)."""
    if costs is None and settings.speculative:
        costs = saved_costs(m, threads)
    loaded = load(m.plan, m.target, m.draft, threads, adaptive=settings.speculative, suffix_tokens=settings.suffix_tokens,
                  cache_ram_mib=settings.cache_ram, cancel=cancel, chat_template=m.chat_template, mmproj=m.mmproj,
                  costs=costs, head=m.head)
    if costs is None and loaded.costs is not None:  # measured by this load
        keep_costs(m, threads, loaded.costs)
    return loaded


def go_live(service: Service, app, loaded: Loaded, m: ModelStart, settings: ServeSettings, threads: int,
            start: Start) -> None:
    """The loaded model behind its service: the embedding model, the scheduler, the alert watcher."""
    if m.embedder is not None and m.plan.embedding is not None:
        service.embedder = Embedder(m.embedder, m.plan.embedding, threads)
    attach(service, loaded, settings, app.state.count)
    watch_alerts(service, app.state.metrics, start)


def model_details(info: ModelInfo) -> dict:
    """What Ollama's /api/tags and /api/show report about the served model (from its GGUF header)."""
    stat = info.path.stat()
    return {"architecture": info.architecture, "n_params": info.n_params, "file_type": info.file_type,
            "context_length": info.context_length, "size": info.file_size, "mtime": stat.st_mtime,
            "chat_template": info.vocab.chat_template, "n_layers": info.n_layers, "n_embd": info.n_embd,
            "n_head": info.n_head}


def attach(service: Service, loaded: Loaded, settings: ServeSettings, on_done) -> None:
    """Make a loaded engine live behind the service (its live figures counted in `service.stats`)."""

    def done(job, rec) -> None:
        service.stats.done(rec)
        on_done(job, rec)

    service.scheduler = Scheduler(loaded.engine, settings.max_queue, on_step=service.stats.step, on_done=done,
                                  on_prompt=service.stats.prompt, tbt_budget=settings.tbt_budget,
                                  mixed=settings.mixed_batch)
    service.tokenizer = loaded.tokenizer
    service.use_chat(chat_spec(loaded.tokenizer, settings.reasoning_format))
    service.thinking_default = False if settings.reasoning_budget == 0 else None
    service.n_ctx = loaded.target.n_ctx
    service.speculative_default = settings.speculative
    service.scheduler.start()
    service.ready = True


def chat_spec(tok, reasoning_format: str) -> ChatSpec:
    """The chat format of the template being served, found by rendering through it; said in the log,
    with one line when the template's tool calls are not parsed."""
    if not tok.chat_template:
        return ChatSpec()
    spec = detect(tok.chat_template, lambda m, t, g: tok.render_chat(m, t, generation_prompt=g))
    if tok.chat_template == CHATML:
        spec = replace(spec, stops=FALLBACK_STOPS)
    if reasoning_format == "none":
        spec = spec.without_reasoning()
    log.warning("specdeck: chat format %s", spec.name)
    if spec.note:
        log.warning("specdeck: %s", spec.note)
    return spec


def shutdown(service: Service, loaded: Loaded | None) -> None:
    """After the HTTP server stopped: cancel what is left, wait for the engine's worker to leave
    llama.cpp, then free the contexts (never while a decode may still run in them)."""
    if service.alerts is not None:
        service.alerts.stop()
    if service.scheduler is not None and not service.scheduler.stop():
        log.error("specdeck: the engine did not stop in time; its contexts are left to the process's exit")
        return
    if loaded is not None:
        loaded.close()
    if service.embedder is not None:
        service.embedder.close()


def watch_alerts(service: Service, metrics, start: Start) -> None:
    if start.alerts is not None:
        service.alerts = AlertWatcher(service, metrics, start.alerts, start.baseline_acceptance)
        service.alerts.check()
        service.alerts.start()
