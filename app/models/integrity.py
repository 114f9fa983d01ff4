"""SHA-256 of model files, and a record of what was verified so a restart need not re-hash 16 GB.

A record holds (size, mtime_ns, inode, sha256) per real path. It is trusted only while all three
stamps still match the file on disk; `force=True` re-hashes regardless.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from app.errors import IntegrityError

CHUNK = 8 * 1024 * 1024
OnBytes = Callable[[int], None]


@dataclass(frozen=True)
class Stamp:
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> Stamp:
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


def sha256_file(path: Path, on_bytes: OnBytes | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


class VerifiedRecords:
    """A JSON file of verified digests, keyed by the file's real path."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def _load(self) -> dict[str, dict]:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # a missing or damaged record only costs a re-hash

    def _save(self, data: dict[str, dict]) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".verified-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.file)

    def lookup(self, path: Path) -> str | None:
        """The recorded digest if the file's stamps still match, else None."""
        entry = self._load().get(str(Path(path).resolve()))
        if not entry:
            return None
        try:
            if Stamp(entry["size"], entry["mtime_ns"], entry["inode"]) == Stamp.of(path):
                return str(entry["sha256"])
        except (KeyError, OSError, TypeError):
            pass
        return None

    def record(self, path: Path, digest: str) -> None:
        data = self._load()
        data[str(Path(path).resolve())] = {**asdict(Stamp.of(path)), "sha256": digest}
        self._save(data)

    def forget(self, path: Path) -> None:
        data = self._load()
        if data.pop(str(Path(path).resolve()), None) is not None:
            self._save(data)


def check_integrity(
    path: Path,
    records: VerifiedRecords,
    sha256: str | None,
    size: int | None,
    force: bool = False,
    on_bytes: OnBytes | None = None,
) -> tuple[str, bool]:
    """Check a file's size and SHA-256; return (digest, hashed_now).

    Size is checked first (free). The digest comes from the record when the file's stamps are
    unchanged and `force` is off; otherwise the file is hashed and the result recorded.
    With `sha256=None` the digest is computed and recorded but nothing is compared.
    """
    actual_size = os.stat(path).st_size
    if size is not None and actual_size != size:
        raise IntegrityError(f"{path}: size mismatch: expected {size:,} bytes, got {actual_size:,}")
    cached = None if force else records.lookup(path)
    if cached is not None and (sha256 is None or cached == sha256):
        return cached, False
    digest = sha256_file(path, on_bytes)
    if sha256 is not None and digest != sha256:
        records.forget(path)
        raise IntegrityError(f"{path}: SHA-256 mismatch: expected {sha256}, got {digest}")
    records.record(path, digest)
    return digest, True
