"""`specdeck serve`: the pair behind the API, started from the command line as a recorded revision
(see app/commands/revision.py: a start that fails falls back to the last good one)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from app.commands.check import require_compatible
from app.commands.common import (
    catalog_of,
    fitting_projector,
    chat_template,
    console,
    local_path,
    make_fetcher,
    roles_of,
    selection_of,
    threads,
)
from app.commands.start_request import Chosen, NamedModel, StartRequest, served
from app.drafting.kinds import head_of
from app.errors import SpecdeckError
from app.gguf.info import ModelInfo, read_model_info
from app.models.refs import Selection
from app.plan.hardware import Hardware, detect
from app.plan.planner import Plan, make_plan
from app.server.model_start import ModelStart, Resolved
from app.server.settings import ServeSettings


def server_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def machine_facts(hw: Hardware) -> dict:
    """What a validation baseline is tied to: the CPU, cores, GPUs and the llama.cpp build."""
    from app.build.info import build_record, gpu_offload
    from app.build.isa import read_cpu

    record = build_record() or {}
    return {"cpu": read_cpu().model, "cores": hw.cpu_count, "ram_total": hw.ram_total,
            "gpus": [g.name for g in hw.gpus], "build": {"rung": record.get("rung"), "cmake_args": record.get("cmake_args"),
                                                         "gpu_offload": gpu_offload()}}


def resolve(req: StartRequest, quiet: bool = False) -> Resolved:
    """The models on disk (read and paired), the hardware and the plans: what `serve` runs."""
    hw = detect()
    fetcher = make_fetcher(offline=True)
    starts = []
    for named in served(req):
        catalog = catalog_of(named.chosen.models)
        sel = selection_of(named.chosen, catalog)
        files = {role: local_path(fetcher, ref) for role, ref in roles_of(sel, named.chosen, req.settings.speculative, catalog)}
        m = model_start(sel, files, req, hw, named)
        if not quiet:
            for w in m.plan.warnings:
                console.print(f"[yellow]warning:[/] {(m.name + ': ') if req.models else ''}{w}")
        starts.append(m)
    return Resolved(tuple(starts), hw)


def model_start(sel: Selection, files: dict[str, Path], req: StartRequest, hw: Hardware,
                named: NamedModel | None = None) -> ModelStart:
    """A selection's files (by role, see roles_of) read, paired and planned: the one place a start
    turns model files into what it serves (`serve`, `up`, `validate`'s own server)."""
    settings = req.settings
    named = named or NamedModel(name="", chosen=req.chosen, aliases=settings.model_aliases)
    target = read_model_info(files["target"])
    draft = read_model_info(files["draft"]) if "draft" in files else None
    if draft is not None:
        require_compatible(target, draft)
    embedder = read_model_info(files["embedding"]) if "embedding" in files else None
    vision = fitting_projector(files["mmproj"], target) if "mmproj" in files else None
    asked = req.model_plan_request(named, draft_max=settings.draft_max)
    head = head_of(sel, settings.speculative)
    plan = make_plan(target, draft, asked, hw, sel.context, embedder, head=head.rows if head else None, projector=vision)
    return ModelStart(named.name or sel.name, plan, target, draft, embedder, chat_template(settings.chat_template_file, sel, target),
                      files.get("mmproj"), tuple(named.aliases),
                      named.unload_after if named.unload_after is not None else settings.unload_after, head)


def serve_once(req: StartRequest, start) -> int:
    """One start of `serve` (raises on a failed start: the caller decides about falling back)."""
    from app.server.serve import serve

    settings = req.settings
    r = resolve(req)
    start.machine = machine_facts(r.hw)
    rev = f", revision {start.revision}" if start.revision else ""
    if len(r.models) == 1:
        m = r.model
        console.print(f"serving {m.name} on {settings.scheme}://{settings.host}:{settings.port} ({model_facts(m, settings)}{rev})")
    else:
        console.print(f"serving {len(r.models)} models on {settings.scheme}://{settings.host}:{settings.port}{rev}:")
        for m in r.models:
            console.print(f"  {model_line(m, settings)}")
    return serve(settings, r.models, threads(settings.threads, r.hw), start)


def model_line(m: ModelStart, settings: ServeSettings) -> str:
    from app.server.fleet import footprint

    return f"{m.name} ({model_facts(m, settings)}, {footprint(m) / 2**30:.2f} GiB)"


def model_facts(m: ModelStart, settings: ServeSettings) -> str:
    return (f"context {m.plan.ctx:,}, {m.plan.parallel} slots, "
            f"speculation {speculation_label(settings.speculative, m.draft, m.plan)}"
            + (f", images through {m.mmproj.name}" if m.mmproj else ""))


def speculation_label(speculative: bool, draft: ModelInfo | None, plan: Plan) -> str:
    if not speculative:
        return "off"
    return f"on, the target's {plan.head_label} drafting" if plan.head else "on" if draft else "lookup only"


@contextlib.contextmanager
def local_server(req: StartRequest):
    """The selection served in this process on a free loopback port (for `validate` without --url),
    started as `serve` starts; yields its URL once it has loaded."""
    import socket

    from app.server.model_start import Start
    from app.server.serve import HttpThread, close_fleet, load_at_start, open_fleet

    settings = req.settings
    r = resolve(req)
    n_threads = threads(settings.threads, r.hw)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": sock.getsockname()[1]})
    fleet = http = None
    try:
        start = Start(machine=machine_facts(r.hw),
                      digests={role: f.get("sha256") for role, f in model_record(req)[1].items()})
        fleet, app = open_fleet(r.models, settings, start, n_threads)
        fleet.start()
        with console.status(f"loading {r.model.name}…") if console.is_terminal else contextlib.nullcontext():
            why = load_at_start(fleet, fleet.stopping)
        if why is not None:
            raise SpecdeckError(f"loading failed: {why}")
        fleet.ready = True
        http = HttpThread(app, sock)
        http.start()
        yield f"{settings.scheme}://127.0.0.1:{settings.port}"
    finally:
        if http is not None:
            http.stop()
        if fleet is not None:
            close_fleet(fleet)
        sock.close()


def check_pins(models: dict, pins: dict[str, str]) -> None:
    """Each served file whose name the config pins must have that SHA-256 (a file that cannot be
    read counts as differing): one line naming the file, before anything starts."""
    for role, m in models.items():
        name = Path(m["path"]).name if m.get("path") else None
        want = pins.get(name) if name else None
        if want is not None and m.get("sha256") != want:
            got = m.get("sha256") or "unreadable"
            raise SpecdeckError(f"{role} {name}: SHA-256 {got} is not the one the config pins ({want})",
                                hint="put the pinned file on the models volume, or change the pin in the config")


def model_record(req: StartRequest) -> tuple[str, dict]:
    """The served name and role -> {"ref", "path", "sha256"} for a revision (of several models: their
    names joined by "+", and NAME:role), as far as the files can be found and hashed (a missing file
    is recorded as its reference: the start then fails and says why). A selection that does not
    parse (an unknown preset) raises: that is bad input, not a revision."""
    if not req.models:
        return files_record(req.chosen, req.settings)
    out = {}
    for named in served(req):
        out.update({f"{named.name}:{role}": entry for role, entry in files_record(named.chosen, req.settings)[1].items()})
    return "+".join(m.name for m in served(req)), out


def files_record(chosen: Chosen, settings: ServeSettings) -> tuple[str, dict]:
    """One selection's name (the preset's, else "custom") and its files, by role (see model_record)."""
    from app.models.integrity import VerifiedRecords, check_integrity
    from app.settings import paths

    catalog = catalog_of(chosen.models)
    sel = selection_of(chosen, catalog)
    try:
        refs = roles_of(sel, chosen, settings.speculative, catalog)
    except Exception:  # noqa: BLE001 - an embedding model that does not resolve: serving it says what is wrong
        refs = roles_of(sel, chosen.model_copy(update={"embedding_model": None}), settings.speculative, catalog)
    fetcher = make_fetcher(offline=True)
    records = VerifiedRecords(paths().verified_file)
    out = {}
    for role, ref in refs:
        entry = {"ref": ref.label, "path": None, "sha256": None}
        try:
            path = local_path(fetcher, ref)
            entry["path"] = str(path)
            entry["sha256"] = check_integrity(path, records, None, None)[0]
        except Exception:  # noqa: BLE001 - not on disk or unreadable: the start will fail on it
            pass
        out[role] = entry
    return sel.name, out
