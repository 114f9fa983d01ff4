"""Real chat templates for the chat-format tests: llama.cpp's models/templates/*.jinja, as shipped in
the llama-cpp-python sdist this project pins. Test data read at test time, never copied into the
repository: $SPECDECK_TEMPLATES if set, else the cached copy, else the sdist is downloaded with pip
and only that folder extracted into the cache (scripts/templates.sh does it ahead, for install.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
INSIDE = "vendor/llama.cpp/models/templates/"  # under the sdist's top folder


def cache_dir() -> Path:
    return Path.home() / ".cache" / "specdeck" / "templates" / VERSION


def templates_dir() -> Path:
    """The folder of llama.cpp's chat templates (*.jinja), fetched once per machine."""
    if os.environ.get("SPECDECK_TEMPLATES"):
        return Path(os.environ["SPECDECK_TEMPLATES"])
    cache = cache_dir()
    if cache.is_dir():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdist-", dir=cache.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, f"llama-cpp-python=={VERSION}"], check=True, stdout=subprocess.DEVNULL)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        staging = Path(tmp) / "templates"
        staging.mkdir()
        with tarfile.open(sdist) as tar:
            for member in tar:
                _, _, inner = member.name.partition("/")
                name = inner[len(INSIDE):]
                if member.isfile() and inner.startswith(INSIDE) and name and "/" not in name:
                    with tar.extractfile(member) as src, open(staging / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not any(staging.glob("*.jinja")):
            raise RuntimeError(f"no {INSIDE}*.jinja in {sdist.name}")
        try:
            staging.rename(cache)  # atomic: the folder is there whole or not at all
        except OSError:
            if not cache.is_dir():  # not another run that got there first
                raise
    return cache


if __name__ == "__main__":
    print(templates_dir())
