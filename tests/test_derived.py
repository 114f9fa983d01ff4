"""Models specdeck derives from a verified one: the F32 rewrite `bench --f32-target` measures with."""

import numpy as np

from app.commands.standin import f32_standin
from app.gguf.info import read_model_info
from app.gguf.synthetic import SHAPES, small, write_random
from app.llama.context import Context, Model
from app.llama.params import ModelParams
from app.models.integrity import VerifiedRecords, sha256_file


def _last_logits(path, tokens):
    ctx = Context(Model(path), ModelParams(512, 512, 512, 1, True, "f16", "f16", True, False, 0, 0), 1)
    b = ctx.batch
    b.clear()
    for pos, tok in enumerate(tokens):
        b.add(tok, pos, 0, pos == len(tokens) - 1)
    ctx.decode(b)
    return ctx.logits(len(tokens) - 1).copy()


def test_the_f32_standin_is_built_once_recorded_and_computes_what_the_source_does(tmp_path):
    source = write_random(tmp_path / "q4.gguf", small(SHAPES["qwen3.6-27b"]), seed=3)  # Q4_K / Q6_K weights
    records = VerifiedRecords(tmp_path / "verified.json")
    built = f32_standin(source, tmp_path / "store", records, threads=2)
    info = read_model_info(built)
    assert {t.type for t in info.tensors} == {"F32"} and info.file_type == "F32"
    assert built.parent.name == sha256_file(source)  # under the source's SHA-256
    assert records.lookup(built) == sha256_file(built)  # its own record
    mtime = built.stat().st_mtime_ns
    assert f32_standin(source, tmp_path / "store", records, threads=2) == built and built.stat().st_mtime_ns == mtime
    tokens = [5, 17, 300, 42, 9, 1000, 77]
    q4, f32 = _last_logits(source, tokens), _last_logits(built, tokens)
    assert int(np.argmax(q4)) == int(np.argmax(f32))
    assert np.max(np.abs(q4 - f32)) < 0.05 * np.max(np.abs(q4))  # the same weights; only the arithmetic's width differs
    with open(built, "r+b") as f:  # a damaged file no longer matches its record: built again
        f.seek(-8, 2)
        f.write(b"\0" * 8)
    assert records.lookup(built) is None
    again = f32_standin(source, tmp_path / "store", records, threads=2)
    assert records.lookup(again) == sha256_file(again) and read_model_info(again).file_type == "F32"
