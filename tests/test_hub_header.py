"""Plan before download: GGUF headers read from the hub with range requests (a local server speaking its protocol)."""

from __future__ import annotations

import hashlib
import json
import mmap

import pytest
from conftest import run_cli
from support.fakehub import FakeHub

from app.gguf.info import read_model_info
from app.gguf.synthetic import SHAPES, write_sparse
from app.models.hub import HubFile
from app.models.remote_header import FIRST_READ, fetch_header, remote_model_info
from app.plan.hardware import Hardware
from app.plan.planner import PlanRequest, make_plan
from app.settings import hub_settings, paths

GiB = 1024**3
HW = Hardware((), 24 * GiB, 20 * GiB, 2)
TARGET_SIZE, DRAFT_SIZE = 16_817_244_384, 532_517_120


@pytest.fixture
def hub(monkeypatch):
    h = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", h.start())
    yield h
    h.stop()


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """The 27B preset's target and draft as sparse files of their true sizes (headers with 248K-token vocabularies)."""
    d = tmp_path_factory.mktemp("standins")
    return (write_sparse(d / "target.gguf", SHAPES["qwen3.6-27b"], TARGET_SIZE),
            write_sparse(d / "draft.gguf", SHAPES["qwen3.5-0.8b"], DRAFT_SIZE))


def _serve(hub: FakeHub, repo: str, name: str, path) -> mmap.mmap:
    f = open(path, "rb")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the file's bytes, never read whole
    hub.add(repo, name, mm, advertised_sha=hashlib.sha256(name.encode()).hexdigest())  # not hashing 16 GB
    return mm


def test_remote_header_plans_exactly_as_the_local_file_and_reads_only_the_header(hub, standins):
    target, draft = standins
    _serve(hub, "acme/big-GGUF", "big.gguf", target)
    _serve(hub, "acme/small-GGUF", "small.gguf", draft)
    cache = paths().headers
    t_remote, t_got = remote_model_info(HubFile("acme/big-GGUF", "big.gguf"), hub_settings(), cache)
    d_remote, d_got = remote_model_info(HubFile("acme/small-GGUF", "small.gguf"), hub_settings(), cache)
    t_local, d_local = read_model_info(target), read_model_info(draft)
    for req in (PlanRequest(device="cuda", vram=24 * GiB), PlanRequest(device="cuda", vram=24 * GiB, ctx=110_000),
                PlanRequest(device="cuda", vram=24 * GiB, ctx=32768, parallel=2)):
        assert make_plan(t_remote, d_remote, req, HW, 110_000).to_json() == make_plan(t_local, d_local, req, HW, 110_000).to_json()
    # bounded: the header and tensor table (at most twice, by the doubling), never the tensors
    for got, local in ((t_got, t_local), (d_got, d_local)):
        assert local.data_offset <= got.bytes_fetched <= max(2 * local.data_offset, FIRST_READ)
        assert got.file_size == local.file_size and got.path.stat().st_size == local.data_offset
    assert hub.body_bytes == t_got.bytes_fetched + d_got.bytes_fetched < 64 * 2**20
    assert all(r[2] and r[2].startswith("bytes=") and not r[2].endswith("-") for r in hub.requests if r[0] == "GET")


def test_header_is_cached_and_used_when_the_hub_is_gone(hub, tiny):
    hub.add("acme/tiny-GGUF", "tiny.gguf", tiny.target.read_bytes())
    f = HubFile("acme/tiny-GGUF", "tiny.gguf")
    first = fetch_header(f, hub_settings(), paths().headers)
    assert first.bytes_fetched > 0
    n = len([r for r in hub.requests if r[0] == "GET"])
    again = fetch_header(f, hub_settings(), paths().headers)
    assert again.bytes_fetched == 0 and len([r for r in hub.requests if r[0] == "GET"]) == n
    hub.server.shutdown()  # the hub is gone: the cached header is used
    offline = fetch_header(f, hub_settings(), paths().headers)
    assert offline.path == first.path and offline.file_size == tiny.target.stat().st_size


def _catalog(tmp_path, gated: bool = False) -> str:
    toml = tmp_path / "models.toml"
    toml.write_text(f"""
default_gpu_preset = "big"
default_cpu_preset = "big"
[models.big-q4]
repo = "acme/big-GGUF"
file = "big.gguf"
size = {TARGET_SIZE}
{"gated = true" if gated else ""}
[models.small-q4]
repo = "acme/small-GGUF"
file = "small.gguf"
size = {DRAFT_SIZE}
[presets.big]
target = "big-q4"
draft = "small-q4"
context = 110000
hardware = "gpu-24gb"
description = "a 27B-shaped stand-in"
""")
    return str(toml)


def test_plan_command_before_download(hub, standins, tmp_path):
    target, draft = standins
    _serve(hub, "acme/big-GGUF", "big.gguf", target)
    _serve(hub, "acme/small-GGUF", "small.gguf", draft)
    r = run_cli("--models", _catalog(tmp_path), "plan", "big", "--device", "cuda", "--vram", "24GiB", "--json")
    assert r.returncode == 0, r.stderr
    remote = json.loads(r.stdout)
    assert "not pulled yet; planned from its GGUF header on the hub" in r.stderr
    local = make_plan(read_model_info(target), read_model_info(draft), PlanRequest(device="cuda", vram=24 * GiB), HW, 110_000)
    assert remote["ctx"] == local.ctx and remote["used"] == local.used and remote["fits"]
    # and offline, from the cache, with the hub stopped
    hub.server.shutdown()
    r = run_cli("--models", _catalog(tmp_path), "plan", "big", "--device", "cuda", "--vram", "24GiB", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["used"] == local.used, r.stderr


def test_gated_repo_gets_the_licence_message(hub, standins, tmp_path):
    target, draft = standins
    _serve(hub, "acme/big-GGUF", "big.gguf", target)
    _serve(hub, "acme/small-GGUF", "small.gguf", draft)
    hub.gated.add("acme/big-GGUF")
    r = run_cli("--models", _catalog(tmp_path, gated=True), "plan", "big", "--device", "cuda", "--vram", "24GiB")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "acme/big-GGUF is gated: accept its licence" in r.stderr and "HF_TOKEN" in r.stderr


def test_not_a_gguf_on_the_hub_is_one_line(hub, tmp_path):
    hub.add("acme/big-GGUF", "big.gguf", b"<html>not a model</html>" * 100)
    hub.add("acme/small-GGUF", "small.gguf", b"x" * 100)
    r = run_cli("--models", _catalog(tmp_path), "plan", "big")
    assert r.returncode != 0 and "not a GGUF file" in r.stderr and "Traceback" not in r.stderr
