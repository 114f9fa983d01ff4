"""Several models behind one server: which are loaded, which load next, and which make room.

Each model (a `Member`) has its service and app for the whole life of the server; loading attaches
an engine to the service, unloading stops and frees it. Residency is decided here, from the plans
alone: the loaded models' footprints (each plan's bytes less the machine's runtime reserve and
safety margin, which all share once) must fit the budget, and at most `models_max` are loaded.

    claim(member)  -> True: loaded, counted busy until `release`
                   -> a Load to wait on (the model is loading, or waits for room)
    release(member, keep_alive)  -> idle; unloaded once its keep-alive runs out (0: at once)

A model that does not fit beside the loaded ones gets room from the least recently used others:
idle ones are unloaded at once; a busy one is drained (it takes no new requests, finishes those in
flight, then unloads), so two models asked for in turn both make progress. A load never starts
while the memory it needs is still held. A load that fails leaves the other models serving: the
requests waiting on it get its reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.server.model_start import ModelStart

log = logging.getLogger("specdeck.server")

# the plan terms every model's plan counts, but which the machine holds once (app/plan/rows.py's names)
SHARED_TERMS = ("runtime reserve", "safety margin")
FOREVER = None  # a keep-alive that never runs out
SERVER_NAMES = ("specdeck", "specdeck:latest")  # the server's own name: the default model, on every API


@dataclass
class Load:
    """One load of a model: done once it ended; `error` says why it failed."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


def footprint(m: ModelStart) -> int:
    """The bytes a loaded model holds of the budget (its plan's, less what the machine holds once)."""
    return sum(t.bytes for t in m.plan.terms if t.where == "device" and t.name not in SHARED_TERMS)


def shared_bytes(m: ModelStart) -> int:
    return sum(t.bytes for t in m.plan.terms if t.where == "device" and t.name in SHARED_TERMS)


@dataclass(eq=False)
class Member:
    """One model of the fleet, and its state: idle (not loaded), loading, loaded, unloading."""

    start: ModelStart
    service: object  # app.server.core.Service: built whole at start, an engine attached while loaded
    app: object  # its routes (FastAPI), behind the fleet's front
    loaded: object = None  # app.engine.loader.Loaded while loaded
    costs: object = None  # the speculation costs its first load measured (a reload reuses them)
    state: str = "idle"
    busy: int = 0  # requests in flight through it
    last_used: float = 0.0
    expires: float | None = None  # when an idle loaded model unloads (None: never)
    draining: bool = False  # making room for another: no new requests, unloads once idle
    load: Load | None = None  # the load in progress, or the last one (its error)
    loaded_at: float | None = None

    @property
    def name(self) -> str:
        return self.start.name

    @property
    def bytes(self) -> int:
        return footprint(self.start)

    @property
    def label(self) -> str:
        """Its state as the listings show it."""
        return self.state + (" (draining)" if self.draining else "")

    @property
    def resident(self) -> bool:
        return self.state in ("loading", "loaded", "unloading")


class NeverFits(Exception):
    """The model does not fit the budget even alone."""


class Fleet:
    """The models and the rules that keep them within the budget. `load(member, cancel)` attaches an
    engine (raises on failure), `unload(member)` stops and frees it; both run on threads of their own."""

    def __init__(self, members: list[Member], budget: int, models_max: int | None, default: str | None,
                 load: Callable[[Member, threading.Event], None], unload: Callable[[Member], None],
                 strict: bool = False) -> None:
        self.members = {m.name: m for m in members}
        self.strict = strict  # --strict-model: only served names and aliases reach a model
        self.budget = budget
        self.models_max = models_max
        self.default = default
        self._load, self._unload = load, unload
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.ready = False  # the start's own loads are done (health says loading until then)
        self.draining = threading.Event()  # a stop was asked for: readiness says so while requests finish
        self._reaper = threading.Thread(target=self._reap, name="specdeck-unload", daemon=True)

    # -- which model ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.members)

    def named(self, name: str) -> Member | None:
        """The model `name` names: its name or an alias, with or without Ollama's `:latest` tag."""
        bare = name[:-len(":latest")] if name.endswith(":latest") else name
        for m in self.members.values():
            if bare == m.name or name in m.start.aliases or bare in m.start.aliases:
                return m
        return None

    def find(self, name: str | None) -> Member | None:
        """The one rule for model names, on every API. A request naming no model, or the server's own
        name (`specdeck`), reaches the default model (else the first); a served name or alias reaches
        its model; any other name reaches the default model too (agents and editors send the name
        they remember), except with --strict-model, or several models and no --default-model: then
        None, which the front answers with the 404 `model_not_found` listing the served names."""
        if not name or name in SERVER_NAMES:
            return self.first
        if (m := self.named(name)) is not None:
            return m
        return None if self.strict or (len(self.members) > 1 and self.default is None) else self.first

    def in_flight(self) -> int:
        """Requests in flight through the models (each counted from its model's claim to its release)."""
        return sum(m.busy for m in self.members.values())

    def shown(self) -> Member:
        """The model a status without a name shows: the default (else the first) if loaded, else the
        loaded one used last."""
        live = [m for m in self.members.values() if m.state == "loaded"]
        if self.first.state == "loaded" or not live:
            return self.first
        return max(live, key=lambda m: m.last_used)

    @property
    def first(self) -> Member:
        return self.members[self.default or next(iter(self.members))]

    # -- claims ---------------------------------------------------------------------------------

    def claim(self, m: Member) -> bool | Load | None:
        """True: `m` is loaded and now counts this request busy (release it after). A Load: wait for
        it (then claim again). None: it waits for room (claim again shortly)."""
        with self.lock:
            if m.state == "loaded" and not m.draining:
                m.busy += 1
                m.last_used, m.expires = time.monotonic(), None
                return True
            if m.state == "loading":
                return m.load
            if m.state != "idle":
                return None  # unloading (or draining): loads again once it is gone
            if not self._room_for(m):
                return None
            m.state, m.load = "loading", Load()
            self._thread(self._loading, m, name=f"specdeck-load-{m.name}")
            return m.load

    def release(self, m: Member, keep_alive: float | None = None) -> None:
        """A request through `m` ended; `keep_alive` (seconds; None: the model's own, negative: never)
        is how long it stays loaded once idle."""
        with self.lock:
            m.busy -= 1
            m.last_used = now = time.monotonic()
            after = m.start.unload_after if keep_alive is None else None if keep_alive < 0 else keep_alive
            if m.busy == 0:
                m.expires = None if after is None else now + after
                if m.draining or (m.expires is not None and m.expires <= now):
                    self._begin_unload(m)

    def unload_now(self, m: Member) -> bool:
        """Unload `m` once idle (Ollama's keep_alive 0 with no prompt); False if it was not loaded."""
        with self.lock:
            if m.state != "loaded":
                return False
            if m.busy:
                m.draining = True
            else:
                self._begin_unload(m)
            return True

    def _room_for(self, m: Member) -> bool:
        """Whether `m` may start loading now; else makes room (unloads or drains the least recently
        used others) and says no: the caller claims again once that memory is free."""
        others = [o for o in self.members.values() if o is not m and o.resident]
        if self._fits(m, others):
            return True
        if not self._fits(m, []):
            raise NeverFits(f"model {m.name} needs {gib(m.bytes + shared_bytes(m.start))} GiB; the budget is "
                            f"{gib(self.budget)} GiB")
        # those already leaving count as gone; of the rest, the most recently used are kept longest
        keep = sorted((o for o in others if o.state != "unloading" and not o.draining),
                      key=lambda o: (o.state != "loaded", -o.last_used))
        while keep and not self._fits(m, keep):
            victim = next((o for o in reversed(keep) if o.state == "loaded" and o.busy == 0), None) \
                or next((o for o in reversed(keep) if o.state == "loaded"), None)
            if victim is None:
                break  # loading or unloading: wait for them
            keep.remove(victim)
            if victim.busy:
                victim.draining = True
            else:
                self._begin_unload(victim)
        return False

    def _fits(self, m: Member, others: list[Member]) -> bool:
        if self.models_max is not None and len(others) + 1 > self.models_max:
            return False
        shared = max(shared_bytes(o.start) for o in [m, *others])
        return shared + m.bytes + sum(o.bytes for o in others) <= self.budget

    # -- loading and unloading ------------------------------------------------------------------

    def _loading(self, m: Member) -> None:
        load = m.load
        try:
            self._load(m, self.stopping)
        except Exception as e:  # noqa: BLE001 - the reason goes to the requests waiting and the log
            why = getattr(e, "message", None) or str(e) or type(e).__name__
            log.error("specdeck: model %s failed to load: %s", m.name, why)
            with self.lock:
                m.state, load.error = "idle", why
            load.done.set()
            return
        self._loaded(m)
        load.done.set()

    def _loaded(self, m: Member) -> None:
        with self.lock:
            m.state, m.loaded_at, m.last_used = "loaded", time.time(), time.monotonic()
            m.expires = None if m.start.unload_after is None else time.monotonic() + m.start.unload_after
        log.warning("specdeck: model %s loaded", m.name)

    def adopt(self, m: Member, attach: Callable[[Member], None]) -> None:
        """A model loaded before the fleet ran (`up` loads and warms it in its own steps) put live."""
        with self.lock:
            if m.state != "idle":
                raise RuntimeError(f"model {m.name} is {m.state}")
            m.state = "loading"
        attach(m)
        self._loaded(m)

    def _begin_unload(self, m: Member) -> None:
        """(under the lock) `m` leaves memory, on a thread of its own."""
        m.state, m.draining, m.expires = "unloading", False, None
        self._thread(self._unloading, m, name=f"specdeck-unload-{m.name}")

    def _unloading(self, m: Member) -> None:
        try:
            self._unload(m)
        except Exception as e:  # noqa: BLE001 - said; its memory is given up to the process's exit
            log.error("specdeck: model %s did not unload cleanly: %s", m.name, e)
        with self.lock:
            m.state, m.loaded_at = "idle", None
        log.warning("specdeck: model %s unloaded", m.name)

    def load_now(self, m: Member, timeout: float | None = None) -> str | None:
        """Load `m` and wait (the start's own loads); None when loaded, else why not."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.stopping.is_set():
            got = self.claim(m)
            if got is True:
                self.release(m)
                return None
            if isinstance(got, Load):
                got.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if got.error:
                    return got.error
            else:
                time.sleep(0.05)
            if deadline is not None and time.monotonic() > deadline:
                return "timed out"
        return "stopped"

    def fits_beside_loaded(self, m: Member) -> bool:
        with self.lock:
            return self._fits(m, [o for o in self.members.values() if o is not m and o.resident])

    def _thread(self, target, m: Member, name: str) -> None:
        t = threading.Thread(target=target, args=(m,), name=name, daemon=True)
        self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def start(self) -> None:
        self._reaper.start()

    def _reap(self) -> None:
        """Unload the idle models whose keep-alive ran out."""
        while not self.stopping.wait(0.25):
            now = time.monotonic()
            with self.lock:
                for m in self.members.values():
                    if m.state == "loaded" and m.busy == 0 and m.expires is not None and m.expires <= now:
                        self._begin_unload(m)

    def stop(self) -> None:
        """No more loads or unloads (the server's shutdown then frees what is loaded)."""
        self.stopping.set()
        for t in list(self.threads):
            t.join()

    # -- what is loaded -------------------------------------------------------------------------

    def view(self) -> list[dict]:
        """Each model's state, for the listings and the dashboard."""
        now = time.monotonic()
        out = []
        with self.lock:
            for m in self.members.values():
                out.append({"name": m.name, "state": m.label,
                            "busy": m.busy, "bytes": m.bytes, "loaded_at": m.loaded_at,
                            "idle_for": round(now - m.last_used, 1) if m.state == "loaded" and not m.busy and m.last_used else None,
                            "expires_in": round(m.expires - now, 1) if m.expires is not None else None,
                            "error": m.load.error if m.load is not None and m.state == "idle" else None,
                            "default": m.name == self.first.name})
        return out


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"
