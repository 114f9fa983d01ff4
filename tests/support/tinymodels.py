"""Tiny GGUF models written with `gguf` for fast tests: 2-layer llama, f32, SPM vocabulary of 320."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

N_VOCAB = 320
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYERS = 2
N_CTX_TRAIN = 2048


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    words = ["▁", "▁a", "▁b", "▁c", "▁the", "▁def", "▁return", "▁x", "▁y", "▁=", "▁+", "▁(", "▁)", "▁:"]
    letters = [f"▁{c}{d}" for c in "abcdefghij" for d in "klmnop"]
    for w in (words + letters)[: N_VOCAB - len(tokens)]:
        tokens.append(w)
        types.append(TokenType.NORMAL)
    while len(tokens) < N_VOCAB:
        tokens.append(f"▁w{len(tokens)}")
        types.append(TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(N_VOCAB - 259)]
    return tokens, scores, [int(t) for t in types]


def _never_ends(output: np.ndarray, eos_id: int) -> np.ndarray:
    """The output rows of the control tokens and the end token set to zero: their logit is always 0,
    below the largest of the ~317 other random logits (standard deviation ~2), so a greedy answer never
    ends early on any CPU's numerics, and a sampled one ends with a chance of ~1/2,000 a token. Tests
    that count an answer's tokens count what they asked for; the end of generation is tested where a
    grammar or a stop string forces it."""
    out = output.copy()
    out[[0, 1, 2, eos_id]] = 0.0
    return out


def write_tiny_model(
    path: Path,
    seed: int = 0,
    tokens: list[str] | None = None,
    n_layers: int = N_LAYERS,
    arch: str = "llama",
    add_bos: bool = True,
    eos_id: int = 2,
    chat_template: str | None = None,
    scale: float = 0.5,
) -> Path:
    """Write a loadable tiny model. Same seed and vocab → same model; another seed → another model."""
    rng = np.random.default_rng(seed)
    vocab, scores, types = tiny_vocab()
    if tokens is not None:
        vocab = tokens
    head_dim = N_EMBD // N_HEAD

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{seed}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores(scores[: len(vocab)])
    writer.add_token_types(types[: len(vocab)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    writer.add_tensor("token_embd.weight", w(len(vocab), N_EMBD) * 4)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", _never_ends(w(len(vocab), N_EMBD) * 4, eos_id))
    for i in range(n_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
