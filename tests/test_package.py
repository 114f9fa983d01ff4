"""specdeck as a package: the wheel holds every subpackage and the catalogue, and runs from a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from app.build.info import build_record

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources: setuptools' build/ folder in a checkout can hold files the
    tree no longer has, which a wheel built in place would still carry."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("specdeck-*.whl")
    return whl


def test_wheel_holds_every_module_and_the_bundled_catalogue(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules and modules <= names, sorted(modules - names)
    assert "app/models/models.toml" in names  # the top-level models.toml, carried as package data
    assert zipfile.ZipFile(wheel).read("app/models/models.toml") == (ROOT / "models.toml").read_bytes()
    # the chat page and everything it loads (no Node, no CDN)
    static = {str(p.relative_to(ROOT)) for p in (ROOT / "app" / "ui" / "static").rglob("*") if p.is_file()}
    assert static and static <= names, static - names
    assert {"app/engine/engine.py", "app/server/app.py", "app/build/ladder.py"} <= names


def test_wheel_alone_in_a_fresh_venv_runs_its_commands(wheel, tiny, tmp_path):
    """Installed with the already built llama-cpp-python and nothing from the checkout: --help, models, check."""
    rec = build_record()
    if rec is None or not Path(rec["wheel"]).is_file():
        pytest.skip("no llama-cpp-python wheel recorded by install.sh on this machine")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", rec["wheel"], str(wheel)], capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    exe = env_dir / "bin" / "specdeck"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    assert run("--help").returncode == 0
    models = run("models")
    assert models.returncode == 0 and "coder-1.5b" in models.stdout and "qwen3.6-27b" in models.stdout, models.stderr
    check = run("check", "--target", str(tiny.target), "--draft", str(tiny.draft))
    assert check.returncode == 0 and "compatible" in check.stdout, check.stdout + check.stderr
    where = subprocess.run([str(py), "-c", "import app; print(app.__file__)"], capture_output=True, text=True, cwd=tmp_path)
    assert str(env_dir) in where.stdout  # the installed copy ran, not the checkout
