"""The Hugging Face hub as a source: metadata, cache lookup and download, all through huggingface-hub.

Settings (endpoint, token, cache, offline) are read from the environment when each call is made,
so HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE all apply.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tqdm.auto import tqdm

from .errors import DownloadError, SourceUnavailable
from .settings import HubSettings

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
    commit: str | None


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
        return DownloadError(
            f"{f.repo}: repository not found on {hub.endpoint} (or private: set HF_TOKEN)"
        )
    if isinstance(err, _UNREACHABLE):
        return SourceUnavailable(f"hub unreachable ({hub.endpoint}): {type(err).__name__}")
    if isinstance(err, HfHubHTTPError):
        status = err.response.status_code if err.response is not None else "?"
        return SourceUnavailable(f"hub answered HTTP {status} for {f.label}")
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
    etag = (meta.etag or "").lower()
    return HubMetadata(meta.size, etag if SHA256_RE.match(etag) else None, meta.commit_hash)


def cached_file(f: HubFile, hub: HubSettings) -> Path | None:
    """The file in the hub cache for this revision, if it is there (no network)."""
    found = try_to_load_from_cache(f.repo, f.file, cache_dir=hub.cache_dir, revision=f.revision)
    return Path(found) if isinstance(found, str) and os.path.exists(found) else None


def download(f: HubFile, hub: HubSettings, tqdm_class: type[tqdm] | None = None) -> Path:
    """Download into the hub cache (huggingface-hub resumes a dropped connection with Range)."""
    try:
        path = hf_hub_download(
            f.repo,
            f.file,
            revision=f.revision,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            token=hub.token,
            etag_timeout=hub.hub_etag_timeout,
            tqdm_class=tqdm_class,
        )
    except Exception as e:  # noqa: BLE001
        raise _translate(f, hub, e) from None
    return Path(path)


def evict(path: Path) -> None:
    """Remove a cached file that failed verification: its snapshot link and the blob behind it."""
    blob = path.resolve()
    if path.is_symlink():
        path.unlink(missing_ok=True)
    if blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)
