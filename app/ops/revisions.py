"""Configuration revisions: every `serve` / `up` start records what it runs (the command line, the
effective settings, the models with their digests, the plan) as a numbered revision in the state
directory, and marks it good once it is healthy and its smoke request passed. A start whose
configuration equals an earlier revision's is that revision again (a systemd restart is not a new
revision). The last good revision is what a failed start falls back to.

    <state>/revisions/0001.json ...   one file per revision
    <state>/current.json              the revision serving now, and the fallback that led to it
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.errors import SpecdeckError


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Revision:
    number: int
    command: str  # "serve" or "up"
    args: dict  # the command line as parsed: what `specdeck rollback` starts again
    settings: dict  # the effective server settings (never the API key)
    models: dict  # role -> {"ref", "path", "sha256"}
    key: str  # what makes two starts the same revision
    created: str = field(default_factory=now_iso)
    plan: dict | None = None
    status: str = "new"  # new | good | failed
    good_at: str | None = None
    failure: str | None = None  # the last failure, with its date
    starts: int = 0
    preset: str = ""  # the served name (the preset, or "custom"): what baselines are keyed by

    @property
    def name(self) -> str:
        chosen = self.args.get("chosen") or self.args  # today's record, or one of version 1 (the command line)
        return self.preset or str(chosen.get("name") or chosen.get("target") or "?")

    @property
    def deployment(self) -> tuple:
        """Where clients reach it: bind address, port and whether TLS is on."""
        serve = self.settings.get("serve") or {}
        return serve.get("host"), serve.get("port"), bool(serve.get("tls_cert"))

    def summary(self) -> str:
        order = {"target": 0, "draft": 1, "embedding": 2}
        models = ", ".join(f"{role} {Path(m.get('path') or m.get('ref') or '?').name}"
                           for role, m in sorted(self.models.items(), key=lambda kv: order.get(kv[0], 9)))
        ctx = f", context {self.plan['ctx']:,}" if self.plan else ""
        serve = self.settings.get("serve") or {}
        where = f"{serve.get('host')}:{serve.get('port')}"
        return f"{self.command} {self.name} ({models}{ctx}) on {where}"


def config_key(command: str, args: dict, settings: dict, models: dict) -> str:
    digest = {role: m.get("sha256") or m.get("path") or m.get("ref") for role, m in models.items()}
    blob = json.dumps([command, args, settings, digest], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class RevisionStore:
    def __init__(self, state: Path) -> None:
        self.dir = state / "revisions"
        self.current_file = state / "current.json"
        self.lock_file = state / ".lock"

    @contextlib.contextmanager
    def _locked(self):
        """One writer at a time (several instances may share a state directory)."""
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _path(self, number: int) -> Path:
        return self.dir / f"{number:04d}.json"

    def all(self) -> list[Revision]:
        out = []
        for p in sorted(self.dir.glob("[0-9]*.json")):
            try:
                out.append(Revision(**json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):
                continue  # a damaged record is skipped, never fatal
        return out

    def get(self, number: int) -> Revision:
        for r in self.all():
            if r.number == number:
                return r
        known = ", ".join(str(r.number) for r in self.all()) or "none yet"
        raise SpecdeckError(f"there is no revision {number} (revisions: {known})", hint="see `specdeck config history`")

    def save(self, rev: Revision) -> None:
        with self._locked():
            _write_json(self._path(rev.number), asdict(rev))

    def record(self, command: str, args: dict, settings: dict, models: dict, preset: str = "") -> Revision:
        """This start's revision: an earlier one with the same configuration, else a new number."""
        key = config_key(command, args, settings, models)
        with self._locked():
            revs = self.all()
            rev = next((r for r in reversed(revs) if r.key == key), None)
            if rev is None:
                rev = Revision(max((r.number for r in revs), default=0) + 1, command, args, settings, models, key,
                               preset=preset)
            _write_json(self._path(rev.number), asdict(rev))
        return rev

    def started(self, rev: Revision) -> None:
        rev.starts += 1
        self.save(rev)

    def mark_good(self, rev: Revision, plan: dict | None = None) -> None:
        rev.status, rev.good_at = "good", now_iso()
        rev.plan = plan if plan is not None else rev.plan
        self.save(rev)

    def mark_failed(self, rev: Revision, reason: str) -> None:
        """A revision that never served is failed; a good one keeps its status (a busy port is not
        its fault) but its last failure is kept."""
        if rev.status != "good":
            rev.status = "failed"
        rev.failure = f"{now_iso()}: {reason}"
        self.save(rev)

    def last_good(self, exclude: int | None = None, like: Revision | None = None) -> Revision | None:
        """The revision that was good most recently; with `like`, only one of the same deployment (see
        `Revision.deployment`), so a fallback never moves a client's address, port or scheme."""
        good = [r for r in self.all() if r.status == "good" and r.number != exclude
                and (like is None or r.deployment == like.deployment)]
        return max(good, key=lambda r: r.good_at or "", default=None)

    # -- which revision serves ---------------------------------------------------------------

    def set_current(self, rev: Revision, fallback_from: Revision | None = None, reason: str | None = None) -> None:
        data = {"revision": rev.number, "since": now_iso(), "pid": os.getpid()}
        if fallback_from is not None:
            data["fallback"] = {"from": fallback_from.number, "reason": reason}
        with self._locked():
            _write_json(self.current_file, data)

    def current(self) -> dict | None:
        try:
            data = json.loads(self.current_file.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def protected_paths(self) -> set[Path]:
        """Model files a good revision (or the one serving now) uses: never pruned."""
        current = (self.current() or {}).get("revision")
        keep: set[Path] = set()
        for r in self.all():
            if r.status == "good" or r.number == current:
                for m in r.models.values():
                    if m.get("path"):
                        p = Path(m["path"])
                        keep |= {p, p.resolve()}
        return keep
