"""install.sh's llama-cpp-python step: a build that is proved to decode on this machine.

    python -m app.build.ladder --python VENV/bin/python [--kind cpu|cuda] [--cuda-arch 86;89]

Rungs, tried in order until the smoke decode passes:
  native         llama.cpp's default (-march=native): fastest, but a VM can advertise AMX it cannot run
                 (asked first, app/build/amx.py: where it cannot, this rung is left out)
  native-no-amx  the same without AMX (-mno-amx-*), only where the CPU advertises AMX
  portable-avx2  GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C, BMI2 (no AVX-512, no AMX)
With --portable only the last rung is built (an image for other machines). Every rung compiles
the same sdist, pinned by its SHA-256 (LLAMA_SDIST_SHA256); --locked builds it without pip's build
isolation, from the build requirements install.sh --locked installed with their hashes.
A rung whose smoke decode dies by a signal is remembered as failed on this CPU and skipped next
time; a failure without a signal (a compiler error, no disk) stops the climb, since another rung
would not fix it.

Wheels go to our own cache, one folder per key: the llama-cpp-python version, the Python tag,
the rung's CMake arguments (plus the user's CMAKE_ARGS), the compiler, the CUDA toolkit and
architectures, and the CPU's model and instruction-set flags. pip's own wheel cache keys on the
package version alone, so a wheel built for one CPU would be reused on another; every build here
runs with --no-cache-dir and is found again only under its own key. A portable wheel is keyed by
CPU too: simpler, and it costs one build per machine.

The settled build is recorded in VENV/specdeck-build.json (read by `specdeck doctor`).
Standard library only: this runs before specdeck's dependencies are installed.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from app.build.amx import probe_amx
from app.build.isa import CpuIsa, read_cpu

LLAMA_VERSION = "0.3.36"
# The sdist every build compiles, pinned by its hash (pip refuses another file under that version).
LLAMA_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
RECORD_NAME = "specdeck-build.json"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
PORTABLE_AVX2 = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
                 "-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF")


@dataclass(frozen=True)
class Rung:
    name: str
    cmake_args: str
    why: str  # what this rung gives up, said when the climb reaches it

    def key(self, context: dict[str, str]) -> str:
        blob = json.dumps({"rung": self.name, "cmake_args": self.cmake_args, **context}, sort_keys=True)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def rungs_for(kind: str, cpu: CpuIsa, user_cmake_args: str = "", cuda_archs: str = "",
              portable: bool = False, amx_runs: bool | None = None) -> list[Rung]:
    """The builds to try on this CPU, best first. `portable`: only the portable AVX2 build (an
    image for other x86-64 machines, e.g. scripts/container.sh's cpu flavour). `amx_runs`: the
    AMX probe's answer (app/build/amx.py); False on a CPU that advertises AMX starts without it
    (the native build would die at its first decode), None leaves the smoke decode to find out."""
    base = "-DGGML_CUDA=on" + (f" -DCMAKE_CUDA_ARCHITECTURES={cuda_archs}" if cuda_archs else "") if kind == "cuda" else ""
    prefix = f"{kind}-" if kind == "cuda" else ""

    def args(*parts: str) -> str:
        return " ".join(p for p in (base, *parts, user_cmake_args) if p)

    portable_rung = Rung(prefix + "portable-avx2", args(PORTABLE_AVX2), "a portable AVX2 build (no AVX-512, no AMX)")
    if portable and cpu.machine in ("x86_64", "AMD64"):
        return [portable_rung]
    native = Rung(prefix + "native", args(), "llama.cpp's native build")
    if cpu.machine not in ("x86_64", "AMD64"):
        return [native]
    rungs = [native]
    if cpu.advertises_amx:
        no_amx = Rung(prefix + "native-no-amx", args(f"-DCMAKE_C_FLAGS='{NO_AMX}'", f"-DCMAKE_CXX_FLAGS='{NO_AMX}'"),
                      "without AMX, which this CPU advertises")
        rungs = [no_amx] if amx_runs is False else [native, no_amx]
    rungs.append(portable_rung)
    return rungs


def _first_line(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        lines = (p.stdout or p.stderr).strip().splitlines()
        return lines[-1 if "nvcc" in cmd[0] else 0] if lines else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def build_context(python: str, cpu: CpuIsa, kind: str) -> dict[str, str]:
    """Everything besides the rung's own arguments that a compiled wheel depends on."""
    tag = subprocess.run([python, "-c", "import sys, platform; print(f'cp{sys.version_info[0]}{sys.version_info[1]}-' + platform.machine())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    ctx = {"llama_cpp_python": LLAMA_VERSION, "python": tag, "cpu": cpu.fingerprint(),
           "cc": _first_line([os.environ.get("CC", "cc"), "--version"])}
    if kind == "cuda":
        ctx["nvcc"] = _first_line([os.environ.get("CUDACXX", "nvcc"), "--version"])
    return ctx


def cache_root() -> Path:
    explicit = os.environ.get("SPECDECK_WHEEL_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeck" / "wheels"


# -- the steps (each one replaceable, for the climb's own tests) --------------------------------

def obtain_wheel(python: str, rung: Rung, folder: Path, say: Callable[[str], None], isolated: bool = True) -> Path:
    """The rung's wheel from the cache, or compiled now into it from the pinned sdist (pip checks its
    hash). `isolated=False`: its build requirements are the venv's own (install.sh --locked put
    them there, hashed), not fetched by pip for the build."""
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    if found:
        say(f"llama-cpp-python ({rung.name}): wheel from the cache ({found[-1]})")
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    logfile = folder / "build.log"
    say(f"compiling llama-cpp-python {LLAMA_VERSION} ({rung.name}: {rung.cmake_args or 'default flags'}); "
        f"6-30 minutes, log: {logfile}")
    env = {**os.environ, "CMAKE_ARGS": rung.cmake_args, "FORCE_CMAKE": "1"}
    with tempfile.TemporaryDirectory(prefix="specdeck-wheel-") as tmp, open(logfile, "w") as log:
        pinned = Path(tmp) / "llama-cpp-python.txt"
        pinned.write_text(f"llama-cpp-python=={LLAMA_VERSION} --hash=sha256:{LLAMA_SDIST_SHA256}\n")
        proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--require-hashes",
                               "--no-binary", "llama-cpp-python", *([] if isolated else ["--no-build-isolation"]),
                               "-w", tmp, "-r", str(pinned)], stdout=log, stderr=subprocess.STDOUT, env=env)
        built = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if proc.returncode != 0 or not built:
            tail = logfile.read_text(errors="replace").strip().splitlines()[-5:]
            raise BuildError(f"compiling llama-cpp-python ({rung.name}) failed: " + " | ".join(tail)[-400:])
        dest = folder / built[0].name
        shutil.move(str(built[0]), dest)
    (folder / "rung.json").write_text(json.dumps(asdict(rung), indent=1))
    return dest


def install_wheel(python: str, wheel: Path, say: Callable[[str], None]) -> None:
    for args in (["--no-deps", "--force-reinstall"], []):  # the wheel itself, then whatever it needs
        proc = subprocess.run([python, "-m", "pip", "install", "--quiet", *args, str(wheel)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"pip could not install {wheel.name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def smoke(python: str, gpu: bool):
    from app.build.smoke import (
        run_smoke,  # the child needs numpy, gguf and llama_cpp; this module does not
    )

    return run_smoke(python, gpu=gpu)


class BuildError(Exception):
    pass


# -- the climb --------------------------------------------------------------------------------

def climb(rungs: list[Rung], context: dict[str, str], cache: Path, python: str, gpu: bool,
          say: Callable[[str], None], obtain=obtain_wheel, install=install_wheel, run=smoke) -> dict:
    """Try each rung until one decodes; return the record of the build that settled."""
    skipped: list[dict[str, str]] = []
    for i, rung in enumerate(rungs):
        key = rung.key(context)
        folder = cache / key
        failed = folder / "failed.json"
        nxt = rungs[i + 1] if i + 1 < len(rungs) else None
        if failed.exists():
            why = json.loads(failed.read_text()).get("why", "failed before")
            skipped.append({"rung": rung.name, "why": why})
            say(f"skipping the {rung.name} build: on this CPU {why} (remembered in {failed})")
            continue
        wheel = obtain(python, rung, folder, say)
        install(python, wheel, say)
        result = run(python, gpu)
        if result.ok:
            return {"llama_cpp_python": LLAMA_VERSION, "rung": rung.name, "cmake_args": rung.cmake_args, "key": key,
                    "wheel": str(wheel), "context": context, "smoke": result.summary, "system_info": result.system_info,
                    "buffers": result.buffers, "gpu_offload": result.gpu_offload, "skipped": skipped,
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        if result.signal is None:
            raise BuildError(f"the {rung.name} build does not decode: {result.summary}")
        why = result.summary
        folder.mkdir(parents=True, exist_ok=True)
        failed.write_text(json.dumps({"rung": rung.name, "why": why, "signal": result.signal}))
        skipped.append({"rung": rung.name, "why": why})
        if nxt is None:
            break
        say(f"the {rung.name} build died with {result.signal} at its first decode on this CPU: rebuilding {nxt.why}")
    raise BuildError("no llama-cpp-python build decodes on this machine: " + "; ".join(f"{s['rung']}: {s['why']}" for s in skipped))


def installed_record(python: str) -> tuple[Path, dict | None]:
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True).stdout.strip()
    path = Path(prefix) / RECORD_NAME
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError):
        return path, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.build.ladder", description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the venv's interpreter to build for")
    ap.add_argument("--kind", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--cuda-arch", default="", help="CMAKE_CUDA_ARCHITECTURES, e.g. 86 or '86;89'")
    ap.add_argument("--no-gpu-smoke", action="store_true", help="smoke-decode on the CPU only (no GPU here)")
    ap.add_argument("--rebuild", action="store_true", help="forget remembered failures and cached wheels for this machine")
    ap.add_argument("--check", action="store_true", help="only say whether the installed build is this CPU's and decodes")
    ap.add_argument("--portable", action="store_true", help="only the portable AVX2 build (for other x86-64 machines)")
    ap.add_argument("--locked", action="store_true", help="build with the venv's own build requirements (no isolation)")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(f"==> {msg}", flush=True)

    cpu = read_cpu()
    amx = probe_amx() if cpu.advertises_amx and not args.portable else None
    rungs = rungs_for(args.kind, cpu, os.environ.get("CMAKE_ARGS", "").strip(), args.cuda_arch, portable=args.portable,
                      amx_runs=amx.runs if amx is not None else None)
    if amx is not None and amx.runs is False and not args.check:
        say(f"the build goes without AMX, which this CPU advertises: {amx.why}")
    context = build_context(args.python, cpu, args.kind)
    cache = cache_root()
    if args.rebuild:
        for r in rungs:
            shutil.rmtree(cache / r.key(context), ignore_errors=True)
    gpu = args.kind == "cuda" and not args.no_gpu_smoke
    record_path, record = installed_record(args.python)
    keys = {r.key(context) for r in rungs}
    if record and record.get("key") in keys and not args.rebuild:
        result = smoke(args.python, gpu)
        if result.ok:
            say(f"llama-cpp-python {LLAMA_VERSION} ({record['rung']}) already installed for this CPU; smoke decode: {result.summary}")
            say(_isa_line(result.system_info, cpu))
            return 0
        say(f"the installed llama-cpp-python no longer decodes ({result.summary}): installing again")
    elif args.check:
        say("the installed llama-cpp-python was not built by install.sh for this CPU" if record else
            "no install.sh record of the installed llama-cpp-python")
    if args.check:
        return 1
    try:
        record = climb(rungs, context, cache, args.python, gpu, say,
                       obtain=functools.partial(obtain_wheel, isolated=not args.locked))
    except BuildError as e:
        print(f"install.sh: error: {e}", file=sys.stderr)
        return 1
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    how = f"after {', '.join(s['rung'] for s in record['skipped'])} died" if record["skipped"] else "first try"
    say(f"llama-cpp-python {LLAMA_VERSION}: the {record['rung']} build decodes here ({how}); "
        f"flags: {record['cmake_args'] or 'default'}; recorded in {record_path}")
    say(_isa_line(record["system_info"], cpu))
    return 0


def _isa_line(system_info: str, cpu: CpuIsa) -> str:
    from .isa import build_sets

    sets = [x for x in build_sets(system_info) if x not in ("LLAMAFILE", "OPENMP")]
    left = [x for x in cpu.sets if x not in sets and x.startswith(("AMX", "AVX"))]
    return (f"build uses {' '.join(sets) or 'no vector extensions'}; {cpu.model} advertises {' '.join(cpu.sets)}"
            + (f"; not used: {' '.join(left)}" if left else ""))


if __name__ == "__main__":
    sys.exit(main())
