"""`specdeck up` and `specdeck run`: from nothing to a served (or chatting) pair, step by step.

    detect hardware → pull and verify → check the pair → plan memory → load → warm up → serve → dashboard

Each step is the code path its own command uses (pull, check, plan, serve); the first that fails
stops with one clear line, and whatever was already made (the bound port, loaded contexts) is
released. Ctrl-C while serving finishes or cancels requests in flight, frees the contexts, exit 0.
"""

from __future__ import annotations

import argparse
import collections
import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager

from prometheus_client import generate_latest
from rich.console import Console

from app.commands.check import check_pair
from app.commands.common import (
    config_path,
    console,
    out,
    serve_settings,
    threads,
)
from app.commands.start_request import StartRequest
from app.commands.dashboard import build_snapshot, loading_snapshot, watch
from app.engine.loader import Loaded
from app.errors import PairError, SpecdeckError
from app.models.refs import Selection
from app.plan.hardware import detect
from app.drafting.kinds import head_of
from app.plan.planner import Plan, PlanError
from app.plan.view import render_plan
from app.server.model_start import ModelStart, Resolved
from app.server.settings import ServeSettings

STEPS = ("detect hardware", "pull and verify", "check the pair", "plan memory", "load models", "warm up", "serve")




# -- models ----------------------------------------------------------------------------------




class Steps:
    """Numbered steps on the console, each closed with its time and a short result."""

    def __init__(self, console: Console, names: tuple[str, ...], stop: threading.Event | None = None) -> None:
        self.console, self.names, self.current = console, names, ""
        self.stop = stop  # set by a stop signal: no step starts or ends as if nothing happened

    def check_stop(self) -> None:
        """A stop asked for whose KeyboardInterrupt was swallowed (raised inside a llama.cpp callback)
        still stops here."""
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt

    @contextmanager
    def step(self, name: str, spinner: bool = False):
        self.check_stop()
        self.current = name
        n = self.names.index(name) + 1
        self.console.print(f"[bold][{n}/{len(self.names)}] {name}[/]")
        t = time.perf_counter()
        result: dict = {}
        if spinner and self.console.is_terminal:
            with self.console.status(f"{name}…"):
                yield result
        else:
            yield result
        self.check_stop()
        self.console.print(f"  [green]✓[/] {result.get('done', 'done')} [dim]({time.perf_counter() - t:.1f} s)[/]",
                           soft_wrap=True)


def prepare(req: StartRequest, steps: Steps) -> Resolved:
    """Hardware, pull, check, plan: the same functions `pull`, `check` and `plan` run."""
    from app.commands.common import catalog_of, make_fetcher, pull_one, roles_of
    from app.commands.serve import model_start
    from app.commands.doctor import doctor_subject, failed, machine_checks

    settings = req.settings
    with steps.step("detect hardware") as r:
        hw = detect()
        gpus = ", ".join(f"{g.name} {g.total / 2**30:.1f} GiB" for g in hw.gpus) or "no NVIDIA GPU"
        subject = doctor_subject(req, make_fetcher(req.up.offline, req.up.verify))
        sel: Selection = subject.selection
        fetcher = subject.fetcher
        checks = machine_checks(subject, hw, port=False)  # the port is already bound: ours
        for c in checks:
            if c.status == "warn":
                steps.console.print(f"  [yellow]![/] {c.name}: {c.summary}", soft_wrap=True)
        bad = failed(checks)
        if bad:
            raise SpecdeckError(f"{bad[0].name}: {bad[0].summary}", hint=f"fix: {bad[0].fix}" if bad[0].fix else None)
        r["done"] = (f"{gpus}; {hw.ram_total / 2**30:.1f} GiB RAM, {hw.cpu_count} cores; preset {sel.name}; "
                     f"doctor: {len(checks)} checks, none failed")
    from app.commands.start_request import served

    models = served(req)
    with steps.step("pull and verify") as r:
        got, done = {}, []
        for named in models:
            roles = roles_of(sel_of(named, req, sel), named.chosen, settings.speculative, catalog_of(named.chosen.models))
            got[named.name] = files = {role: pull_one(fetcher, ref) for role, ref in roles}
            done.append(named_prefix(named) + "; ".join(
                f"{role} {g.path.name} ({g.source}, {'hashed now' if g.hashed_now else 'verified earlier'})"
                for role, g in files.items()))
        r["done"] = "; ".join(done)
    with steps.step("check the pair", spinner=True) as r:
        r["done"] = "; ".join(named_prefix(named) + check_files(sel_of(named, req, sel), got[named.name], settings, steps)
                              for named in models)
    with steps.step("plan memory") as r:
        starts, done = [], []
        for named in models:
            one = sel_of(named, req, sel)
            m = model_start(one, {role: g.path for role, g in got[named.name].items()}, req, hw, named)
            plan = m.plan
            steps.console.print(render_plan(plan, m.name))
            starts.append(m)
            done.append(named_prefix(named) + f"context {plan.ctx:,}, {plan.parallel} slot(s), "
                                              f"{plan.used / 2**30:.2f} of {plan.budget / 2**30:.2f} GiB")
        r["done"] = "; ".join(done)
    return Resolved(tuple(starts), hw)


def sel_of(named, req: StartRequest, first: Selection) -> Selection:
    """A named model's selection (the start's own where it names none apart)."""
    from app.commands.common import catalog_of, selection_of

    return first if not req.models else selection_of(named.chosen, catalog_of(named.chosen.models))


def named_prefix(named) -> str:
    return f"{named.name}: " if named.name else ""


def check_files(sel: Selection, got: dict, settings: ServeSettings, steps: Steps) -> str:
    """Whether the draft can serve the target (llama.cpp's rules), or the MTP head can draft."""
    result = check_pair(got["target"].path, got["draft"].path if "draft" in got else None, probe=True,
                        mtp=sel.mtp and settings.speculative)
    head = head_of(sel, settings.speculative)
    if head is not None and (why := head.check(result.target.info, None)):
        raise PlanError(why, hint=head.hint or None)
    for w in result.warnings:
        steps.console.print(f"  [yellow]warning:[/] {w}", soft_wrap=True)
    if result.draft is not None and not result.compatible:
        bad = result.incompatibility
        raise PairError(f"the draft cannot serve the target (rule {bad.rule}): {bad.message}" if bad
                        else "the draft cannot serve the target", hint="pick another draft with --draft")
    return ("compatible (llama.cpp's rules)" if result.draft is not None
            else f"the target drafts with its MTP head ({result.target.info.n_nextn} layer(s))" if sel.mtp
            else "target readable (no draft)")


def prompt_ids(tok, messages: list[dict]) -> list[int]:
    """Through the model's chat template; a model without one continues the plain text."""
    if tok.chat_template:
        return tok.chat_tokens(messages)
    return tok.encode("\n".join(m["content"] for m in messages))


def load_and_warm(m: ModelStart, threads: int, settings: ServeSettings, steps: Steps) -> Loaded:
    from app.engine.engine import Request, SpecParams
    from app.llama.context import LoadCancelled
    from app.server.lifecycle import load_model

    loaded = None
    try:
        with steps.step("load models", spinner=True) as r:
            speculative = settings.speculative
            loaded = load_model(m, threads, settings, cancel=steps.stop)
            drafter = f", {m.plan.head_label} loaded" if m.plan.head else ", draft loaded" if loaded.draft else ""
            r["done"] = f"target n_ctx {loaded.target.n_ctx:,}" + drafter + \
                        (", speculation costs calibrated" if speculative else "")
        with steps.step("warm up", spinner=True) as r:
            tok = loaded.tokenizer
            req = Request(prompt=prompt_ids(tok, [{"role": "user", "content": "Say hi."}]), max_tokens=8,
                          stop_tokens=tok.stop_tokens, speculative=SpecParams(enabled=speculative, n_max=m.plan.draft_max))
            t = time.perf_counter()
            n = sum(len(rec.tokens) for rec in loaded.engine.generate(req, 0))
            r["done"] = f"{n} tokens in {time.perf_counter() - t:.2f} s"
    except LoadCancelled:  # a stop signal, seen at llama.cpp's progress report: nothing is left loaded
        raise KeyboardInterrupt from None
    except BaseException:
        if loaded is not None:
            loaded.close()
        raise
    return loaded


# -- the dashboard loop ------------------------------------------------------------------------

class EventLog(logging.Handler):
    """Warnings and errors kept for the dashboard (printing them would tear the live screen)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: collections.deque[str] = collections.deque(maxlen=2)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{time.strftime('%H:%M:%S')} {record.getMessage()}"[:200])


class StopSignals:
    """SIGTERM stops `up` the way Ctrl-C does: `event` is set, and KeyboardInterrupt is raised where
    Python runs, except inside `deferred()` (loading and warming up: there llama.cpp calls back into
    Python, where an exception would be swallowed and printed); there loading stops at llama.cpp's
    next progress report and the step ends with `Steps.check_stop`."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.raising = True

    def _handler(self, signum, frame) -> None:
        self.event.set()
        if self.raising:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self):
        old = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, was in old.items():
                signal.signal(sig, was)

    @contextmanager
    def deferred(self):
        self.raising = False
        try:
            yield
        finally:
            self.raising = True


def up(req: StartRequest, console: Console, out: Console, start=None) -> int:
    from app.commands.serve import machine_facts
    from app.server.model_start import Start
    from app.server.serve import (
        HttpThread,
        StartFailed,
        bind_socket,
        close_fleet,
        go_live_member,
        load_at_start,
        local_url,
        open_fleet,
        smoke_models,
    )

    settings = req.settings
    start = start or Start()
    settings.check()
    sock = bind_socket(settings.host, settings.port)  # a busy port fails now, not after minutes of loading
    signals = StopSignals()
    stop = signals.event
    steps = Steps(console, STEPS, stop)
    loaded: Loaded | None = None
    http: HttpThread | None = None
    fleet = None
    events = EventLog()
    try:
        with signals.installed():
            prep = prepare(req, steps)
            m = prep.model
            start.plan = m.plan.to_json()
            start.machine = machine_facts(prep.hw)
            n_threads = threads(settings.threads, prep.hw)
            with signals.deferred():
                loaded = load_and_warm(m, n_threads, settings, steps)
            steps.check_stop()
            url = f"{settings.scheme}://{settings.host}:{settings.port}"
            with steps.step("serve") as r:
                fleet, app = open_fleet(prep.models, settings, start, n_threads)
                fleet.adopt(fleet.first, lambda member: go_live_member(member, loaded, settings, n_threads, start))
                loaded = None  # the fleet's now
                fleet.start()
                if len(fleet.members) > 1:
                    with signals.deferred():
                        why = load_at_start(fleet, stop)  # the others that fit beside it
                    if why is not None:
                        raise StartFailed(f"loading failed: {why}")
                fleet.ready = True
                http = HttpThread(app, sock)
                http.start()
                try:
                    smoked = smoke_models(local_url(settings), app.state.self_headers, fleet)
                except SpecdeckError as e:
                    steps.check_stop()  # a stop cut the smoke request short: no failed start
                    raise StartFailed(f"smoke request failed: {e.message}") from None
                if start.on_good is not None:
                    start.on_good()
                r["done"] = f"OpenAI-compatible API on {url}/v1 (smoke: {smoked}" + \
                            (f", revision {start.revision}" if start.revision else "") + ")"
            if out.is_terminal:  # request lines and warnings would tear the live screen: keep them for it
                server_log = logging.getLogger("specdeck.server")
                server_log.setLevel(logging.WARNING)
                server_log.handlers[:] = [events]
                server_log.propagate = False

            def snapshot() -> dict:
                return fleet_snapshot(fleet, url, events)

            try:
                watch(snapshot, out, req.up.interval, req.up.log_interval, stop)
            except KeyboardInterrupt:
                pass
            console.print(f"stopping: finishing requests in flight ({settings.shutdown_grace:g} s at most), freeing the models")
            busy = sum(m.service.scheduler.busy_slots() for m in fleet.members.values() if m.service.scheduler)
            http.stop()
            http = None
            close_fleet(fleet)
            fleet = None
            console.print(f"stopped cleanly ({busy} request(s) were in flight)")
            return 0
    except KeyboardInterrupt:  # a stop asked for during start-up: reported as a stop, not as a failed start
        console.print(f"stopped during: {steps.current}; nothing left running")
        return 0
    finally:
        if http is not None:
            http.stop()
        if fleet is not None:
            close_fleet(fleet)
        if loaded is not None:
            loaded.close()
        sock.close()


def fleet_snapshot(fleet, url: str, events: EventLog) -> dict:
    """The dashboard's view of the default model (else the first loaded), with every model's state."""
    from app.server.core import status_json

    m = next((x for x in [fleet.first, *fleet.members.values()] if x.service.ready), None)
    if m is None:
        snap = loading_snapshot(url, "loading")
    else:
        metrics = m.app.state.metrics
        snap = build_snapshot(status_json(m.service, metrics), generate_latest(metrics.registry).decode(), url)
    snap["events"] = list(events.lines)
    if len(fleet.members) > 1:
        snap["fleet"] = fleet.view()
    return snap


# -- specdeck run -------------------------------------------------------------------------------

RUN_HELP = 'Type a message; """ starts and ends a multi-line message; /clear forgets the chat; /bye quits.'


def read_message(prompt: str = ">>> ") -> str | None:
    """One message: a line, or a \"\"\"-fenced block. None at end of input."""
    try:
        line = input(prompt)
    except EOFError:
        return None
    if not line.strip().startswith('"""'):
        return line
    first = line.strip()[3:]
    if first.endswith('"""'):
        return first[:-3]
    lines = [first] if first else []
    while True:
        try:
            line = input("... ")
        except EOFError:
            return "\n".join(lines)
        if line.rstrip().endswith('"""'):
            lines.append(line.rstrip()[:-3])
            return "\n".join(lines).strip("\n")
        lines.append(line)


def chat(loaded: Loaded, plan: Plan, speculative: bool, out: Console, max_tokens: int) -> int:
    from app.engine.engine import Request, SpecParams
    from app.server.textstream import TextStream

    tok = loaded.tokenizer
    history: list[dict] = []
    out.print(f"[dim]{RUN_HELP}[/]")
    while True:
        text = read_message()
        if text is None or text.strip() == "/bye":
            return 0
        if text.strip() == "/clear":
            history.clear()
            out.print("[dim]chat cleared[/]")
            continue
        if not text.strip():
            continue
        if text.strip().startswith("/"):
            out.print(f"[dim]unknown command {text.strip().split()[0]}. {RUN_HELP}[/]")
            continue
        history.append({"role": "user", "content": text})
        ids = prompt_ids(tok, history)
        room = loaded.target.n_ctx - len(ids) - 1
        if room < 1:
            history.pop()
            out.print(f"[red]error:[/] the chat is {len(ids):,} tokens, the context {loaded.target.n_ctx:,}; /clear starts again")
            continue
        req = Request(prompt=ids, max_tokens=min(max_tokens, room), stop_tokens=tok.stop_tokens,
                      speculative=SpecParams(enabled=speculative, n_max=plan.draft_max))
        stream = TextStream(tok.piece_bytes, [])
        parts: list[str] = []
        t0 = time.perf_counter()
        gen = loaded.engine.generate(req, 0)
        try:
            for rec in gen:
                piece = stream.push(rec.tokens)
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            gen.close()  # the engine's finally keeps the cache consistent
            parts.append(" [interrupted]")
        tail = stream.flush()
        parts.append(tail)
        sys.stdout.write(tail + "\n")
        history.append({"role": "assistant", "content": "".join(parts)})
        r = loaded.engine.slots[0].record
        if r is not None:
            acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
            out.print(f"[dim]{len(r.completion)} tokens · {r.generation_tps or 0:.1f} tok/s · acceptance {acc} · "
                      f"{r.tokens_per_decode or 0:.2f} tokens/step · TTFT {r.ttft:.2f} s · "
                      f"{time.perf_counter() - t0:.1f} s[/]")


def run(req: StartRequest, console: Console, out: Console) -> int:
    settings = req.settings
    steps = Steps(console, STEPS[:-1])
    prep = prepare(req, steps)
    loaded = load_and_warm(prep.model, threads(settings.threads, prep.hw), settings, steps)
    try:
        return chat(loaded, prep.model.plan, settings.speculative, out, req.max_tokens)
    except KeyboardInterrupt:
        return 0
    finally:
        loaded.close()


# -- the command -------------------------------------------------------------------------------

def up_once(req: StartRequest, start) -> int:
    """One start of `up` (raises on a failed start: the caller decides about falling back)."""
    return up(req, console, out, start=start)


def cmd_run(args: argparse.Namespace) -> int:

    return run(StartRequest.of(args, serve_settings(args), config=config_path(args)), console, out)
