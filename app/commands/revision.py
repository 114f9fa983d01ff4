"""Recorded starts and last-known-good fallback for `serve` and `up`, and the commands over the
revisions: `specdeck config history` and `specdeck rollback [REV]`.

    settings and thresholds parse (else: one line, no revision)
    -> the models are located and hashed, the revision recorded (or found: same configuration)
    -> start; once healthy and its smoke request passed, the revision is good
    -> a start that fails before that: one line saying what failed and a non-zero exit; with
       --fallback (the installed service's unit passes it), the last good revision of the same
       deployment (bind address, port, TLS) starts at once instead, recorded as serving with the
       fallback, which /v1/status and /metrics show. A stop during start-up is no failure.
"""

from __future__ import annotations

import argparse
import json
import os

from pydantic import BaseModel
from rich.markup import escape
from rich.table import Table

from app.commands.common import alert_settings, config_path, console, out, serve_settings
from app.commands.serve import check_pins, model_record, serve_once, server_logging
from app.commands.start_request import Chosen, NamedModel, StartRequest, UpOptions, fixed_plan
from app.commands.up import up_once
from app.errors import SpecdeckError
from app.ops.alerts import AlertSettings
from app.ops.container import container_facts, image_ref
from app.ops.revisions import Revision, RevisionStore
from app.server import sdnotify
from app.server.settings import ServeSettings
from app.settings import paths

RECORD_VERSION = 2


class StartRecord(BaseModel):
    """What a revision records of a start besides its effective server settings and thresholds: a
    versioned, typed record (never argparse's names). `load` also reads the records written before
    it (version 1: the command line's Namespace as it was)."""

    version: int = RECORD_VERSION
    chosen: Chosen = Chosen()
    plan: dict = {}  # the planner's inputs the user fixed (PlanRequest fields; None: the planner chooses)
    up: UpOptions | None = None
    models: list[NamedModel] = []  # several models by name: the set a rollback starts again

    @classmethod
    def of(cls, req: StartRequest, command: str) -> StartRecord:
        return cls(chosen=req.chosen, plan=req.plan, up=req.up if command == "up" else None, models=req.models)

    @classmethod
    def load(cls, data: dict, command: str) -> StartRecord:
        if data.get("version") == RECORD_VERSION:
            return cls(**data)
        if "version" in data:
            raise SpecdeckError(f"a revision record of version {data['version']} (this specdeck reads {RECORD_VERSION})")
        old = argparse.Namespace(**{**UpOptions().model_dump(), **data})
        return cls(chosen=Chosen.of(old), plan=fixed_plan(old), up=UpOptions.of(old) if command == "up" else None)

    def request(self, settings: ServeSettings, alerts: AlertSettings) -> StartRequest:
        """The start this record makes again."""
        return StartRequest(chosen=self.chosen, plan=self.plan, up=self.up or UpOptions(), settings=settings,
                            alerts=alerts, models=self.models)


def store() -> RevisionStore:
    return RevisionStore(paths().state)


def settings_json(settings: ServeSettings, alerts: AlertSettings | None) -> dict:
    """The effective settings a revision records, and the container image it ran in (if any: a
    rollback then names the image to run)."""
    return {"serve": settings.model_dump(mode="json", exclude={"api_key"}),
            "alerts": (alerts or AlertSettings()).model_dump(mode="json"),
            "api_key_set": bool(settings.api_key or settings.api_key_file), "image": container_facts()}


def _runner(command: str):
    return up_once if command == "up" else serve_once


def baseline_acceptance(name: str) -> float | None:
    """The saved baseline's acceptance for this preset, if there is one (the acceptance alert's anchor)."""
    from app.ops.baseline import default_path

    try:
        data = json.loads(default_path(paths().state, name).read_text(encoding="utf-8"))
        value = data["figures"].get("acceptance")
        return float(value) if value is not None else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _start(rev: Revision, req: StartRequest, failed: Revision | None = None, reason: str | None = None) -> int:
    """Start revision `rev`; once healthy and smoked it is marked good and recorded as serving (with
    the failed revision it stands in for, if it is a fallback)."""
    from app.server.model_start import Start

    st = store()
    if req.settings.pins:  # the files as they are now (a rollback's too) against the config's pins
        check_pins(model_record(req)[1], req.settings.pins)
    st.started(rev)
    status_line = f"fallback from revision {failed.number}: {reason}" if failed is not None else ""

    def good() -> None:
        st.mark_good(rev, start.plan)
        st.set_current(rev, fallback_from=failed, reason=reason)

    start = Start(alerts=req.alerts, baseline_acceptance=baseline_acceptance(rev.name), on_good=good,
                  timeout=req.settings.start_timeout,
                  revision=rev.number, digests={role: m.get("sha256") for role, m in rev.models.items()},
                  status_line=status_line,
                  fallback={"from": failed.number, "reason": reason} if failed is not None else None)
    return _runner(rev.command)(req, start)


def run_revisioned(args: argparse.Namespace, command: str) -> int:
    """`serve` / `up`: record this start's revision, start it, fall back to the last good one if it fails."""
    from app.server.serve import StartFailed

    req = StartRequest.of(args, serve_settings(args), alert_settings(args), config_path(args))
    fallback = bool(getattr(args, "fallback", False))
    st = store()
    name, models = model_record(req)
    record = StartRecord.of(req, command).model_dump(mode="json")
    rev = st.record(command, record, settings_json(req.settings, req.alerts), models, name)
    good_before = rev.good_at
    try:
        return _start(rev, req)
    except (StartFailed, SpecdeckError) as e:
        reason = e.message
        if rev.good_at != good_before:
            raise  # it became good (mark_good stamps `rev`), served, then stopped: not a failed start
        st.mark_failed(rev, reason)
        if not fallback:  # what the user named failed: say so, serve nothing else
            raise
        good = st.last_good(exclude=rev.number, like=rev)
        if good is None:
            none = f"no earlier revision on {rev.summary().rsplit(' on ', 1)[-1]} was good to fall back to"
            e.hint = f"{e.hint}; {none}" if e.hint else none
            raise
    line = f"revision {rev.number} failed ({reason}); now serving revision {good.number}: {good.summary()}"
    console.print(f"[red]{escape(line)}[/]", soft_wrap=True)
    sdnotify.notify(f"STATUS={line}"[:400])
    return start_revision(good, failed=rev, reason=reason)


def _revision_request(rev: Revision) -> StartRequest:
    """The revision's recorded start and settings; the API key comes from where it came then (the
    key file it names, else SPECDECK_API_KEY), never from the record."""
    serve = dict((rev.settings or {}).get("serve") or {})
    for key in ("api_key_file", "threads"):  # flags of their own in records written before they were settings
        if serve.get(key) is None and rev.args.get(key) is not None:
            serve[key] = rev.args[key]
    try:
        record = StartRecord.load(rev.args, rev.command)
        settings = ServeSettings(**serve, api_key=os.environ.get("SPECDECK_API_KEY") or None)
        alerts = AlertSettings(**((rev.settings or {}).get("alerts") or {}))
    except SpecdeckError as e:
        raise SpecdeckError(f"revision {rev.number}: {e.message}") from None
    except Exception as e:  # noqa: BLE001 - a record from another version
        raise SpecdeckError(f"revision {rev.number}'s settings no longer parse: {e}") from None
    if rev.settings.get("api_key_set") and not settings.keyring():
        raise SpecdeckError(f"revision {rev.number} was served with an API key; none is set now",
                            hint="set SPECDECK_API_KEY or keep the key file it names")
    return record.request(settings, alerts)


def start_revision(rev: Revision, failed: Revision | None = None, reason: str | None = None) -> int:
    req = _revision_request(rev)
    st = store()
    try:
        return _start(rev, req, failed, reason)
    except SpecdeckError as e:
        st.mark_failed(rev, e.message)
        raise SpecdeckError(f"revision {rev.number} failed too: {e.message}",
                            hint="see `specdeck config history`; fix the configuration and start again") from None


# -- the commands --------------------------------------------------------------------------------

def cmd_config_history(args: argparse.Namespace) -> int:
    st = store()
    revs = st.all()
    current = st.current() or {}
    good = st.last_good()
    if args.json:
        out.print_json(json.dumps({"current": current, "last_good": good.number if good else None,
                                   "revisions": [r.__dict__ for r in revs]}))
        return 0
    if not revs:
        out.print("no revisions yet: `specdeck serve` or `specdeck up` records one at each new configuration")
        return 0
    table = Table(title=f"configuration revisions ({st.dir})")
    for col in ("rev", "status", "created", "configuration", "starts", "last failure"):
        table.add_column(col, overflow="fold")
    for r in revs:
        mark = " (serving)" if current.get("revision") == r.number else ""
        mark += " (last good)" if good and good.number == r.number else ""
        style = {"good": "green", "failed": "red"}.get(r.status, "yellow")
        ran_in = image_ref((r.settings or {}).get("image"))
        table.add_row(str(r.number), f"[{style}]{r.status}[/]{mark}", r.created.replace("T", " ")[:19],
                      escape(r.summary() + (f"; image {ran_in}" if ran_in else "")), str(r.starts), escape(r.failure or "-"))
    out.print(table)
    if current.get("fallback"):
        fb = current["fallback"]
        out.print(f"[yellow]revision {current['revision']} serves as the fallback from revision {fb['from']}: "
                  f"{escape(str(fb.get('reason')))}[/]", soft_wrap=True)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    server_logging()
    return run_revisioned(args, "serve")


def cmd_up(args: argparse.Namespace) -> int:
    server_logging()
    return run_revisioned(args, "up")


def cmd_rollback(args: argparse.Namespace) -> int:
    st = store()
    if args.revision is not None:
        rev = st.get(args.revision)
    else:
        current = (st.current() or {}).get("revision")
        rev = st.last_good(exclude=current)
        if rev is None:
            raise SpecdeckError("there is no good revision to roll back to" + (f" other than {current}" if current else ""),
                                hint="see `specdeck config history`")
    server_logging()
    console.print(f"starting revision {rev.number}: {rev.summary()}", soft_wrap=True)
    ran_in, here = image_ref((rev.settings or {}).get("image")), image_ref(container_facts())
    if ran_in and ran_in != here:
        console.print(f"[yellow]revision {rev.number} ran in the image {ran_in}; this runs in {here or 'no container'}: "
                      f"to start it as it was, podman run {ran_in}[/]", soft_wrap=True)
    return _start(rev, _revision_request(rev))
