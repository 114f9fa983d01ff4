"""Downloads from a local server that speaks the hub's protocol (HF_ENDPOINT), through huggingface-hub."""

import hashlib
import os

import pytest
from rich.console import Console
from support.fakehub import FakeHub

from app.errors import DiskSpaceError, DownloadError, IntegrityError, SourceUnavailable
from app.models.catalog import ModelSpec
from app.models.fetch import Fetcher
from app.settings import hub_settings, paths

REPO, FILE = "acme/tiny-GGUF", "tiny.gguf"


@pytest.fixture
def hub(monkeypatch):
    h = FakeHub()
    url = h.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    yield h
    h.stop()


@pytest.fixture
def payload(tiny):
    return tiny.target.read_bytes()


def fetcher(**kw) -> Fetcher:
    return Fetcher(paths(), hub_settings(), Console(quiet=True), **kw)


def spec(content: bytes | None = None, **kw) -> ModelSpec:
    base = dict(name="tiny", repo=REPO, file=FILE)
    if content is not None:
        base.update(size=len(content), sha256=hashlib.sha256(content).hexdigest())
    return ModelSpec(**{**base, **kw})


def gets(h: FakeHub) -> list:
    return [r for r in h.requests if r[0] == "GET"]


def test_download_verifies_and_records(hub, payload):
    hub.add(REPO, FILE, payload)
    got = fetcher().ensure(spec(payload))
    assert got.source == "hub" and got.path.read_bytes() == payload
    assert got.sha256 == hashlib.sha256(payload).hexdigest()
    assert str(got.path).startswith(os.environ["HF_HOME"])  # the hub's own cache, under HF_HOME
    # the second time: found in the cache, trusted from the record, no GET
    n = len(gets(hub))
    again = fetcher().ensure(spec(payload))
    assert again.source == "hub cache" and not again.hashed_now and len(gets(hub)) == n


def test_unpinned_file_uses_the_hubs_lfs_digest(hub, payload):
    hub.add(REPO, FILE, payload)
    got = fetcher().ensure(spec())
    assert got.sha256 == hashlib.sha256(payload).hexdigest()
    # --verify re-hashes against the digest the cache stores the blob under
    assert fetcher(force_verify=True).ensure(spec()).hashed_now


def test_resume_after_dropped_connection(hub):
    """huggingface-hub hands data over in 10 MiB chunks and resumes from the last whole one with Range."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    big = os.urandom(2 * DOWNLOAD_CHUNK_SIZE + 12345)
    hub.add(REPO, FILE, big, drop_after=DOWNLOAD_CHUNK_SIZE + 5000)
    got = fetcher().ensure(spec(big))
    assert got.path.read_bytes() == big
    ranges = [r[2] for r in gets(hub)]
    assert ranges == [None, f"bytes={DOWNLOAD_CHUNK_SIZE}-"]


def test_resume_across_runs(hub):
    """A run that dies mid-download leaves its bytes; the next run asks only for the rest."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    big = os.urandom(2 * DOWNLOAD_CHUNK_SIZE + 999)
    f = hub.add(REPO, FILE, big, drop_after=DOWNLOAD_CHUNK_SIZE + 10, status_after_drop=503)
    with pytest.raises(SourceUnavailable, match="HTTP 503"):
        fetcher().ensure(spec(big))
    assert fetcher().on_disk(spec(big)) is None  # nothing that looks complete
    f.status = None
    got = fetcher().ensure(spec(big))
    assert got.path.read_bytes() == big
    assert gets(hub)[-1][2] == f"bytes={DOWNLOAD_CHUNK_SIZE}-"


def test_wrong_bytes_never_become_the_file(hub, payload):
    bad = bytearray(payload)
    bad[-5] ^= 0xFF
    hub.add(REPO, FILE, payload, served=bytes(bad))
    with pytest.raises(IntegrityError) as e:
        fetcher().ensure(spec())  # unpinned: the hub's advertised digest is the reference
    assert "SHA-256 mismatch" in e.value.message and hashlib.sha256(payload).hexdigest() in e.value.message
    blobs = [p for p in (paths().home.parent / "hf").rglob("blobs/*") if p.suffix != ".lock"]
    snapshots = [p for p in (paths().home.parent / "hf").rglob("snapshots/*/*")]
    assert blobs == [] and snapshots == []


def test_pinned_digest_differs_from_hub(hub, payload):
    hub.add(REPO, FILE, payload)
    with pytest.raises(DownloadError, match="the catalogue pins"):
        fetcher().ensure(spec(payload, sha256="0" * 64))
    assert gets(hub) == []


def test_short_body_is_a_size_error(hub, payload):
    hub.add(REPO, FILE, payload, served=payload[:-10])
    with pytest.raises((DownloadError, IntegrityError)):
        fetcher().ensure(spec())
    assert not list((paths().home.parent / "hf").rglob("snapshots/*/*"))


def test_server_error_is_reported_per_source(hub, payload):
    hub.add(REPO, FILE, payload, status=500)
    with pytest.raises(SourceUnavailable, match="HTTP 500"):
        fetcher().ensure(spec(payload))


def test_gated_repo_says_what_to_do(hub, payload):
    hub.add(REPO, FILE, payload)
    hub.gated.add(REPO)
    with pytest.raises(DownloadError) as e:
        fetcher().ensure(spec(payload))
    assert "gated" in e.value.message and "HF_TOKEN" in e.value.message and "licence" in e.value.message


def test_missing_repo_and_file(hub, payload):
    hub.add(REPO, FILE, payload)
    with pytest.raises(DownloadError, match="no file 'other.gguf'"):
        fetcher().ensure(spec(file="other.gguf"))
    with pytest.raises(DownloadError, match="repository not found"):
        fetcher().ensure(spec(repo="acme/nothing"))


def test_disk_space_is_checked_before_downloading(hub, payload):
    hub.add(REPO, FILE, payload, advertised_size=2**55)
    with pytest.raises(DiskSpaceError, match="not enough disk space"):
        fetcher().ensure(spec())
    assert gets(hub) == []


def test_offline_uses_only_the_cache(hub, payload, monkeypatch):
    hub.add(REPO, FILE, payload)
    with pytest.raises(DownloadError, match="offline"):
        fetcher(offline=True).ensure(spec(payload))
    assert hub.requests == []
    fetcher().ensure(spec(payload))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.requests)
    assert fetcher().ensure(spec(payload)).source == "hub cache" and len(hub.requests) == n


def test_damaged_cached_copy_is_refetched(hub, payload):
    hub.add(REPO, FILE, payload)
    first = fetcher().ensure(spec(payload))
    blob = first.path.resolve()
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(100)
        f.write(b"XXXX")
    again = fetcher().ensure(spec(payload))
    assert again.source == "hub" and again.path.read_bytes() == payload


def test_unreachable_hub_moves_on_quickly(monkeypatch, payload):
    import time

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    t = time.monotonic()
    with pytest.raises(SourceUnavailable, match="unreachable"):
        fetcher().ensure(spec(payload))
    assert time.monotonic() - t < 10
