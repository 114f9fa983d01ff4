#!/usr/bin/env python3
"""The OCI labels of specdeck's image, as JSON (scripts/container.sh puts them on the image and in
/usr/share/specdeck/image.json, which `specdeck doctor` reads inside the container).

    python3 scripts/container_labels.py --flavour cpu --sdist llama_cpp_python-0.3.36.tar.gz
        [--cuda-arch 86] [--weights weights.json]

What it is: specdeck's version (pyproject.toml) and commit (git HEAD, the tree the image is built
from), the llama.cpp commit the pinned llama-cpp-python sdist vendors (its CHANGELOG's entry for
that version), the sdist's SHA-256, the build flavour, and the SHA-256 of each lock file
(deploy/container/*.lock). With --weights: the files the image carries, by SHA-256.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.build.ladder import LLAMA_VERSION  # noqa: E402  (both standard library only)
from app.models.integrity import sha256_file  # noqa: E402

LOCKS = ROOT / "deploy" / "container"
PREFIX = "io.specdeck."


def llama_cpp_commit(sdist: Path, version: str) -> str:
    """The llama.cpp commit named by the sdist's CHANGELOG under its own version ("update llama.cpp
    to ggml-org/llama.cpp@<sha>"); the sdist carries no git history."""
    try:
        tar = tarfile.open(sdist)
    except (OSError, tarfile.TarError) as e:
        raise SystemExit(f"container_labels.py: error: {sdist}: not a readable sdist ({e})") from None
    with tar:
        member = next((m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/CHANGELOG.md")), None)
        if member is None:
            raise SystemExit(f"container_labels.py: error: {sdist.name}: no CHANGELOG.md")
        text = tar.extractfile(member).read().decode("utf-8", "replace")
    section = re.search(rf"^## \[{re.escape(version)}\]\s*$(.*?)(?=^## \[|\Z)", text, re.M | re.S)
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section.group(1)) if section else None
    if found is None:
        raise SystemExit(f"container_labels.py: error: {sdist.name}: its CHANGELOG names no llama.cpp commit for {version}")
    return found.group(1)


def git_head() -> str:
    p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "unknown"


def labels(flavour: str, sdist: Path, cuda_arch: str = "", weights: Path | None = None) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {
        "org.opencontainers.image.title": "specdeck",
        "org.opencontainers.image.description": project["description"],
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.revision": git_head(),
        "org.opencontainers.image.licenses": project.get("license", ""),
        PREFIX + "flavour": flavour,
        PREFIX + "llama-cpp-python.version": LLAMA_VERSION,
        PREFIX + "llama-cpp-python.sdist.sha256": sha256_file(sdist),
        PREFIX + "llama-cpp.commit": llama_cpp_commit(sdist, LLAMA_VERSION),
    }
    if cuda_arch:
        out[PREFIX + "cuda-arch"] = cuda_arch
    for lock in sorted(LOCKS.glob("*.lock")):
        out[PREFIX + "lock." + lock.stem] = "sha256:" + sha256_file(lock)
    if weights is not None:
        staged = json.loads(weights.read_text())
        out[PREFIX + "weights.preset"] = staged["preset"]
        for role, f in staged["files"].items():
            out[PREFIX + f"weights.{role}"] = f"{f['file']}@sha256:{f['sha256']}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavour", choices=["cpu", "native", "cuda"], required=True)
    ap.add_argument("--sdist", type=Path, required=True, help="the llama-cpp-python sdist the image compiles")
    ap.add_argument("--cuda-arch", default="")
    ap.add_argument("--weights", type=Path, help="scripts/container_weights.py's record of the files the image carries")
    args = ap.parse_args(argv)
    for given in (args.sdist, args.weights):
        if given is not None and not given.is_file():
            raise SystemExit(f"container_labels.py: error: no file {given}")
    json.dump(labels(args.flavour, args.sdist, args.cuda_arch, args.weights), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
