"""Hypothesis fuzz of the two parsers that read files from outside: the GGUF header reader and the
models.toml parser. Whatever the bytes, the only exception is the project's clear error
(GGUFError / CatalogError, both SpecdeckError). Bounded here; raise FUZZ_EXAMPLES for a longer run."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tinymodels import write_tiny_model

from app.errors import CatalogError, GGUFError
from app.gguf.header import read_header
from app.gguf.info import read_model_info
from app.models.catalog import BUNDLED_CATALOG, parse_catalog

N = int(os.environ.get("FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=N, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seed_gguf(tmp_path_factory) -> bytes:
    path = write_tiny_model(tmp_path_factory.mktemp("fuzz") / "seed.gguf", seed=0, n_layers=1)
    return path.read_bytes()


def _read(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(data)
    for reader in (read_header, read_model_info):
        try:
            reader(path)
        except GGUFError as e:
            assert e.message and "\n" not in e.message.strip()


# the header's interesting region: magic, version, counts, then the first keys and values
mutation = st.tuples(st.integers(0, 3000), st.sampled_from(["flip", "set", "cut", "insert", "u64", "u32"]),
                     st.binary(min_size=1, max_size=16))


@FUZZ
@given(edits=st.lists(mutation, min_size=1, max_size=6))
def test_gguf_reader_mutations(seed_gguf, tmp_path_factory, edits):
    data = bytearray(seed_gguf)
    for pos, how, blob in edits:
        if not data:
            break
        pos = pos % len(data)
        if how == "flip":
            data[pos] ^= blob[0] or 1
        elif how == "set":
            data[pos:pos + len(blob)] = blob
        elif how == "cut":
            del data[pos:]
        elif how == "insert":
            data[pos:pos] = blob
        elif how == "u64":  # a count or length word: a plausible-looking but wrong number
            data[pos:pos + 8] = struct.pack("<Q", int.from_bytes(blob[:8].ljust(8, b"\0"), "little") % (1 << 40))
        else:  # a value type or array element type
            data[pos:pos + 4] = struct.pack("<I", blob[0] % 16)
    _read(tmp_path_factory.mktemp("m"), bytes(data))


def _kv(key: bytes, vtype: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + payload


value = st.one_of(
    st.tuples(st.integers(0, 12), st.binary(max_size=24)).map(lambda t: (t[0], t[1])),
    # arrays of arrays, as deep as the fuzz likes
    st.integers(1, 5000).map(lambda d: (9, (struct.pack("<IQ", 9, 1)) * d + struct.pack("<IQ", 4, 0))),
    st.tuples(st.integers(0, 13), st.integers(0, 1 << 62)).map(lambda t: (9, struct.pack("<IQ", t[0], t[1]))),
)


@FUZZ
@given(version=st.sampled_from([2, 3, 3, 3, 1, 4]), n_tensors=st.integers(0, 3), kvs=st.lists(
    st.tuples(st.sampled_from([b"general.architecture", b"general.alignment", b"llama.block_count",
                               b"tokenizer.ggml.tokens", b"llama.attention.head_count", b"x"]), value), max_size=5),
    tail=st.binary(max_size=64))
def test_gguf_reader_structured(tmp_path_factory, version, n_tensors, kvs, tail):
    body = b"".join(_kv(k, t, p) for k, (t, p) in kvs)
    data = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs)) + body + tail
    _read(tmp_path_factory.mktemp("s"), data)


def test_deeply_nested_array_is_a_clear_error(tmp_path):
    """Found by the fuzz: arrays nested thousands deep recursed until RecursionError."""
    nested = struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _kv(b"x", 9, nested)
    path = tmp_path / "nested.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match="nested"):
        read_header(path)


def test_a_huge_block_count_is_a_clear_error(tmp_path):
    """Found by the fuzz: block_count set to 2^40 sized per-layer tables until the OOM killer came."""
    arch = b"llama"
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + _kv(b"general.architecture", 8, struct.pack("<Q", len(arch)) + arch)
            + _kv(b"llama.block_count", 10, struct.pack("<Q", 1 << 40)) + b"\0" * 64)
    path = tmp_path / "layers.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match="block_count 1099511627776"):
        read_model_info(path)


def test_alignment_of_the_wrong_type_is_a_clear_error(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _kv(b"general.alignment", 9, struct.pack("<IQ", 4, 1) + b"\0" * 4)
    path = tmp_path / "align.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match="alignment"):
        read_header(path)


BUNDLED = BUNDLED_CATALOG.read_text(encoding="utf-8")


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(BUNDLED)), st.integers(0, 40),
                                st.text(alphabet=st.sampled_from(list('=[]."{}\n #0123456789abcxyz_-,\'truefalse')), max_size=12)),
                      min_size=1, max_size=4))
def test_catalog_parser_mutations(edits):
    text = BUNDLED
    for pos, n, new in edits:
        text = text[:pos] + new + text[pos + n:]
    try:
        parse_catalog(text, Path("models.toml"))
    except CatalogError as e:
        assert e.message.startswith("models.toml")


toml_scalar = st.one_of(st.integers(-5, 1 << 40).map(str), st.sampled_from(['"x"', '"a/b"', "true", "[]", "{}", '"gpu-24gb"',
                                                                               '"cpu"', "1.5", '"' + "a" * 64 + '"']))


@FUZZ
@given(models=st.dictionaries(st.sampled_from(["m", "n"]), st.dictionaries(
    st.sampled_from(["repo", "file", "revision", "size", "sha256", "gated", "mirrors", "notes", "bogus"]), toml_scalar,
    max_size=5), max_size=2),
    presets=st.dictionaries(st.sampled_from(["p", "q"]), st.dictionaries(
        st.sampled_from(["description", "target", "draft", "context", "hardware", "name"]),
        st.one_of(toml_scalar, st.sampled_from(['"m"', '"n"'])), max_size=6), max_size=2),
    top=st.lists(st.sampled_from(['default_gpu_preset = "p"', 'default_cpu_preset = "q"', "models = 3", "presets = []",
                                  'extra = 1', 'default_cpu_preset = 5']), max_size=3))
def test_catalog_parser_structured(models, presets, top):
    lines = list(top)
    for kind, tables in (("models", models), ("presets", presets)):
        for name, fields in tables.items():
            lines.append(f"[{kind}.{name}]")
            lines += [f"{k} = {v}" for k, v in fields.items()]
    try:
        parse_catalog("\n".join(lines), Path("models.toml"))
    except CatalogError as e:
        assert e.message.startswith("models.toml")
