"""Whether specdeck runs in a container, and which image: podman writes `/run/.containerenv` (the
engine, and only with `--privileged` the image's name and ID; `--read-only` hides the file, but
podman's `container=podman` variable remains), docker `/.dockerenv`; otherwise
`SPECDECK_IMAGE` (IMAGE@sha256:DIGEST, which `scripts/container.sh run` sets) names it.
specdeck's image carries its OCI labels in `/usr/share/specdeck/image.json` (scripts/container.sh
writes them), since a container cannot read its own labels. What `doctor` reports and a revision
records, so a rollback names the image to run (`podman run IMAGE@sha256:...`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

IMAGE_FILE = "usr/share/specdeck/image.json"


def _containerenv(text: str) -> dict:
    """podman's key="value" lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def container_facts(root: Path = Path("/"), environ: Mapping[str, str] = os.environ) -> dict | None:
    """None outside a container; else {"engine", "image", "image_id", "labels"} as far as known."""
    podman, docker = root / "run/.containerenv", root / ".dockerenv"
    engine = environ.get("container")  # podman sets container=podman in every container
    if not podman.exists() and not docker.exists() and not engine:
        return None
    env = {}
    if podman.exists():
        try:
            env = _containerenv(podman.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            env = {}
    try:
        labels = json.loads((root / IMAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        labels = {}
    named, _, digest = (environ.get("SPECDECK_IMAGE") or "").partition("@")
    return {"engine": env.get("engine") or engine or ("podman" if podman.exists() else "docker"),
            "image": env.get("image") or named or None, "image_id": env.get("imageid") or digest or None,
            "labels": labels if isinstance(labels, dict) else {}}


def describe(facts: dict) -> str:
    """One line: the engine, the image and what its labels say it is."""
    labels = facts.get("labels") or {}
    said = {"org.opencontainers.image.version": "specdeck {}", "org.opencontainers.image.revision": "commit {:.12}",
            "io.specdeck.flavour": "flavour {}", "io.specdeck.llama-cpp-python.version": "llama-cpp-python {}",
            "io.specdeck.llama-cpp.commit": "llama.cpp {}"}
    what = ", ".join(form.format(labels[key]) for key, form in said.items() if labels.get(key))
    image = facts.get("image") or "image not stated (set SPECDECK_IMAGE=IMAGE@sha256:DIGEST, as scripts/container.sh run does)"
    digest = f" ({facts['image_id'][:19]})" if facts.get("image_id") else ""
    return f"in a {facts['engine']} container: {image}{digest}" + (f"; {what}" if what else "")


def image_ref(facts: dict | None) -> str | None:
    """What `podman run` takes to run that image again: IMAGE@sha256:DIGEST where both are known."""
    if not facts:
        return None
    image, digest = facts.get("image"), facts.get("image_id")
    if image and digest and str(digest).startswith("sha256:"):
        return f"{image}@{digest}"
    return image or digest
