"""A model's GGUF header read from the hub before its weights are downloaded.

`specdeck plan` and `specdeck doctor` need only the header and tensor table (a few MB of a 17 GB
file) to size a plan. They are fetched with HTTP range requests through huggingface-hub's own
HTTP session, auth headers and error handling (a gated repo gets the same licence message as
`pull`): first 1 MiB, then twice as much each time the tensor table runs past what was read, so the
bytes fetched stay under twice the header's size and never reach the tensors. The bytes are kept
in specdeck's cache under the file's ETag (SPECDECK_HOME/headers/), so the next plan is offline.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

from app.errors import GGUFError, SourceUnavailable
from app.gguf.header import parse_prefix
from app.gguf.info import GGUF_MAGIC, ModelInfo, read_model_info
from app.models import hub
from app.settings import HubSettings

FIRST_READ = 1 << 20
MAX_HEADER = 256 << 20  # no real header is this large (a 262K-token vocabulary needs ~10 MB)


@dataclass(frozen=True)
class RemoteHeader:
    path: Path  # the cached header bytes
    file_size: int  # of the whole file on the hub
    bytes_fetched: int  # 0 when it came from the cache
    etag: str


def _get_range(f: hub.HubFile, settings: HubSettings, start: int, end: int) -> bytes:
    url = hf_hub_url(f.repo, f.file, revision=f.revision, endpoint=settings.endpoint)
    headers = {**build_hf_headers(token=settings.token), "Range": f"bytes={start}-{end}"}
    try:
        resp = http_backoff("GET", url, headers=headers, follow_redirects=True, timeout=settings.hub_etag_timeout * 6,
                            max_retries=2)
        hf_raise_for_status(resp)
    except Exception as e:  # noqa: BLE001 - translated into specdeck's errors, as for pull
        raise hub._translate(f, settings, e) from None
    data = resp.content
    if resp.status_code == 200 and len(data) > end - start + 1:  # the server ignored Range
        data = data[start : end + 1]
    return data


def _cached_for(f: hub.HubFile, cache: Path) -> RemoteHeader | None:
    for side in sorted(cache.glob("*.gguf-header.json")) if cache.is_dir() else ():
        try:
            rec = json.loads(side.read_text())
        except (OSError, ValueError):
            continue
        path = side.with_suffix("")
        if (rec.get("repo"), rec.get("file"), rec.get("revision")) == (f.repo, f.file, f.revision) and path.is_file():
            return RemoteHeader(path, int(rec["file_size"]), 0, str(rec.get("etag", "")))
    return None


def _cache_file(cache: Path, etag: str) -> Path:
    safe = "".join(c for c in etag.strip('"') if c.isalnum() or c in "-_")[:96] or "unknown"
    return cache / f"{safe}.gguf-header"


def fetch_header(f: hub.HubFile, settings: HubSettings, cache: Path) -> RemoteHeader:
    """The file's header bytes, from the cache or the hub; raises SourceUnavailable / DownloadError / GGUFError.

    The hub is asked for the file's current ETag first; when it cannot be reached, a header cached
    earlier for the same repo, file and revision is used."""
    try:
        meta = hub.fetch_metadata(f, settings)
    except SourceUnavailable:
        cached = _cached_for(f, cache)
        if cached is None:
            raise
        return cached
    if meta.size is None:
        raise GGUFError(f"{f.label}: the hub does not say how large the file is")
    path = _cache_file(cache, meta.etag)
    side = path.with_name(path.name + ".json")
    if path.is_file() and side.is_file():
        return RemoteHeader(path, json.loads(side.read_text())["file_size"], 0, meta.etag)
    data, fetched, want = b"", 0, FIRST_READ
    while True:
        end = min(want, meta.size) - 1
        if end >= len(data):
            chunk = _get_range(f, settings, len(data), end)
            if not chunk:
                raise GGUFError(f"{f.label}: the hub sent no bytes for a range request")
            data += chunk
            fetched += len(chunk)
        if len(data) >= 4 and data[:4] != GGUF_MAGIC:
            raise GGUFError(f"{f.label}: not a GGUF file (starts with {data[:4]!r})")
        header = parse_prefix(data, f.label)
        if header is not None:
            data = data[: header.data_offset]
            break
        if len(data) >= meta.size or want >= MAX_HEADER:
            raise GGUFError(f"{f.label}: no complete GGUF header in its first {len(data):,} bytes")
        want *= 2
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".header-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
    side.write_text(json.dumps({"file_size": meta.size, "repo": f.repo, "file": f.file, "revision": f.revision,
                                "commit": meta.commit, "sha256": meta.sha256, "etag": meta.etag}))
    return RemoteHeader(path, meta.size, fetched, meta.etag)


def remote_model_info(f: hub.HubFile, settings: HubSettings, cache: Path) -> tuple[ModelInfo, RemoteHeader]:
    """ModelInfo of a file on the hub, from its header alone (as `read_model_info` gives for the local file)."""
    got = fetch_header(f, settings, cache)
    return read_model_info(got.path, file_size=got.file_size), got
