"""The container image's pinned inputs and labels (scripts/container.sh builds it; a build takes
minutes, so the build and podman run are a script, docs/OPERATIONS.md). Quick here: the lock files
pin what install.sh and pyproject.toml install, each by version and hash; the labels are written
from the files they describe and read back by doctor inside a container."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "deploy" / "container"
INSTALL = (ROOT / "install.sh").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_lock(name: str) -> dict[str, str]:
    """name -> version; every line must be NAME==VERSION --hash=sha256:HEX, each name once."""
    pins: dict[str, str] = {}
    for line in (LOCKS / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"{name}: not a hashed pin: {line}"
        assert canonical(m["name"]) not in pins, f"{name}: {m['name']} twice"
        pins[canonical(m["name"])] = m["version"]
    return pins


def debian_lock(role: str) -> dict[str, str]:
    pins = {}
    for line in (LOCKS / f"debian-{role}.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("=")
            assert sep and name and version, f"debian-{role}.lock: not package=version: {line}"
            pins[name] = version
    return pins


def shell_value(name: str) -> str:
    m = re.search(rf'^{name}="([^"]*)"', INSTALL, re.M)
    assert m, f"install.sh sets no {name}"
    return m.group(1)


def test_the_python_lock_pins_every_dependency_of_specdeck_at_its_version():
    lock = python_lock("requirements.lock")
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name == "llama-cpp-python":  # compiled from its sdist by the ladder, pinned by hash there
            assert canonical(req.name) not in lock
            continue
        assert canonical(req.name) in lock, f"requirements.lock lacks {req.name}"
        assert req.specifier.contains(lock[canonical(req.name)], prereleases=True), \
            f"requirements.lock has {req.name} {lock[canonical(req.name)]}, pyproject asks {req.specifier}"
    for build_req in PYPROJECT["build-system"]["requires"]:  # specdeck's own build, without isolation
        req = Requirement(build_req)
        assert req.specifier.contains(lock[canonical(req.name)])
    assert "scikit-build-core" in lock  # llama-cpp-python's build backend, without isolation


def test_the_locks_hold_what_install_sh_installs():
    lock = python_lock("requirements.lock")
    gguf = re.search(r'"gguf==([^"]+)"', INSTALL).group(1)
    nvml = shell_value("NVML_PIN").split("==", 1)[1]
    assert lock["gguf"] == gguf and lock["nvidia-ml-py"] == nvml
    cuda = python_lock("requirements-cuda.lock")
    toolkit = Requirement(shell_value("CUDA_PYPI_PINS"))
    assert toolkit.specifier.contains(cuda["cuda-toolkit"]) and cuda["nvidia-ml-py"] == nvml
    from app.build.ladder import LLAMA_SDIST_SHA256, LLAMA_VERSION
    assert shell_value("LLAMA_VERSION") == LLAMA_VERSION
    assert f"llama-cpp-python=={LLAMA_VERSION}" in PYPROJECT["project"]["dependencies"]
    assert re.fullmatch(r"[0-9a-f]{64}", LLAMA_SDIST_SHA256)
    assert 'LOCKS="$HERE/deploy/container"' in INSTALL and "--require-hashes" in INSTALL


def test_the_debian_locks_hold_the_build_and_run_packages_at_one_version_each():
    build, runtime = debian_lock("build"), debian_lock("runtime")
    for pkg in ("python3", "python3.11", "libgomp1", "ca-certificates"):
        assert pkg in runtime, f"the runtime base lacks {pkg}"
    for pkg in ("python3-venv", "gcc", "g++", "cmake", "ninja-build"):
        assert pkg in build and pkg not in runtime, pkg
    # the venv built on the build base runs on the runtime base: what both hold is one version
    differ = {p: (build[p], runtime[p]) for p in build.keys() & runtime.keys() if build[p] != runtime[p]}
    assert not differ, differ
    assert not runtime.keys() - build.keys(), runtime.keys() - build.keys()


def test_the_containerfile_runs_specdeck_as_a_service():
    text = (LOCKS / "Containerfile").read_text()
    assert 'ENTRYPOINT ["specdeck"]' in text and 'CMD ["serve"]' in text
    user = re.search(r"^USER (\S+)", text, re.M).group(1)
    assert not user.startswith(("0:", "root")) and user != "0"
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, re.M)
    assert "install.sh ${INSTALL_FLAGS}" in text and "image.json /usr/share/specdeck/image.json" in text
    from app.ops.container import IMAGE_FILE
    assert "/" + IMAGE_FILE == "/usr/share/specdeck/image.json"


def fake_sdist(path: Path, changelog: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        data = changelog.encode()
        info = tarfile.TarInfo("llama_cpp_python-0.3.36/CHANGELOG.md")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


CHANGELOG = """# Changelog

## [Unreleased]

## [0.3.36]

- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098

## [0.3.35]

- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f
"""


def labels_of(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "container_labels.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_labels_say_what_the_image_is_and_doctor_reads_them_inside(tmp_path):
    sdist = fake_sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz", CHANGELOG)
    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps({"preset": "coder-1.5b", "files": {"target": {"file": "t.gguf", "sha256": "ab" * 32}}}))
    r = labels_of("--flavour", "cuda", "--cuda-arch", "86", "--sdist", str(sdist), "--weights", str(weights))
    assert r.returncode == 0, r.stderr
    labels = json.loads(r.stdout)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert labels["org.opencontainers.image.version"] == PYPROJECT["project"]["version"]
    assert labels["org.opencontainers.image.revision"] == head
    assert labels["io.specdeck.llama-cpp.commit"] == "0c1e57098"  # 0.3.36's entry, not 0.3.35's
    assert labels["io.specdeck.flavour"] == "cuda" and labels["io.specdeck.cuda-arch"] == "86"
    assert labels["io.specdeck.llama-cpp-python.sdist.sha256"] == hashlib.sha256(sdist.read_bytes()).hexdigest()
    locks = sorted(LOCKS.glob("*.lock"))
    assert len(locks) == 4
    for lock in locks:
        assert labels[f"io.specdeck.lock.{lock.stem}"] == "sha256:" + hashlib.sha256(lock.read_bytes()).hexdigest()
    assert labels["io.specdeck.weights.target"] == "t.gguf@sha256:" + "ab" * 32

    from app.commands.doctor import check_container
    from app.ops.container import IMAGE_FILE, container_facts
    root = tmp_path / "root"
    (root / IMAGE_FILE).parent.mkdir(parents=True)
    (root / IMAGE_FILE).write_text(r.stdout)
    (root / ".dockerenv").write_text("")
    line = check_container(container_facts(root, {"SPECDECK_IMAGE": "localhost/specdeck@sha256:" + "cd" * 32})).summary
    assert "localhost/specdeck" in line and "flavour cuda" in line and "llama.cpp 0c1e57098" in line, line
    assert f"specdeck {PYPROJECT['project']['version']}" in line and "llama-cpp-python 0.3.36" in line


def test_an_sdist_whose_changelog_names_no_commit_is_refused_in_one_line(tmp_path):
    sdist = fake_sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz", CHANGELOG.replace("@0c1e57098", ""))
    r = labels_of("--flavour", "cpu", "--sdist", str(sdist))
    assert r.returncode != 0 and "names no llama.cpp commit for 0.3.36" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "not-a-tar.tar.gz").write_text("x")
    for bad in (tmp_path / "missing.tar.gz", tmp_path / "not-a-tar.tar.gz"):
        r = labels_of("--flavour", "cpu", "--sdist", str(bad))
        assert r.returncode != 0 and r.stderr.startswith("container_labels.py: error: ") and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["build", "--flavour", "gpu"], ["build", "--flavour", "cuda"], ["frobnicate"]])
def test_container_sh_refuses_bad_input_in_one_line(args):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "container.sh"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stderr.startswith("container.sh: error: ") and r.stderr.count("\n") == 1, r.stderr
