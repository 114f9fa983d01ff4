"""The llama.cpp build: the smoke decode on this machine, the ISA check, and install.sh's ladder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.build import ladder
from app.build.info import build_record, cpu_buffers, system_info
from app.build.isa import build_sets, read_cpu, unsupported
from app.build.smoke import SmokeResult, run_smoke

ROOT = Path(__file__).resolve().parent.parent
INTEL_AMX = "flags\t\t: fpu sse3 ssse3 avx avx2 fma f16c bmi2 avx512f avx512_vnni avx_vnni amx_bf16 amx_tile amx_int8\nmodel name\t: Intel(R) Xeon(R) Processor\n"
AMD = "flags\t\t: fpu sse3 ssse3 avx avx2 fma f16c bmi2 avx512f avx512_vnni\nmodel name\t: AMD EPYC 9R14\n"


def test_smoke_decode_runs_on_this_machine_and_says_what_it_built():
    """The installed build decodes here; the report names its instruction sets next to the CPU's."""
    r = run_smoke(sys.executable, gpu=False)
    cpu = read_cpu()
    sets = build_sets(r.system_info)
    print(f"\nCPU: {cpu.model}; advertises {' '.join(cpu.sets)}\nbuild uses: {' '.join(sets)}\n"
          f"record: {json.dumps({k: (build_record() or {}).get(k) for k in ('rung', 'cmake_args', 'skipped')})}\n"
          f"weights went to: {r.buffers}")
    assert r.ok, r.summary
    assert r.devices == ("cpu",) and "AVX" in sets or cpu.machine != "x86_64"
    assert unsupported(sets, cpu) == (), f"the build uses sets this CPU does not advertise: {unsupported(sets, cpu)}"
    assert sets == build_sets(system_info())  # the child saw the same library this process loads
    for buf in cpu_buffers():  # every extra buffer the planner counts is one llama.cpp really filled
        assert r.buffers.get(buf, 0) > 0, (buf, r.buffers)


def test_the_settled_build_is_recorded_for_this_cpu():
    rec = build_record()
    if rec is None:
        pytest.skip("llama-cpp-python was not installed by install.sh here")
    assert rec["context"]["cpu"] == read_cpu().fingerprint(), "the venv's build was recorded on another CPU"
    assert rec["rung"] in {r.name for r in ladder.rungs_for("cpu", read_cpu())} | {"cuda-native", "cuda-native-no-amx", "cuda-portable-avx2"}


def test_a_child_killed_by_sigill_is_named(tmp_path):
    """run_smoke reads the signal from the exit status: what a CPU without the instruction gives."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nkill -ILL $$\n")
    fake.chmod(0o755)
    r = run_smoke(str(fake), gpu=False)
    assert not r.ok and r.signal == "SIGILL" and "instruction this CPU cannot execute" in r.summary


def _cpu(text: str, tmp_path: Path, machine: str = "x86_64"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "cpuinfo"
    p.write_text(text)
    cpu = read_cpu(p)
    return type(cpu)(machine, cpu.model, cpu.flags)


def test_rungs_by_cpu(tmp_path):
    intel, amd, arm = _cpu(INTEL_AMX, tmp_path), _cpu(AMD, tmp_path), _cpu("Features\t: fp asimd\n", tmp_path, "aarch64")
    assert [r.name for r in ladder.rungs_for("cpu", intel)] == ["native", "native-no-amx", "portable-avx2"]
    assert [r.name for r in ladder.rungs_for("cpu", amd)] == ["native", "portable-avx2"]
    assert [r.name for r in ladder.rungs_for("cpu", arm)] == ["native"]
    no_amx = ladder.rungs_for("cpu", intel)[1]
    assert "-mno-amx-tile" in no_amx.cmake_args and "-mno-amx-int8" in no_amx.cmake_args
    cuda = ladder.rungs_for("cuda", intel, "-DFOO=1", "86;89")
    assert all("-DGGML_CUDA=on" in r.cmake_args and "CMAKE_CUDA_ARCHITECTURES=86;89" in r.cmake_args
               and r.cmake_args.endswith("-DFOO=1") for r in cuda)
    assert intel.advertises_amx and not amd.advertises_amx


def test_wheel_keys_differ_by_cpu_and_flags(tmp_path):
    """A wheel built for one CPU or one set of flags is never found under another's key."""
    intel, amd = _cpu(INTEL_AMX, tmp_path), _cpu(AMD, tmp_path)
    base = {"llama_cpp_python": "0.3.36", "python": "cp311-x86_64", "cc": "gcc 12"}
    native = ladder.rungs_for("cpu", intel)[0]
    k_intel = native.key({**base, "cpu": intel.fingerprint()})
    k_amd = native.key({**base, "cpu": amd.fingerprint()})
    k_flags = ladder.rungs_for("cpu", intel, "-DGGML_BLAS=ON")[0].key({**base, "cpu": intel.fingerprint()})
    assert len({k_intel, k_amd, k_flags}) == 3
    assert k_intel == native.key({**base, "cpu": intel.fingerprint()})  # and the same machine finds its own


class _Run:
    """Smoke results in order: a real SmokeResult per rung, as run_smoke returns them."""

    def __init__(self, *results: SmokeResult) -> None:
        self.results, self.calls = list(results), 0

    def __call__(self, python: str, gpu: bool) -> SmokeResult:
        self.calls += 1
        return self.results.pop(0)


def _climb(tmp_path, run, cpu_text=INTEL_AMX, amx_runs=None):
    rungs = ladder.rungs_for("cpu", _cpu(cpu_text, tmp_path), amx_runs=amx_runs)
    built, said = [], []

    def obtain(python, rung, folder, say):
        built.append(rung.name)
        folder.mkdir(parents=True, exist_ok=True)
        return folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"

    record = ladder.climb(rungs, {"cpu": "x"}, tmp_path / "cache", sys.executable, False, said.append,
                          obtain=obtain, install=lambda *a: None, run=run)
    return record, built, said


def test_climb_rebuilds_without_amx_after_sigill_and_remembers(tmp_path):
    sigill = SmokeResult(False, "the build died with SIGILL (an instruction this CPU cannot execute) at its first decode", "SIGILL")
    ok = SmokeResult(True, "decoded", system_info="CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")
    record, built, said = _climb(tmp_path, _Run(sigill, ok))
    assert built == ["native", "native-no-amx"] and record["rung"] == "native-no-amx"
    assert record["skipped"][0]["rung"] == "native" and "SIGILL" in record["skipped"][0]["why"]
    assert any("died with SIGILL" in s and "rebuilding without AMX" in s for s in said)
    # a second install on the same CPU does not build the native wheel again
    record, built, said = _climb(tmp_path, _Run(ok))
    assert built == ["native-no-amx"] and any("skipping the native build" in s for s in said)


def test_rungs_follow_the_amx_probe(tmp_path):
    intel, amd = _cpu(INTEL_AMX, tmp_path), _cpu(AMD, tmp_path)
    names = lambda cpu, runs: [r.name for r in ladder.rungs_for("cpu", cpu, amx_runs=runs)]  # noqa: E731
    assert names(intel, False) == ["native-no-amx", "portable-avx2"]  # advertised, cannot run: no native build
    assert names(intel, True) == names(intel, None) == ["native", "native-no-amx", "portable-avx2"]
    assert names(amd, False) == ["native", "portable-avx2"]  # nothing advertised: nothing to leave out
    assert [r.name for r in ladder.rungs_for("cuda", intel, amx_runs=False)] == ["cuda-native-no-amx", "cuda-portable-avx2"]


def test_climb_on_a_cpu_whose_amx_cannot_run_compiles_once_and_says_no_crash(tmp_path):
    ok = SmokeResult(True, "decoded", system_info="CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")
    record, built, said = _climb(tmp_path, _Run(ok), amx_runs=False)
    assert built == ["native-no-amx"] and record["rung"] == "native-no-amx" and record["skipped"] == []
    assert not any("died" in s for s in said)
    sigill = SmokeResult(False, "died", "SIGILL")  # the ladder still catches any other crash
    record, built, said = _climb(tmp_path / "b", _Run(sigill, ok), amx_runs=False)
    assert built == ["native-no-amx", "portable-avx2"] and record["rung"] == "portable-avx2"


def test_the_amx_probe_answers_on_this_machine():
    """The real probe, compiled and run here: a CPU that does not advertise AMX cannot run it (the
    kernel refuses the tile state); one that does gets a yes or a no, never 'unknown'."""
    from app.build.amx import probe_amx

    cpu = read_cpu()
    if cpu.machine != "x86_64":
        pytest.skip("AMX is x86-64's")
    p = probe_amx()
    print(f"\n{cpu.model}: advertises AMX {cpu.advertises_amx}; probe: {p}")
    assert p.runs is not None, p.why
    if not cpu.advertises_amx:
        assert p.runs is False and "kernel refuses" in p.why


def test_the_amx_probe_reads_a_faulting_tile_instruction_and_a_clean_exit():
    """Without the kernel's permission a tile instruction faults on every x86-64 Linux machine (with
    or without AMX): the probe's reading of a signal, for real; and the other answers."""
    from app.build.amx import REFUSED, SOURCE, probe_amx, verdict

    if read_cpu().machine != "x86_64":
        pytest.skip("AMX is x86-64's")
    asked = "if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)"
    assert asked in SOURCE
    p = probe_amx(source=SOURCE.replace(asked, "if (0)"))
    assert p.runs is False and ("SIGILL" in p.why or "SIGSEGV" in p.why), p
    assert verdict(0).runs is True and verdict(REFUSED).runs is False and verdict(1).runs is None
    assert probe_amx(cc="no-such-cc").runs is None


def test_the_amx_probe_asks_the_compiler_where_the_cpu_runs_amx():
    """ggml's tile configuration compiled as llama.cpp compiles it: with the configuration left out
    the first tilezero dies (what GCC 12 does to ggml's), and the probe says so. Only where the CPU
    runs tile instructions (an Intel Xeon with AMX): elsewhere the CPU's answer comes first."""
    from app.build.amx import CONFIG_SOURCE, SOURCE, compile_and_run, probe_amx, verdict

    if read_cpu().machine != "x86_64":
        pytest.skip("AMX is x86-64's")
    cpu = verdict(compile_and_run("cc", ["-O0"], SOURCE, ".c", 60))
    if not cpu.runs:
        assert probe_amx().why == cpu.why  # the compiler is not asked
        pytest.skip(f"this CPU does not run AMX ({cpu.why})")
    unconfigured = CONFIG_SOURCE.replace("_tile_loadconfig(&c);", "")
    assert unconfigured != CONFIG_SOURCE
    p = probe_amx(config_source=unconfigured)
    assert p.runs is False and "drops ggml's tile configuration" in p.why and "SIGILL" in p.why
    print(f"\nthis machine: {probe_amx()}")


def test_climb_falls_back_to_portable_avx2_then_gives_up(tmp_path):
    sigill = SmokeResult(False, "died", "SIGILL")
    ok = SmokeResult(True, "decoded")
    record, built, _ = _climb(tmp_path / "a", _Run(sigill, sigill, ok))
    assert built == ["native", "native-no-amx", "portable-avx2"] and record["rung"] == "portable-avx2"
    with pytest.raises(ladder.BuildError, match="no llama-cpp-python build decodes"):
        _climb(tmp_path / "b", _Run(sigill, sigill, sigill))


def test_climb_stops_on_a_failure_another_rung_would_not_fix(tmp_path):
    broken = SmokeResult(False, "the smoke decode failed (exit 1): ImportError: libgomp.so.1")
    with pytest.raises(ladder.BuildError, match="libgomp"):
        _climb(tmp_path, _Run(broken))


def test_ladder_cli_on_an_installed_build_only_smoke_tests(tmp_path):
    """install.sh's step on a venv whose build is recorded for this CPU: no rebuild, one smoke decode."""
    if build_record() is None:
        pytest.skip("llama-cpp-python was not installed by install.sh here")
    r = subprocess.run([sys.executable, "-m", "app.build.ladder", "--python", sys.executable, "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CMAKE_ARGS": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already installed for this CPU" in r.stdout and "compiling" not in r.stdout


def test_pypi_cuda_libraries_are_loaded_before_llama_cpp(tmp_path):
    """A toolkit laid out as NVIDIA's PyPI packages do (nvidia/cu13/lib): its libraries are dlopened
    globally when specdeck is imported, so a CUDA backend linked against them resolves."""
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "site" / "nvidia" / "__init__.py").write_text("")
    src = tmp_path / "cudart.c"
    src.write_text("int specdeck_fake_cudart(void) { return 13; }\n")
    r = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libcudart.so.13"), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no C compiler: {r.stderr[:200]}")
    code = ("import ctypes, app.build.cudalibs as c; print(c.preload()); "
            "print(ctypes.CDLL(None).specdeck_fake_cudart())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"})
    assert out.returncode == 0, out.stderr
    assert "libcudart.so.13" in out.stdout and out.stdout.strip().endswith("13")
