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
from app.commands.start_request import Chosen, StartRequest
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
    """The models on disk (read and paired), the hardware and the plan: what `serve` runs."""
    catalog = catalog_of(req.chosen.models)
    sel = selection_of(req.chosen, catalog)
    fetcher = make_fetcher(offline=True)
    files = {role: local_path(fetcher, ref) for role, ref in roles_of(sel, req.chosen, req.settings.speculative, catalog)}
    hw = detect()
    m = model_start(sel, files, req, hw)
    if not quiet:
        for w in m.plan.warnings:
            console.print(f"[yellow]warning:[/] {w}")
    return Resolved(m, hw)


def model_start(sel: Selection, files: dict[str, Path], req: StartRequest, hw: Hardware) -> ModelStart:
    """A selection's files (by role, see roles_of) read, paired and planned: the one place a start
    turns model files into what it serves (`serve`, `up`, `validate`'s own server)."""
    settings = req.settings
    target = read_model_info(files["target"])
    draft = read_model_info(files["draft"]) if "draft" in files else None
    if draft is not None:
        require_compatible(target, draft)
    embedder = read_model_info(files["embedding"]) if "embedding" in files else None
    vision = fitting_projector(files["mmproj"], target) if "mmproj" in files else None
    plan = make_plan(target, draft, req.plan_request(draft_max=settings.draft_max), hw, sel.context, embedder,
                     mtp=sel.mtp and settings.speculative, projector=vision)
    return ModelStart(sel.name, plan, target, draft, embedder, chat_template(settings.chat_template_file, sel),
                      files.get("mmproj"))


def serve_once(req: StartRequest, start) -> int:
    """One start of `serve` (raises on a failed start: the caller decides about falling back)."""
    from app.server.serve import serve

    settings = req.settings
    r = resolve(req)
    m = r.model
    start.machine = machine_facts(r.hw)
    console.print(f"serving {m.name} on {settings.scheme}://{settings.host}:{settings.port} (context {m.plan.ctx:,}, "
                  f"{m.plan.parallel} slots, speculation {speculation_label(settings.speculative, m.draft, m.plan)}"
                  + (f", images through {m.mmproj.name}" if m.mmproj else "")
                  + (f", revision {start.revision}" if start.revision else "") + ")")
    return serve(settings, m, threads(settings.threads, r.hw), start)


def speculation_label(speculative: bool, draft: ModelInfo | None, plan: Plan) -> str:
    if not speculative:
        return "off"
    return "on, the target's MTP head drafting" if plan.mtp else "on" if draft else "lookup only"


@contextlib.contextmanager
def local_server(req: StartRequest):
    """The selection served in this process on a free loopback port (for `validate` without --url);
    yields its URL once it has loaded and answers."""
    import socket

    from app.server.serve import HttpThread, Start, go_live, load_model, open_service, shutdown

    settings = req.settings
    r = resolve(req)
    m, n_threads = r.model, threads(settings.threads, r.hw)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": sock.getsockname()[1]})
    loaded = None
    service = None
    http = None
    try:
        with console.status(f"loading {m.name}…") if console.is_terminal else contextlib.nullcontext():
            loaded = load_model(m, n_threads, settings)
        start = Start(machine=machine_facts(r.hw),
                      digests={role: f.get("sha256") for role, f in model_record(req.chosen, settings)[1].items()})
        service, app = open_service(m, settings, start)
        go_live(service, app, loaded, m, settings, n_threads, start)
        http = HttpThread(app, sock)
        http.start()
        yield f"{settings.scheme}://127.0.0.1:{settings.port}"
    finally:
        if http is not None:
            http.stop()
        if service is not None:
            shutdown(service, loaded)
        elif loaded is not None:
            loaded.close()
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


def model_record(chosen: Chosen, settings: ServeSettings) -> tuple[str, dict]:
    """The served name (the preset's, else "custom") and role -> {"ref", "path", "sha256"} for a revision, as far as the files can be found and hashed
    (a missing file is recorded as its reference: the start then fails and says why). A selection that
    does not parse (an unknown preset) raises: that is bad input, not a revision."""
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
