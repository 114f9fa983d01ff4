"""Fetch the page's libraries from npm at the versions app/ui/static/vendor/vendor.json pins, check
each tarball's integrity hash (npm's sha512) against the pin, and copy the named files (with each
licence) into app/ui/static/vendor/NAME/; each file's SHA-256 is written back into vendor.json,
which the tests check the copies against.

    python scripts/vendor_ui.py            fetch, check, copy (needs npm and the npm registry)
    python scripts/vendor_ui.py --check    fetch and check only: exit 1 if a copy differs from its tarball

To move a library to another version: set `version` and `integrity` (`npm view PACKAGE@VERSION
dist.integrity`) in vendor.json, then run this.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent.parent / "app" / "ui" / "static" / "vendor"
LOCK = VENDOR / "vendor.json"


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch(package: str, version: str, into: Path) -> bytes:
    out = subprocess.run(["npm", "pack", f"{package}@{version}", "--json", "--pack-destination", str(into)],
                         capture_output=True, text=True, cwd=into)
    if out.returncode != 0:
        sys.exit(f"vendor_ui: npm pack {package}@{version} failed: {out.stderr.strip().splitlines()[-1:]}")
    name = json.loads(out.stdout)[0]["filename"]
    return (into / name).read_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare the copies with their tarballs")
    args = ap.parse_args()
    lock = json.loads(LOCK.read_text())
    bad = []
    with tempfile.TemporaryDirectory() as d:
        for lib in lock["libraries"]:
            data = fetch(lib["package"], lib["version"], Path(d))
            if integrity(data) != lib["integrity"]:
                sys.exit(f"vendor_ui: {lib['package']}@{lib['version']}: the tarball's integrity is {integrity(data)}, "
                         f"not the pinned {lib['integrity']}")
            sums = {}
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member, dest in lib["files"].items():
                    blob = tar.extractfile(member).read()
                    target = VENDOR / lib["name"] / dest
                    sums[dest] = hashlib.sha256(blob).hexdigest()
                    if args.check:
                        if not target.is_file() or target.read_bytes() != blob:
                            bad.append(str(target.relative_to(VENDOR)))
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(blob)
            lib["sha256"] = sums
            print(f"{lib['package']}@{lib['version']}: integrity checked; {', '.join(lib['files'].values())}")
    if args.check:
        for b in bad:
            print(f"differs from its tarball: {b}")
        return 1 if bad else 0
    LOCK.write_text(json.dumps(lock, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
