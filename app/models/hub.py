"""The Hugging Face hub as a source: metadata, cache lookup and download, through huggingface-hub.

huggingface-hub 2.x resumes a dropped connection within one call but deletes its temporary file
when the call fails, so a 16 GB download cut by Ctrl-C would start again from zero. specdeck keeps
the unfinished bytes in a partial file next to the cache's blobs, resumes from it with `Range`
(huggingface-hub's `http_get` does the transfer), verifies it, and only then moves it into the
cache's documented layout (blobs/<etag>, snapshots/<commit>/<file>, refs/<revision>).

Settings (endpoint, token, cache, offline) are read from the environment when each call is made,
so HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE all apply.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx2
from filelock import FileLock
from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import build_hf_headers
from tqdm.auto import tqdm

from app.errors import DownloadError, SourceUnavailable
from app.settings import HubSettings

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_UNREACHABLE = (httpx2.TransportError, OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    revision: str = "main"

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}@{self.revision}"


@dataclass(frozen=True)
class HubMetadata:
    size: int | None
    sha256: str | None  # the LFS object id; None for a non-LFS file
    commit: str
    etag: str


def _translate(f: HubFile, hub: HubSettings, err: Exception) -> Exception:
    """Turn huggingface-hub's exceptions into one clear line."""
    if isinstance(err, GatedRepoError):
        return DownloadError(
            f"{f.repo} is gated: accept its licence at {hub.endpoint}/{f.repo} and set HF_TOKEN "
            f"to a token of that account",
            hint="then run the same command again" if hub.token else "HF_TOKEN is not set",
        )
    if isinstance(err, RevisionNotFoundError):
        return DownloadError(f"{f.repo}: revision '{f.revision}' not found on {hub.endpoint}")
    if isinstance(err, EntryNotFoundError) and not isinstance(err, LocalEntryNotFoundError):
        return DownloadError(f"{f.repo}: no file '{f.file}' at revision '{f.revision}'")
    if isinstance(err, RepositoryNotFoundError):
        return DownloadError(f"{f.repo}: repository not found on {hub.endpoint} (or private: set HF_TOKEN)")
    if isinstance(err, _UNREACHABLE):
        return SourceUnavailable(f"hub unreachable ({hub.endpoint}): {type(err).__name__}")
    if isinstance(err, HfHubHTTPError):
        status = err.response.status_code if err.response is not None else "?"
        return SourceUnavailable(f"hub answered HTTP {status} for {f.label}")
    if isinstance(err, OSError):  # e.g. huggingface-hub's size consistency check
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return DownloadError(f"{f.label}: download failed: {first}")
    return err


def _url(f: HubFile, hub: HubSettings) -> str:
    return hf_hub_url(f.repo, f.file, revision=f.revision, endpoint=hub.endpoint)


def fetch_metadata(f: HubFile, hub: HubSettings) -> HubMetadata:
    """HEAD the file on the hub: size, LFS SHA-256, commit. Fails fast when offline."""
    if hub.hub_offline:
        raise SourceUnavailable("offline mode (HF_HUB_OFFLINE=1)")
    try:
        meta = get_hf_file_metadata(_url(f, hub), token=hub.token, timeout=hub.hub_etag_timeout)
    except Exception as e:  # noqa: BLE001 - translated into our own error types
        raise _translate(f, hub, e) from None
    if not meta.etag or not meta.commit_hash:
        raise SourceUnavailable(f"hub gave no ETag or commit for {f.label}")
    etag = meta.etag.lower()
    return HubMetadata(meta.size, etag if SHA256_RE.match(etag) else None, meta.commit_hash, meta.etag)


def cached_file(f: HubFile, hub: HubSettings) -> Path | None:
    """The file in the hub cache for this revision, if it is there (no network)."""
    found = try_to_load_from_cache(f.repo, f.file, cache_dir=hub.cache_dir, revision=f.revision)
    return Path(found) if isinstance(found, str) and os.path.exists(found) else None


def _storage(f: HubFile, hub: HubSettings) -> Path:
    return hub.cache_dir / repo_folder_name(repo_id=f.repo, repo_type="model")


def partial_path(f: HubFile, hub: HubSettings, meta: HubMetadata) -> Path:
    """Where an unfinished download lives between runs (never a name the cache would load)."""
    return _storage(f, hub) / "blobs" / f"{meta.etag}.specdeck-partial"


def download_partial(f: HubFile, hub: HubSettings, meta: HubMetadata, tqdm_class: type[tqdm] | None = None) -> Path:
    """Download to the partial file, resuming from whatever an earlier run left there.

    huggingface-hub's `http_get` does the transfer: auth headers, redirects, `Range` requests,
    and retries of a dropped connection within the run.
    """
    partial = partial_path(f, hub, meta)
    partial.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(partial) + ".lock"):
        if meta.size is not None and partial.exists() and partial.stat().st_size > meta.size:
            partial.unlink()  # not a prefix of this file
        with open(partial, "ab") as out:
            done = out.tell()
            try:
                http_get(
                    _url(f, hub),
                    out,
                    resume_size=done,
                    headers=build_hf_headers(token=hub.token),
                    expected_size=meta.size,
                    displayed_filename=f.file,
                    tqdm_class=tqdm_class,
                )
            except Exception as e:  # noqa: BLE001
                raise _translate(f, hub, e) from None
    return partial


def install_in_cache(f: HubFile, hub: HubSettings, meta: HubMetadata, partial: Path) -> Path:
    """Move a verified download into the hub cache's layout, so huggingface-hub finds it too."""
    storage = _storage(f, hub)
    blob = storage / "blobs" / meta.etag
    os.replace(partial, blob)
    pointer = storage / "snapshots" / meta.commit / f.file
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.unlink(missing_ok=True)
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks on this filesystem: the cache then holds a copy
        shutil.copyfile(blob, pointer)
    if f.revision != meta.commit:
        ref = storage / "refs" / f.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(meta.commit)
    return pointer


def evict(path: Path) -> None:
    """Remove a cached file that failed verification: its snapshot link and the blob behind it."""
    blob = path.resolve()
    if path.is_symlink():
        path.unlink(missing_ok=True)
    if blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)
