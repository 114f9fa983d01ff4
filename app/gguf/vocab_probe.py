"""What llama.cpp itself makes of a vocabulary: a `vocab_only` load, which reads no weights.

GGUF keys leave some things implicit (add-BOS defaults per vocabulary type, FIM tokens that older
files only name by their text). The pair check uses these facts to resolve them exactly as
llama.cpp will when it serves the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from app.errors import GGUFError
from app.llama.backend import init_llama

LLAMA_TOKEN_NULL = -1
VOCAB_TYPES = {0: "none", 1: "llama", 2: "gpt2", 3: "bert", 4: "t5", 5: "rwkv", 6: "plamo2"}


@dataclass(frozen=True)
class VocabFacts:
    type: str
    n_tokens: int
    add_bos: bool
    add_eos: bool
    bos: int | None
    eos: int | None
    eot: int | None
    fim: dict[str, int | None]


def _tok(v: int) -> int | None:
    return None if v == LLAMA_TOKEN_NULL else int(v)


def probe_vocab(path: Path) -> VocabFacts:
    """Load only the vocabulary of `path` with llama.cpp and read its resolved settings."""
    init_llama()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise GGUFError(f"{path}: llama.cpp cannot load this model's vocabulary")
    try:
        v = llama_cpp.llama_model_get_vocab(model)
        fim = {
            "pre": llama_cpp.llama_vocab_fim_pre(v),
            "suf": llama_cpp.llama_vocab_fim_suf(v),
            "mid": llama_cpp.llama_vocab_fim_mid(v),
            "pad": llama_cpp.llama_vocab_fim_pad(v),
            "rep": llama_cpp.llama_vocab_fim_rep(v),
            "sep": llama_cpp.llama_vocab_fim_sep(v),
        }
        return VocabFacts(
            type=VOCAB_TYPES.get(int(llama_cpp.llama_vocab_type(v)), "?"),
            n_tokens=int(llama_cpp.llama_vocab_n_tokens(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
            bos=_tok(llama_cpp.llama_vocab_bos(v)),
            eos=_tok(llama_cpp.llama_vocab_eos(v)),
            eot=_tok(llama_cpp.llama_vocab_eot(v)),
            fim={k: _tok(x) for k, x in fim.items()},
        )
    finally:
        llama_cpp.llama_model_free(model)
