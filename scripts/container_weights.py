#!/usr/bin/env python3
"""A preset's files for an image that carries its weights (scripts/container.sh build --with-weights).

    .venv/bin/python scripts/container_weights.py PRESET OUT-DIR [DIR-IN-CONTAINER]

The preset's files as `specdeck pull` and `check` left them (verified against the catalogue's
SHA-256), hard-linked (else copied) into OUT-DIR; beside them `config.toml`, which serves them from
/opt/specdeck/models (or DIR-IN-CONTAINER, a volume) as the container's deployment and pins each by SHA-256 (read back from the copy,
so a file changed on the way refuses the start), and `weights.json`, the labels' record.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.common import catalog_of, local_path, make_fetcher, roles_of, selection_of  # noqa: E402
from app.commands.start_request import Chosen  # noqa: E402
from app.errors import SpecdeckError  # noqa: E402
from app.models.integrity import sha256_file  # noqa: E402

IN_IMAGE = "/opt/specdeck/models"
SECTION_KEY = {"target": "model", "draft": "draft", "mmproj": "mmproj", "embedding": "embedding_model"}


def stage(preset: str, out: Path, inside: str = IN_IMAGE) -> dict:
    chosen, catalog = Chosen(name=preset), catalog_of(None)
    sel = selection_of(chosen, catalog)
    fetcher = make_fetcher(offline=True)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for role, ref in roles_of(sel, chosen, True, catalog):
        path = local_path(fetcher, ref)
        dest = out / path.name
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
        files[role] = {"file": path.name, "sha256": sha256_file(dest)}
    section = {SECTION_KEY[role]: f"{inside}/{f['file']}" for role, f in files.items()}
    if sel.mtp:
        section["draft"] = "mtp"
    lines = [f"# {preset}'s files, carried by this image and pinned (scripts/container_weights.py)",
             f"[models.{json.dumps(preset)}]"] + [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    lines += ["", "[pins]"] + [f"{json.dumps(f['file'])} = {json.dumps(f['sha256'])}" for f in files.values()]
    (out / "config.toml").write_text("\n".join(lines) + "\n")
    record = {"preset": preset, "files": files}
    (out / "weights.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: container_weights.py PRESET OUT-DIR [DIR-IN-CONTAINER]")
    try:
        print(json.dumps(stage(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:]), indent=1))
    except (SpecdeckError, OSError) as e:
        sys.exit(f"container_weights.py: error: {e}")
