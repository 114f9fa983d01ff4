"""`specdeck doctor`: the pre-deployment checklist, one line per check, ✓ / ! / ✗ with the fix in words.

Each check is a small function of what it looks at (passed in, so a test can hand it a busy port,
a world-readable key file, a damaged record, a small disk or a GPU next to a CPU build); `gather`
reads the real machine and runs them all. `specdeck up` runs the same list first and stops at the
first ✗. Nothing here loads a model: the smoke decode runs in a subprocess, the models are checked
by their verification records (never re-hashed) and planned from their headers, local or read
from the hub when not pulled yet.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from app.build.isa import CpuIsa, build_sets, unsupported
from app.build.smoke import SmokeResult
from app.commands.common import (
    catalog_of,
    config_path,
    make_fetcher,
    out,
    selection_of,
    serve_settings,
)
from app.commands.start_request import StartRequest
from app.drafting.kind import DrafterKind
from app.drafting.kinds import head_of
from app.errors import SpecdeckError
from app.gguf.info import ModelInfo
from app.models.fetch import Fetcher
from app.ops.container import container_facts
from app.plan.hardware import Driver, Gpu, Hardware, detect
from app.plan.planner import Plan

Status = Literal["ok", "warn", "fail"]
MARKS = {"ok": "✓", "warn": "!", "fail": "✗"}
GiB = 1024**3
ORDER = ("gpu", "build", "smoke decode", "ram", "disk", "models", "pair", "plan", "together", "port", "exposure", "key file",
         "config", "directories", "container")
DISK_FACTOR = 1.5  # free disk wanted for models not pulled yet: the files plus room for the partial and staging




@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    summary: str
    fix: str | None = None
    data: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "fix": self.fix, "data": self.data}


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


# -- GPU, driver and the build -----------------------------------------------------------------

def _toolkit_major(record: dict | None) -> int | None:
    """The CUDA major version the build was compiled with, from install.sh's record ("... cuda_13.4.r13.4 ...")."""
    import re

    m = re.search(r"cuda_(\d+)\.\d+", str((record or {}).get("context", {}).get("nvcc", "")))
    return int(m.group(1)) if m else None


def check_gpu(gpus: tuple[Gpu, ...], driver: Driver | None, gpu_build: bool, record: dict | None = None) -> Check:
    """The NVIDIA driver and CUDA runtime against the llama.cpp build; every GPU's memory, heat and power.
    A build compiled with a newer CUDA major than the driver supports cannot run on it."""
    cards = [f"GPU {g.index} {g.name}: {_gib(g.free)} free of {_gib(g.total)}"
             + (f", {g.temperature_c} °C" if g.temperature_c is not None else "")
             + (f", power limit {g.power_limit_w:.0f} W" if g.power_limit_w is not None else "") for g in gpus]
    data = {"gpus": [g.__dict__ for g in gpus], "driver": driver.version if driver else None,
            "cuda": driver.cuda if driver else None, "build": "cuda" if gpu_build else "cpu"}
    drv = f"driver {driver.version}, CUDA {driver.cuda or '?'}; " if driver else ""
    if gpus and not gpu_build:
        return Check("gpu", "fail", f"{drv}{'; '.join(cards)}; but llama-cpp-python is a CPU build: the GPU would sit idle",
                     "rebuild for the GPU: bash install.sh --cuda --rebuild (it takes the CUDA toolkit from PyPI if nvcc is missing)",
                     data)
    built, supports = _toolkit_major(record), driver.cuda if driver else None
    if gpus and built and supports and int(supports.split(".")[0]) < built:
        return Check("gpu", "fail", f"{drv}the build was compiled with CUDA {built}, newer than this driver supports",
                     f"update the NVIDIA driver to one for CUDA {built} (R580+ for 13), or install a CUDA "
                     f"{supports.split('.')[0]} toolkit and run bash install.sh --cuda --rebuild", data)
    if gpus:
        return Check("gpu", "ok", f"{drv}CUDA build; " + "; ".join(cards), data=data)
    if gpu_build:
        return Check("gpu", "warn", "a CUDA build, but no NVIDIA GPU is visible (driver not loaded, or no card): it runs on the CPU",
                     "check `nvidia-smi`; on a machine without a GPU, bash install.sh --cpu --rebuild", data)
    return Check("gpu", "ok", "no NVIDIA GPU; CPU build (the CPU preset applies)", data=data)


def check_build(record: dict | None, system_info: str, cpu: CpuIsa) -> Check:
    """The instruction sets the build uses against what this CPU runs, and how install.sh settled on it."""
    sets = build_sets(system_info)
    used = [s for s in sets if s not in ("LLAMAFILE", "OPENMP", "REPACK")]
    data = {"build_sets": list(sets), "cpu_sets": list(cpu.sets), "cpu": cpu.model, "record": record}
    missing = unsupported(sets, cpu)
    if missing:
        return Check("build", "fail", f"the build uses {', '.join(missing)}, which this CPU ({cpu.model}) does not have",
                     "rebuild for this CPU: bash install.sh --rebuild", data)
    uses = ", ".join(used) or "no vector extensions"
    if record is None:
        return Check("build", "warn", f"uses {uses}; not installed by install.sh, so its build was never proved on this CPU",
                     "bash install.sh (it builds, smoke-tests and records the build)", data)
    if record.get("context", {}).get("cpu") not in (None, cpu.fingerprint()):
        return Check("build", "fail", f"built by install.sh for another CPU ({record['context']['cpu'].split(':')[1]})",
                     "rebuild for this CPU: bash install.sh --rebuild", data)
    left_out = [s for s in cpu.sets if s.startswith("AMX") and "AMX_INT8" not in sets]
    note = f"; left out: {', '.join(left_out)} ({', '.join(x['rung'] for x in record.get('skipped', []))} died)" \
        if left_out and record.get("skipped") else ""
    return Check("build", "ok", f"{record.get('rung', '?')} build ({record.get('cmake_args') or 'default flags'}); uses {uses}{note}",
                 data=data)


def check_smoke(result: SmokeResult) -> Check:
    if result.ok:
        return Check("smoke decode", "ok", result.summary, data=result.to_json())
    return Check("smoke decode", "fail", result.summary, "bash install.sh --rebuild (it climbs down to a build that decodes here)",
                 result.to_json())


# -- memory and disk ---------------------------------------------------------------------------

def check_ram(hw: Hardware, need: int | None) -> Check:
    have = f"{_gib(hw.ram_available)} available of {_gib(hw.ram_total)}"
    data = {"total": hw.ram_total, "available": hw.ram_available, "need": need}
    if need is not None and hw.ram_available < need:
        return Check("ram", "fail", f"{have}; the plan needs {_gib(need)} of host memory",
                     "close other programs, or plan a smaller context (--ctx) or fewer slots (--parallel)", data)
    return Check("ram", "ok", have + (f"; the plan needs {_gib(need)}" if need is not None else ""), data=data)


def check_disk(directory: Path, to_download: int, pulled: int,
               statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> Check:
    """Free space where models go against 1.5 x the files still to download."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = statvfs(str(probe))
    except OSError as e:
        return Check("disk", "fail", f"cannot read free space of {directory}: {e.strerror or e}", "check the path and its permissions")
    free = st.f_bavail * st.f_frsize
    need = int(to_download * DISK_FACTOR)
    data = {"directory": str(directory), "free": free, "need": need, "to_download": to_download, "pulled": pulled}
    if need and free < need:
        return Check("disk", "fail", f"{_gib(free)} free in {directory}; the models still to pull need {_gib(need)} "
                     f"(1.5 x {_gib(to_download)})", "free some space, or point HF_HOME / SPECDECK_HOME at a larger disk", data)
    what = f"{_gib(to_download)} still to pull" if to_download else "every model pulled"
    return Check("disk", "ok", f"{_gib(free)} free in {directory}; {what}", data=data)


# -- models, pair, plan ------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelState:
    role: str
    name: str
    state: str  # verified | unverified | mismatch | absent
    path: Path | None
    size: int | None


def check_models(states: list[ModelState]) -> Check:
    data = {"models": [{"role": m.role, "name": m.name, "state": m.state, "path": str(m.path) if m.path else None}
                       for m in states]}
    bad = [m for m in states if m.state in ("unverified", "mismatch")]
    if bad:
        m = bad[0]
        why = ("its verification record no longer matches the file (changed since it was verified, or never verified)"
               if m.state == "unverified" else "its recorded SHA-256 is not the catalogue's")
        return Check("models", "fail", f"{m.role} {m.name}: {why}",
                     f"specdeck pull --verify {m.name} (re-hashes it; a damaged copy is fetched again)", data)
    absent = [m for m in states if m.state == "absent"]
    if absent:
        return Check("models", "warn", "not pulled yet: " + ", ".join(f"{m.role} {m.name}" for m in absent)
                     + " (planned from the hub's headers)", "specdeck pull " + " ".join(m.name for m in absent), data)
    return Check("models", "ok", "; ".join(f"{m.role} {m.name} verified" for m in states) + " (by record, not re-hashed)",
                 data=data)


def check_pair(target: ModelInfo, draft: ModelInfo | None, head: DrafterKind | None = None) -> Check:
    """Whether the drafter can draft for this target: its kind's own check (app/drafting/)."""
    from app.drafting.kinds import KINDS

    if head is None and draft is None:
        return Check("pair", "ok", "no draft model: speculation uses prompt lookup only")
    kind = head or KINDS["draft"]
    if why := kind.check(target, draft):
        return Check("pair", "fail", why, kind.hint or None)
    if head is not None:
        return Check("pair", "ok", f"the target drafts with {head.summary}")
    return Check("pair", "ok", "the draft can serve the target (llama.cpp's rules, from the headers)")


def check_template(target: ModelInfo, given: Path | None) -> Check:
    """The chat template chat requests go through: the one given, the model's own, or the fallback."""
    from app.chat.fallback import NOTE

    if given is not None:
        return Check("chat template", "ok", f"{given} (in place of the model's own)")
    if target.vocab.chat_template:
        return Check("chat template", "ok", "the model's own")
    return Check("chat template", "warn", NOTE, "--chat-template-file FILE to chat in the model's own format")


def check_plan(make: Callable[[], Plan], wanted: int | None) -> Check:
    """The plan on the memory free now; when the wanted context does not fit, the largest that does."""
    from app.plan.planner import PlanError

    try:
        plan = make()
    except PlanError as e:
        return Check("plan", "fail", e.message, e.hint or "free GPU memory, or pick a smaller preset")
    ctx = plan.ctx
    data = {"ctx": ctx, "ctx_wanted": wanted, "used": plan.used, "budget": plan.budget, "device": plan.device,
            "parallel": plan.parallel, "shared": sum(t.bytes for t in plan.terms if t.where == "device"
                                                     and t.name in ("runtime reserve", "safety margin"))}
    line = f"{plan.device}: context {ctx:,}, {plan.parallel} slot(s), {_gib(plan.used)} of {_gib(plan.budget)}"
    if wanted and ctx < wanted:
        return Check("plan", "warn", f"the preset's {wanted:,} tokens do not fit the memory free now; {line} is the largest that does",
                     "free memory (other programs on the GPU), or accept the smaller context", data)
    return Check("plan", "ok", line, data=data)


# -- the service: port, exposure, key, config, directories ---------------------------------------

def check_port(host: str, port: int) -> Check:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return Check("port", "fail", f"{host}:{port} is already in use", "stop what listens there, or pick another --port")
            return Check("port", "fail", f"cannot bind {host}:{port}: {e.strerror or e}", "pick another --host / --port")
    return Check("port", "ok", f"{host}:{port} is free")


def check_exposure(host: str, has_key: bool) -> Check:
    from app.server.settings import is_loopback

    if is_loopback(host):
        return Check("exposure", "ok", f"binds {host} (this machine only)" + ("; API key set" if has_key else ""))
    if not has_key:
        return Check("exposure", "fail", f"binds {host}, reachable from the network, with no API key",
                     "set SPECDECK_API_KEY or --api-key-file, or bind 127.0.0.1")
    return Check("exposure", "ok", f"binds {host} with an API key")


def check_key_file(path: Path | None) -> Check:
    from app.server.keys import read_keys

    if path is None:
        return Check("key file", "ok", "no key file (the key, if any, comes from SPECDECK_API_KEY)")
    try:
        st = path.stat()
        ring = read_keys(path)
    except OSError as e:
        return Check("key file", "fail", f"cannot read {path}: {e.strerror or e}",
                     "create it with one `name key` line per client, mode 600")
    except SpecdeckError as e:
        return Check("key file", "fail", e.message, e.hint or "one `name key` line per client")
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        return Check("key file", "fail", f"{path} is readable by every user (mode {stat.S_IMODE(st.st_mode):o})",
                     f"chmod 600 {path} (or 640 with the service's group)")
    names = ", ".join(ring.names())
    return Check("key file", "ok", f"{path} (mode {stat.S_IMODE(st.st_mode):o}): {len(ring.keys)} "
                                   f"key{'s' if len(ring.keys) != 1 else ''} ({names})")


def check_config(path: Path, exists: bool) -> Check:
    from app.server.settings import load_settings

    if not exists:
        return Check("config", "ok", f"no config file at {path} (defaults, environment and flags apply)")
    try:
        load_settings(path, {})
    except SpecdeckError as e:
        return Check("config", "fail", e.message, f"fix {path}")
    return Check("config", "ok", f"{path} parses")


def check_container(facts: dict | None) -> Check:
    """Where it runs: the host, or a container and its image (labels, digest)."""
    from app.ops.container import describe

    return Check("container", "ok", "on the host (not in a container)" if facts is None else describe(facts))


def check_dirs(dirs: dict[str, Path]) -> Check:
    for label, d in dirs.items():
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, prefix=".doctor-"):
                pass
        except OSError as e:
            return Check("directories", "fail", f"{label} {d} is not writable: {e.strerror or e}",
                         "fix its owner or permissions, or point SPECDECK_HOME elsewhere")
    return Check("directories", "ok", "; ".join(f"{label} {d}" for label, d in dirs.items()) + " writable")


# -- the whole list ----------------------------------------------------------------------------

def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


def render_lines(checks: list[Check]) -> list[str]:
    """Rich markup, one line per check (and an indented fix under each ! or ✗)."""
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    width = max(len(c.name) for c in checks) if checks else 0
    lines = []
    for c in checks:
        from rich.markup import escape

        lines.append(f"[{colour[c.status]}]{MARKS[c.status]}[/] {c.name:<{width}}  {escape(c.summary)}")
        if c.fix and c.status != "ok":
            lines.append(f"  {'':<{width}}  [dim]fix:[/] {escape(c.fix)}")
    return lines


# -- gathering from the real machine -------------------------------------------------------------

@dataclass(frozen=True)
class Subject:
    """What the checks look at beyond the machine: the selection and how it would be served."""

    selection: object  # refs.Selection
    fetcher: object  # fetch.Fetcher
    host: str
    port: int
    has_key: bool
    key_file: Path | None
    config: Path
    config_given: bool
    plan_request: object  # planner.PlanRequest
    template_file: Path | None = None  # --chat-template-file (or the config's)


def machine_checks(subject: Subject, hw: Hardware, port: bool = True, smoke: bool = True) -> list[Check]:
    """The checks of the machine and the service, no model read: what `up` runs before its steps."""
    import sys

    from app.build.info import build_record, gpu_offload, system_info
    from app.build.isa import read_cpu
    from app.build.smoke import run_smoke
    from app.plan.hardware import read_driver

    f = subject.fetcher
    record = build_record()
    checks = [check_gpu(hw.gpus, read_driver(), gpu_offload(), record), check_build(record, system_info(), read_cpu())]
    if smoke:
        checks.append(check_smoke(run_smoke(sys.executable, gpu=bool(hw.gpus))))
    states = model_states(subject)
    to_pull = sum(m.size or 0 for m in states if m.state == "absent")
    checks.append(check_disk(f.hub.cache_dir, to_pull, sum(m.size or 0 for m in states if m.state != "absent")))
    if port:
        checks.append(check_port(subject.host, subject.port))
    checks += [check_exposure(subject.host, subject.has_key), check_key_file(subject.key_file),
               check_config(subject.config, subject.config.exists() or subject.config_given),
               check_dirs({"cache": f.paths.home, "logs": f.paths.log_dir}), check_container(container_facts())]
    return checks


def model_states(subject: Subject) -> list[ModelState]:
    sel = subject.selection
    out = []
    for role, ref in [("target", sel.target)] + ([("draft", sel.draft)] if sel.draft else []):
        if ref.path is not None:
            out.append(ModelState(role, str(ref.path), "local" if ref.path.is_file() else "absent", ref.path,
                                  ref.path.stat().st_size if ref.path.is_file() else None))
            continue
        path, state = subject.fetcher.record_state(ref.spec)
        out.append(ModelState(role, ref.spec.name, state, path, ref.spec.size))
    return out


def model_checks(subject: Subject, hw: Hardware) -> list[Check]:
    """Models by record, the pair and the plan from the headers (local, else the hub's)."""
    from app.gguf.info import read_model_info
    from app.plan.planner import make_plan

    states = model_states(subject)
    checks = [check_models(states)]
    sel = subject.selection
    refs = {"target": sel.target, "draft": sel.draft}
    infos: dict[str, ModelInfo] = {}
    try:
        for m in states:
            if m.state == "absent" and m.path is None and refs[m.role].spec is not None:
                infos[m.role], _ = subject.fetcher.header_info(refs[m.role].spec)
            elif m.path is not None and m.path.is_file():
                infos[m.role] = read_model_info(m.path)
            else:
                raise SpecdeckError(f"{m.name}: no such file")
    except SpecdeckError as e:
        return checks + [Check("plan", "warn", f"cannot read the headers to plan: {e.message}", e.hint), check_ram(hw, None)]
    head = head_of(sel)
    checks.append(check_pair(infos["target"], infos.get("draft"), head))
    checks.append(check_template(infos["target"], subject.template_file or getattr(sel, "chat_template_file", None)))
    plan = check_plan(lambda: make_plan(infos["target"], infos.get("draft"), subject.plan_request, hw, sel.context,
                                        head=head.rows if head else None),
                      subject.plan_request.ctx or sel.context)
    return checks + [plan, check_ram(hw, plan.data["used"] if plan.data.get("device") == "cpu" else None)]


def run_all(subject: Subject, hw: Hardware, models: list[tuple[str, Subject]] | None = None) -> list[Check]:
    """The whole list, in the order a person reads it: the build, the machine, the models, the
    service. Several models (`models`: by name): each one's model checks, named for it, and
    whether they fit together."""
    checks = machine_checks(subject, hw)
    if not models:
        checks += model_checks(subject, hw)
    else:
        for name, one in models:
            checks += [replace(c, name=f"{c.name} ({name})") for c in model_checks(one, hw)]
        checks.append(check_together([c for c in checks if c.name.startswith("plan (") and c.data]))
    return sorted(checks, key=lambda c: ORDER.index(c.name.split(" (")[0]) if c.name.split(" (")[0] in ORDER else len(ORDER))


def check_together(plans: list[Check]) -> Check:
    """Whether the models' plans fit the budget together (the reserve and margin counted once), or
    are loaded in turns."""
    if not plans:
        return Check("together", "warn", "no model could be planned")
    budget = min(c.data["budget"] for c in plans)
    shared = max(c.data.get("shared", 0) for c in plans)
    sizes = {c.name[len("plan ("):-1]: c.data["used"] - c.data.get("shared", 0) for c in plans}
    need = shared + sum(sizes.values())
    if need <= budget:
        return Check("together", "ok", f"all {len(sizes)} fit together: {_gib(need)} of {_gib(budget)}",
                     data={"need": need, "budget": budget})
    return Check("together", "warn", f"they do not fit together ({_gib(need)} of {_gib(budget)}): loaded in turns "
                 "as requests ask for them", "lower a model's ctx or parallel in its [models.NAME] section to keep "
                 "them loaded together", data={"need": need, "budget": budget})


def doctor_subject(req: StartRequest, fetcher: Fetcher) -> Subject:
    """What the checks look at, from a start request (doctor's and up's)."""
    settings = req.settings
    return Subject(selection_of(req.chosen, catalog_of(req.chosen.models)), fetcher, settings.host, settings.port,
                   bool(settings.api_key or settings.api_key_file), settings.api_key_file, req.config, req.config_given,
                   req.plan_request(), settings.chat_template_file)


def doctor_subjects(req: StartRequest, fetcher: Fetcher) -> list[tuple[str, Subject]]:
    """Each of several models' subject, by name (none with one model)."""
    from app.commands.start_request import served

    settings = req.settings
    return [(named.name, Subject(selection_of(named.chosen, catalog_of(named.chosen.models)), fetcher, settings.host,
                                 settings.port, bool(settings.api_key or settings.api_key_file), settings.api_key_file,
                                 req.config, req.config_given, req.model_plan_request(named), settings.chat_template_file))
            for named in served(req)] if req.models else []


# -- the command -------------------------------------------------------------------------------

def cmd_doctor(args: argparse.Namespace) -> int:

    try:
        settings = serve_settings(args, check=False)
    except SpecdeckError:  # a config file that does not parse has its own check; bad flags still stop here
        settings = serve_settings(args, check=False, use_config=False)
    try:
        req = StartRequest.of(args, settings, config=config_path(args))
    except SpecdeckError:  # a config file that does not parse: its own check says so (its models are not read)
        req = StartRequest.of(args, settings).model_copy(update={"config": config_path(args)})
    fetcher = make_fetcher(args.offline)
    models = doctor_subjects(req, fetcher)
    subject = models[0][1] if models else doctor_subject(req, fetcher)
    checks = run_all(subject, detect(), models)
    bad = failed(checks)
    if args.json:
        out.print_json(json.dumps({"ok": not bad, "checks": [c.to_json() for c in checks]}))
    else:
        for line in render_lines(checks):
            out.print(line, soft_wrap=True)
        warn = sum(c.status == "warn" for c in checks)
        out.print(f"{len(checks) - len(bad) - warn} ok, {warn} warning(s), {len(bad)} failed")
    return 1 if bad else 0
