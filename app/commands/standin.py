"""bench's stand-in target, derived from a verified model and built once into the cache with a
SHA-256 record.

`f32_standin`: the model rewritten as F32 by libllama's own `llama_model_quantize` (the quantized
weights' exact values, four bytes each). A decode of it reads several times the bytes, so on a CPU it
costs many draft tokens, as a 27B's decode does on a card next to a 0.8B draft's: `specdeck bench
--f32-target` measures the draft-model path in that regime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from app.llama.quantize import requantize_f32
from app.models.integrity import VerifiedRecords, sha256_file


def f32_standin(source: Path, store: Path, records: VerifiedRecords, threads: int,
                say: Callable[[str], None] = lambda _: None) -> Path:
    """The F32 rewrite of `source`, built on first use under `store`/derived/<source SHA-256>/ and
    recorded (file SHA-256, and a note of what it was built from beside it); later calls find it by
    its record, and one whose record no longer matches it is built again."""
    source_sha = records.lookup(source) or sha256_file(source)
    out = store / "derived" / source_sha / f"{source.stem}-F32.gguf"
    if out.is_file() and records.lookup(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    say(f"building {out.name} from {source.name} with llama_model_quantize (once; {out.parent})")
    requantize_f32(source, partial, threads)
    digest = sha256_file(partial)
    os.replace(partial, out)
    records.record(out, digest)
    out.with_name(out.name + ".json").write_text(json.dumps(
        {"source": source.name, "source_sha256": source_sha, "sha256": digest,
         "built_with": "llama_model_quantize, ftype ALL_F32, allow_requantize, pure"}, indent=1) + "\n", encoding="utf-8")
    return out
