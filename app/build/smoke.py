"""A smoke decode: prove that the installed llama.cpp build runs on this CPU (and GPU, if it has one).

`run_smoke()` starts `python -m app.build.smoke` in a subprocess, so an instruction the CPU cannot
execute kills the child, not the caller: the parent reads the signal (SIGILL, ...) from the exit
status and names it. The child writes a small model with quantized matmul weights (Q4_0 and Q8_0,
rows of 512 and 1024: the types and shapes llama.cpp's AMX and repacked AVX2/AVX-512 kernels take,
so a build that would crash on a real model's first decode crashes here), loads it, evaluates a
prompt batch and generates a few tokens greedily, and prints one JSON line: the build's system
info, the buffers llama.cpp put the weights in, and the tokens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

N_VOCAB, N_EMBD, N_HEAD, N_FF, N_LAYERS = 320, 512, 8, 1024, 2
PROMPT = [1, 300, 301, 302, 303, 304, 305, 306]
GENERATE = 4


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    summary: str  # one line for the user
    signal: str | None = None  # SIGILL, SIGSEGV ... when the child died by one
    system_info: str = ""
    gpu_offload: bool = False
    buffers: dict[str, float] = field(default_factory=dict)  # "AMX" -> MiB, "CPU_REPACK" -> MiB ...
    devices: tuple[str, ...] = ()  # "cpu", "gpu": where a decode ran
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"ok": self.ok, "summary": self.summary, "signal": self.signal, "system_info": self.system_info,
                "gpu_offload": self.gpu_offload, "buffers": self.buffers, "devices": list(self.devices),
                "seconds": round(self.seconds, 2)}


def write_smoke_model(path: Path) -> Path:
    """A 2-layer llama with Q4_0 / Q8_0 matmul weights (~2 MB), deterministic."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter, TokenType
    from gguf.quants import quantize

    rng = np.random.default_rng(7)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"▁w{i}" for i in range(N_VOCAB - len(tokens))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * (N_VOCAB - len(types))

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("specdeck-smoke")
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(2)  # MOSTLY_Q4_0
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * N_VOCAB)
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def q(name: str, arr: np.ndarray, qtype: T) -> None:
        writer.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)

    writer.add_tensor("token_embd.weight", w(N_VOCAB, N_EMBD) * 4)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    q("output.weight", w(N_VOCAB, N_EMBD) * 4, T.Q8_0)
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            q(p + name + ".weight", w(N_EMBD, N_EMBD), T.Q8_0 if name == "attn_v" else T.Q4_0)
        writer.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        q(p + "ffn_gate.weight", w(N_FF, N_EMBD), T.Q4_0)
        q(p + "ffn_up.weight", w(N_FF, N_EMBD), T.Q4_0)
        q(p + "ffn_down.weight", w(N_EMBD, N_FF), T.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _decode(path: Path, n_gpu_layers: int) -> list[int]:
    """Load, evaluate the prompt in one batch, generate GENERATE tokens greedily; the tokens."""
    import llama_cpp
    import numpy as np

    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError("llama.cpp could not load the smoke model")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 64, 64, 2, 2
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context for the smoke model")
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    out: list[int] = []
    try:
        tokens, pos = list(PROMPT), 0
        for _ in range(GENERATE):
            batch.n_tokens = len(tokens)
            for i, t in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(tokens) - 1
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed on the smoke model")
            pos += len(tokens)
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(N_VOCAB,))
            if not np.isfinite(logits).all():
                raise RuntimeError("the smoke decode gave non-finite logits")
            tokens = [int(np.argmax(logits))]
            out.append(tokens[0])
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return out


def _child(gpu: bool) -> int:
    """In the subprocess: decode on the CPU (and on the GPU when asked), print one JSON line."""
    import ctypes
    import re

    from app.build.cudalibs import preload

    preload()  # before llama_cpp loads its CUDA backend (a build made with the PyPI toolkit)
    import llama_cpp

    log: list[str] = []

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        log.append(text.decode("utf-8", errors="replace"))

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    result: dict = {"system_info": info.strip(), "gpu_offload": offload, "devices": [], "tokens": {}}
    with tempfile.TemporaryDirectory(prefix="specdeck-smoke-") as d:
        path = write_smoke_model(Path(d) / "smoke.gguf")
        runs = [("cpu", 0)] + ([("gpu", 99)] if gpu and offload else [])
        for device, ngl in runs:
            log.clear()
            result["tokens"][device] = _decode(path, ngl)
            result["devices"].append(device)
            if device == "cpu":
                buffers: dict[str, float] = {}
                for m in re.finditer(r"(\S+) model buffer size =\s+([\d.]+) MiB", "".join(log)):
                    buffers[m.group(1)] = buffers.get(m.group(1), 0.0) + float(m.group(2))
                result["buffers"] = buffers
    print("SPECDECK-SMOKE " + json.dumps(result), flush=True)
    return 0


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_smoke(python: str = sys.executable, gpu: bool = True, timeout: float = 120.0,
              env: dict[str, str] | None = None) -> SmokeResult:
    """Run the smoke decode in a subprocess of `python` (a venv's interpreter) and judge it."""
    import time

    root = str(Path(__file__).resolve().parents[2])
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = root + os.pathsep + child_env.get("PYTHONPATH", "") if child_env.get("PYTHONPATH") else root
    t0 = time.monotonic()
    try:
        proc = subprocess.run([python, "-m", "app.build.smoke", "--child"] + (["--gpu"] if gpu else []),
                              capture_output=True, text=True, timeout=timeout, env=child_env)
    except subprocess.TimeoutExpired:
        return SmokeResult(False, f"the smoke decode did not finish in {timeout:.0f} s", seconds=time.monotonic() - t0)
    except OSError as e:
        return SmokeResult(False, f"cannot start {python}: {e.strerror or e}")
    seconds = time.monotonic() - t0
    sig = _signal_name(proc.returncode)
    if sig is not None:
        what = "an instruction this CPU cannot execute" if sig == "SIGILL" else "a crash"
        return SmokeResult(False, f"the build died with {sig} ({what}) at its first decode", signal=sig, seconds=seconds)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPECDECK-SMOKE ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return SmokeResult(False, f"the smoke decode failed (exit {proc.returncode}): {tail}"[:300], seconds=seconds)
    data = json.loads(line.removeprefix("SPECDECK-SMOKE "))
    devices = tuple(data["devices"])
    where = " and ".join(devices)
    return SmokeResult(True, f"decoded {len(PROMPT)} prompt + {GENERATE} tokens on the {where} in {seconds:.1f} s",
                       system_info=data["system_info"], gpu_offload=data["gpu_offload"], buffers=data["buffers"],
                       devices=devices, seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return _child(gpu="--gpu" in argv)
    r = run_smoke(gpu="--no-gpu" not in argv)
    print(json.dumps(r.to_json()) if "--json" in argv else r.summary)
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
