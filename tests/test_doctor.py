"""`specdeck doctor`: each check on a good and a broken case, and the whole list on this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket

import pytest
from conftest import REAL_CACHE, run_cli

from app.build.isa import read_cpu
from app.build.smoke import SmokeResult
from app.commands import doctor as D
from app.gguf.info import read_model_info
from app.plan.hardware import Driver, Gpu, Hardware
from app.plan.planner import PlanRequest, make_plan

GiB = 1024**3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RTX = Gpu(0, "NVIDIA GeForce RTX 4090", 24 * GiB, 23 * GiB, 0, 41, 450.0, "8.9")


def test_gpu_with_a_cpu_build_is_a_failure_that_names_the_fix():
    c = D.check_gpu((RTX,), Driver("560.35.03", "12.6"), gpu_build=False)
    assert c.status == "fail" and "CPU build" in c.summary and "install.sh --cuda" in c.fix
    assert "560.35.03" in c.summary and "41 °C" in c.summary and "450 W" in c.summary
    ok = D.check_gpu((RTX,), Driver("560.35.03", "12.6"), gpu_build=True)
    assert ok.status == "ok" and "23.0 GiB free of 24.0 GiB" in ok.summary and "CUDA 12.6" in ok.summary
    cuda13 = {"context": {"nvcc": "Build cuda_13.4.r13.4/compiler.38855100_0"}}
    old = D.check_gpu((RTX,), Driver("560.35.03", "12.6"), gpu_build=True, record=cuda13)
    assert old.status == "fail" and "CUDA 13" in old.summary and "driver" in old.fix
    assert D.check_gpu((RTX,), Driver("580.65.06", "13.0"), gpu_build=True, record=cuda13).status == "ok"
    assert D.check_gpu((), None, gpu_build=False).status == "ok"
    assert D.check_gpu((), None, gpu_build=True).status == "warn"


def test_build_isa_against_the_cpu():
    cpu = read_cpu()
    record = {"rung": "native", "cmake_args": "", "context": {"cpu": cpu.fingerprint()}, "skipped": []}
    assert D.check_build(record, "CPU : SSE3 = 1 | AVX2 = 1 |", cpu).status == "ok"
    foreign = type(cpu)("x86_64", "Old Xeon", frozenset({"sse3", "avx", "avx2"}))
    bad = D.check_build(record, "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 |", foreign)
    assert bad.status == "fail" and "AVX512" in bad.summary and "AMX_INT8" in bad.summary and "--rebuild" in bad.fix
    other = {**record, "context": {"cpu": "x86_64:AMD EPYC 9R14:avx2"}}
    assert D.check_build(other, "CPU : AVX2 = 1 |", cpu).status == "fail"
    assert D.check_build(None, "CPU : AVX2 = 1 |", cpu).status == "warn"


def test_smoke_check():
    assert D.check_smoke(SmokeResult(True, "decoded")).status == "ok"
    bad = D.check_smoke(SmokeResult(False, "the build died with SIGILL", "SIGILL"))
    assert bad.status == "fail" and "SIGILL" in bad.summary


class FakeStatvfs:
    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, path: str):
        return os.statvfs_result((4096, 4096, 10**9, self.free // 4096, self.free // 4096, 0, 0, 0, 0, 255))


def test_disk_against_one_and_a_half_times_what_is_left_to_pull(tmp_path):
    assert D.check_disk(tmp_path, 16 * GiB, 0, FakeStatvfs(30 * GiB)).status == "ok"
    small = D.check_disk(tmp_path, 16 * GiB, 0, FakeStatvfs(20 * GiB))
    assert small.status == "fail" and "24.0 GiB" in small.summary and "HF_HOME" in small.fix
    assert D.check_disk(tmp_path / "not" / "yet", 0, 17 * GiB, FakeStatvfs(1 * GiB)).status == "ok"  # all pulled


def test_disk_on_a_real_small_filesystem(tmp_path):
    """A real filesystem too small for the files: a 16 MiB tmpfs where one can be mounted, else /dev/shm's size."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.system(f"mount -t tmpfs -o size=16m tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        c = D.check_disk(mnt, 64 * 2**20, 0)
        assert c.status == "fail" and str(mnt) in c.summary
        assert D.check_disk(mnt, 4 * 2**20, 0).status == "ok"
    finally:
        os.system(f"umount {mnt}")


def test_models_by_record(tmp_path):
    ok = D.ModelState("target", "t", "verified", tmp_path, 1)
    assert D.check_models([ok]).status == "ok"
    assert D.check_models([ok, D.ModelState("draft", "d", "absent", None, 1)]).status == "warn"
    bad = D.check_models([ok, D.ModelState("draft", "d", "unverified", tmp_path, 1)])
    assert bad.status == "fail" and "pull --verify d" in bad.fix


def test_pair_and_plan_checks(tiny):
    t, d, mismatch = (read_model_info(p) for p in (tiny.target, tiny.draft, tiny.mismatch))
    assert D.check_pair(t, d).status == "ok"
    bad = D.check_pair(t, mismatch)
    assert bad.status == "fail" and "300" in bad.summary
    hw = Hardware((), 24 * GiB, 20 * GiB, 2)
    assert D.check_plan(lambda: make_plan(t, d, PlanRequest(), hw, 2048), 2048).status == "ok"
    tight = Hardware((), 24 * GiB, 20 * GiB, 2)
    failing = D.check_plan(lambda: make_plan(t, d, PlanRequest(device="cpu", ram=64 * 2**20), tight, 2048), 2048)
    assert failing.status in ("fail", "warn"), failing


def test_busy_port_and_free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = D.check_port("127.0.0.1", port)
    assert busy.status == "fail" and "in use" in busy.summary
    assert D.check_port("127.0.0.1", port).status == "ok"


def test_exposure_needs_a_key_off_loopback():
    assert D.check_exposure("127.0.0.1", False).status == "ok"
    assert D.check_exposure("0.0.0.0", False).status == "fail"
    assert D.check_exposure("0.0.0.0", True).status == "ok"


def test_key_file_permissions(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-local-1\n")
    key.chmod(0o600)
    assert D.check_key_file(key).status == "ok"
    key.chmod(0o644)
    bad = D.check_key_file(key)
    assert bad.status == "fail" and "readable by every user" in bad.summary and "chmod 600" in bad.fix
    assert D.check_key_file(tmp_path / "missing").status == "fail"
    empty = tmp_path / "empty"
    empty.write_text("")
    assert D.check_key_file(empty).status == "fail"


def test_config_parses_or_names_the_problem(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[serve]\nport = 8123\n")
    assert D.check_config(good, True).status == "ok"
    bad = tmp_path / "bad.toml"
    bad.write_text("[serve]\nport = 'eighty'\n")
    c = D.check_config(bad, True)
    assert c.status == "fail" and "port" in c.summary
    assert D.check_config(tmp_path / "none.toml", False).status == "ok"


def test_directories_writable(tmp_path):
    assert D.check_dirs({"cache": tmp_path / "c"}).status == "ok"
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.geteuid() == 0:  # root writes anywhere: a file in the way of the directory instead
            (tmp_path / "file").write_text("")
            c = D.check_dirs({"logs": tmp_path / "file" / "logs"})
        else:
            c = D.check_dirs({"logs": ro / "logs"})
        assert c.status == "fail" and "not writable" in c.summary
    finally:
        ro.chmod(0o700)


def test_bad_flag_and_bad_config(tiny, tmp_path):
    r = run_cli("doctor", "--target", str(tiny.target), "--port", "0")
    assert r.returncode != 0 and "error: bad setting port" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[serve\nport = 1")
    r = run_cli("doctor", "--target", str(tiny.target), "--config", str(bad), "--port", str(_free_port()))
    assert r.returncode == 1 and "✗ config" in r.stdout, r.stdout + r.stderr


def test_doctor_cli_on_the_tiny_pair_json_and_broken_cases(tiny, tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(0o644)
    r = run_cli("doctor", "--target", str(tiny.target), "--draft", str(tiny.draft), "--json",
                "--host", "0.0.0.0", "--api-key-file", str(key))
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] is False and status["key file"] == "fail" and status["smoke decode"] == "ok", status
    assert {"gpu", "build", "smoke decode", "ram", "disk", "models", "pair", "plan", "port", "exposure", "config",
            "directories"} <= set(status)
    assert "Traceback" not in r.stderr
    key.chmod(0o600)
    r = run_cli("doctor", "--target", str(tiny.target), "--draft", str(tiny.draft))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "✓ smoke decode" in r.stdout and "failed" in r.stdout.splitlines()[-1]


def test_doctor_names_the_chat_template_fallback_and_the_file_that_overrides_it(gemma_270m, tmp_path):
    from app.chat.fallback import NOTE

    r = run_cli("doctor", "--target", str(gemma_270m), "--json", "--port", str(_free_port()))
    check = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["chat template"]
    assert check["status"] == "warn" and check["summary"] == NOTE, check
    own = tmp_path / "gemma.jinja"
    own.write_text("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}")
    r = run_cli("doctor", "--target", str(gemma_270m), "--json", "--port", str(_free_port()), "--chat-template-file", str(own))
    check = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["chat template"]
    assert check["status"] == "ok" and str(own) in check["summary"], check


@pytest.mark.real
def test_whole_doctor_on_this_machine_exits_0(real_pair):
    """The default preset, pulled and verified: every check passes (warnings allowed), nothing re-hashed."""
    records = REAL_CACHE / "verified.json"
    before = records.read_text()
    r = run_cli("doctor", "coder-1.5b", "--port", str(_free_port()), env={"SPECDECK_HOME": str(REAL_CACHE)})
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("gpu", "build", "smoke decode", "ram", "disk", "models", "pair", "plan", "port", "directories"):
        assert any(line.startswith(("✓ " + name, "! " + name)) for line in r.stdout.splitlines()), name
    assert "verified (by record, not re-hashed)" in r.stdout
    assert records.read_text() == before


@pytest.mark.real
def test_doctor_finds_a_corrupted_record(real_pair, tmp_path):
    """A verification record that no longer matches its file is a failure naming `pull --verify`."""
    home = tmp_path / "specdeck"
    shutil.copytree(REAL_CACHE, home, symlinks=True, ignore=shutil.ignore_patterns("staging", "headers", "wheels", "cuda-build", "logs", "*.bin"),
                    copy_function=os.link)
    data = json.loads((home / "verified.json").read_text())
    for entry in data.values():
        entry["mtime_ns"] += 1  # the file looks changed since it was hashed
    for path in list(data):
        data[str(path).replace(str(REAL_CACHE), str(home))] = data.pop(path)
    (home / "verified.json").unlink()  # a hard link to the real record: never write through it
    (home / "verified.json").write_text(json.dumps(data))
    r = run_cli("doctor", "coder-1.5b", "--json", "--port", str(_free_port()), env={"SPECDECK_HOME": str(home)})
    report = json.loads(r.stdout)
    models = next(c for c in report["checks"] if c["name"] == "models")
    assert r.returncode == 1 and models["status"] == "fail" and "pull --verify" in models["fix"], models


def test_up_stops_at_the_first_failed_check_before_loading(tiny, tmp_path):
    """`up` runs the doctor's machine checks first: a key file every user can read stops it with that line."""
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(0o644)
    r = run_cli("up", "--target", str(tiny.target), "--draft", str(tiny.draft), "--port", str(_free_port()),
                "--api-key-file", str(key))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: key file:" in r.stderr and "readable by every user" in r.stderr and "chmod 600" in r.stderr
    assert "[2/7]" not in r.stderr and "load models" not in r.stderr and "Traceback" not in r.stderr
