import os

import pytest
from gguf import GGUFReader
from support.tinymodels import N_HEAD_KV, N_VOCAB, write_tiny_model

from app.errors import GGUFError
from app.gguf.header import read_header
from app.gguf.info import read_model_info


def test_tiny_model_info(tiny):
    m = read_model_info(tiny.target)
    assert m.architecture == "llama"
    assert m.n_layers == 2 and m.n_head == 4 and m.n_head_kv == (N_HEAD_KV, N_HEAD_KV)
    assert m.key_length == m.value_length == 16
    assert m.vocab.size == N_VOCAB and m.vocab.model == "llama" and m.vocab.add_bos is True
    assert m.vocab.bos_id == 1 and m.vocab.eos_id == 2
    assert m.quantization == "F32"
    assert m.n_swa_layers == 0 and m.n_recurrent_layers == 0


def test_fast_header_reader_agrees_with_gguf_reader(tiny):
    """The struct-based reader must see exactly what gguf's own GGUFReader sees."""
    ours = read_header(tiny.target)
    ref = GGUFReader(tiny.target)
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.name == b.name and a.type == int(b.tensor_type)
        assert a.n_elements == int(b.n_elements) and a.n_bytes == int(b.n_bytes)
        assert ours.data_offset + a.offset == int(b.data_offset)
    tokens = ref.fields["tokenizer.ggml.tokens"]
    assert list(ours.metadata["tokenizer.ggml.tokens"]) == [tokens.contents(i) for i in range(len(tokens.data))]
    assert ours.metadata["llama.block_count"] == ref.fields["llama.block_count"].contents()
    scores = ref.fields["tokenizer.ggml.scores"].contents()
    assert list(ours.metadata["tokenizer.ggml.scores"]) == pytest.approx(scores)


def test_truncated_file_is_refused(tiny, tmp_path):
    data = tiny.target.read_bytes()
    for cut in (30, 2000, len(data) - 100):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated"):
            read_model_info(p)


def test_corrupted_header_is_refused(tiny, tmp_path):
    data = bytearray(tiny.target.read_bytes())
    data[16:24] = (2**40).to_bytes(8, "little")  # n_kv
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError) as e:
        read_model_info(p)
    assert str(p) in e.value.message


def test_non_gguf_and_missing_files(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("hello, not a model at all")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_model_info(p)
    with pytest.raises(GGUFError, match="no such file"):
        read_model_info(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="directory"):
        read_model_info(tmp_path)


def test_sparse_file_of_true_size_reads_like_a_real_one(tmp_path):
    """The 27B test files carry no tensor data: a header followed by a hole up to the true size."""
    p = write_tiny_model(tmp_path / "s.gguf")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size + 10 * 2**30)
    assert read_model_info(p).file_size == size + 10 * 2**30


def test_real_qwen_headers(real_pair):
    t = read_model_info(real_pair.target)
    d = read_model_info(real_pair.draft)
    assert (t.architecture, t.n_layers, t.vocab.size, t.context_length) == ("qwen2", 28, 151_936, 32_768)
    assert (d.n_layers, d.vocab.size) == (24, 151_936)
    assert t.quantization == "Q4_K_M" and t.vocab.model == "gpt2" and t.vocab.pre == "qwen2"
    assert t.vocab.chat_template and "im_start" in t.vocab.chat_template


def test_real_gemma_sliding_window(gemma_270m):
    g = read_model_info(gemma_270m)
    assert g.architecture == "gemma3" and g.n_layers == 18 and g.vocab.size == 262_144
    assert g.sliding_window == 512 and g.n_swa_layers == 15  # 5 local : 1 global
