"""`specdeck bench`: tokens/s with speculation off, with the draft model, with prompt lookup and
with the adaptive choice, on the same prompts, side by side in one run; and, where a llama-server
built from the same llama.cpp sources is present, the same prompts through it as anchors.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .engine.controller import Controller, calibrate
from .engine.drafter import AdaptiveDrafter, LookupDrafter, ModelDrafter
from .engine.engine import Engine, Request, SpecParams
from .runtime import Loaded
from .verify import prompt_tokens

MODES = ("plain", "draft", "lookup", "adaptive")
DRAFT_N_MAX = 8  # the draft model at a fixed length, greedy (our "draft" mode)
ANCHOR_P_MIN = 0.75  # llama-server's best draft setting here (FACTS: n-max 8, p-min 0.75)
ADAPTIVE_N_MAX = 16  # the controller may go this long (lookup proposals are free to make)


@dataclass
class ModeResult:
    tok_s: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_decode: list[float] = field(default_factory=list)
    python_ms_per_drafted: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {
            "tok_s": med(self.tok_s), "tok_s_min": min(self.tok_s, default=None), "tok_s_max": max(self.tok_s, default=None),
            "acceptance": med(self.acceptance), "tokens_per_decode": med(self.tokens_per_decode),
            "python_ms_per_drafted_token": med(self.python_ms_per_drafted),
        }


def _drafters(loaded: Loaded, controller: Controller) -> dict:
    model = ModelDrafter(loaded.draft) if loaded.draft else None
    return {
        "plain": None,
        "draft": model,
        "lookup": LookupDrafter(),
        "adaptive": AdaptiveDrafter(controller, LookupDrafter(), ModelDrafter(loaded.draft) if loaded.draft else None),
    }


def run_engine(loaded: Loaded, prompts: list[dict], max_tokens: int, repeats: int, modes=MODES, log=print) -> tuple[dict, dict]:
    """{kind: {mode: summary}}, and the calibrated costs."""
    t = time.perf_counter()
    costs = calibrate(loaded.target, loaded.draft, ADAPTIVE_N_MAX)
    log(f"calibrated in {time.perf_counter() - t:.1f} s: c_verify(1..{ADAPTIVE_N_MAX + 1}) ms "
        + " ".join(f"{costs.verify[n] * 1e3:.1f}" for n in sorted(costs.verify))
        + (f"; c_draft {costs.draft * 1e3:.1f} ms" if costs.draft else ""))
    controller = Controller(costs)
    drafters = _drafters(loaded, controller)
    tok = loaded.tokenizer
    results: dict[str, dict[str, ModeResult]] = {}
    for rep in range(repeats):
        for item in prompts:
            kind = item.get("kind", "custom")
            ids = prompt_tokens(tok, item)
            for mode in modes:
                drafter = drafters[mode]
                if mode != "plain" and drafter is None:
                    continue
                n_max = ADAPTIVE_N_MAX if mode == "adaptive" else DRAFT_N_MAX
                engine = Engine(loaded.target, drafter, 1, draft_limit=n_max)
                d_ctx = loaded.draft
                d0 = (d_ctx.decode_seconds if d_ctx else 0.0)
                req = Request(prompt=ids, max_tokens=max_tokens, stop_tokens=tok.stop_tokens,
                              speculative=SpecParams(enabled=mode != "plain", n_max=n_max))
                for _ in engine.generate(req):
                    pass
                r = engine.slots[0].record
                if drafter is not None:
                    drafter.release(0)
                res = results.setdefault(kind, {}).setdefault(mode, ModeResult())
                res.tok_s.append(r.generation_tps or 0.0)
                if r.acceptance is not None:
                    res.acceptance.append(r.acceptance)
                res.tokens_per_decode.append(r.tokens_per_decode or 0.0)
                if mode == "draft" and r.drafted:
                    in_llama = (d_ctx.decode_seconds - d0) if d_ctx else 0.0
                    res.python_ms_per_drafted.append(max(r.t_draft - in_llama, 0.0) / r.drafted * 1e3)
                log(f"  [{rep + 1}/{repeats}] {kind:16} {mode:9} {r.generation_tps or 0:6.1f} tok/s"
                    f"  acceptance {r.acceptance if r.acceptance is None else round(r.acceptance, 2)}"
                    f"  tokens/decode {r.tokens_per_decode or 0:.2f}")
    summary = {kind: {mode: res.summary() for mode, res in modes_.items()} for kind, modes_ in results.items()}
    return summary, {"c_verify_ms": {n: v * 1e3 for n, v in costs.verify.items()}, "c_draft_ms": (costs.draft or 0) * 1e3}


# -- llama-server anchors ----------------------------------------------------------------------

ANCHORS = {
    "llama_server_plain": [],
    "llama_server_draft": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", str(DRAFT_N_MAX),
                           "--spec-draft-p-min", str(ANCHOR_P_MIN)],
    "llama_server_lookup": ["--spec-type", "ngram-simple"],
}


def find_llama_server() -> Path | None:
    env = os.environ.get("SPECDECK_LLAMA_SERVER")
    if env and Path(env).is_file():
        return Path(env)
    cache = Path(os.environ.get("SPECDECK_LLAMA_CPP_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeck" / "llama.cpp")
    built = cache / "build" / "bin" / "llama-server"
    if built.is_file():
        return built
    found = shutil.which("llama-server")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


def run_anchors(server: Path, target: Path, draft: Path | None, prompt_ids: dict[str, list[int]], max_tokens: int,
                threads: int, n_ctx: int, repeats: int, log=print) -> dict:
    """{anchor: {kind: tok_s}} through llama-server's /completion, greedy, same token ids."""
    out: dict[str, dict[str, float]] = {}
    for name, extra in ANCHORS.items():
        if "{draft}" in extra and draft is None:
            continue
        port = free_port()
        args = [str(server), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--no-warmup"] + [a.replace("{draft}", str(draft)) for a in extra]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            for kind, ids in prompt_ids.items():
                speeds = []
                for _ in range(repeats):
                    r = _post(url + "/completion", {"prompt": ids, "n_predict": max_tokens, "temperature": 0,
                                                    "cache_prompt": False, "top_k": 1})
                    speeds.append(float(r["timings"]["predicted_per_second"]))
                out.setdefault(name, {})[kind] = statistics.median(speeds)
                log(f"  {name:20} {kind:16} {out[name][kind]:6.1f} tok/s")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return out


def ratios(workloads: dict, anchors: dict) -> dict:
    """The goals as ratios measured in this run."""
    out = {}
    for kind, modes in workloads.items():
        plain = (modes.get("plain") or {}).get("tok_s")
        adaptive = (modes.get("adaptive") or {}).get("tok_s")
        r = {}
        if plain and adaptive:
            r["adaptive_vs_plain"] = adaptive / plain
            r["adaptive_min_vs_plain"] = modes["adaptive"]["tok_s_min"] / plain
        if plain and anchors.get("llama_server_plain", {}).get(kind):
            r["plain_vs_llama_server_plain"] = plain / anchors["llama_server_plain"][kind]
        if adaptive and anchors.get("llama_server_draft", {}).get(kind):
            r["adaptive_vs_llama_server_draft"] = adaptive / anchors["llama_server_draft"][kind]
        if adaptive and anchors.get("llama_server_lookup", {}).get(kind):
            r["adaptive_vs_llama_server_lookup"] = adaptive / anchors["llama_server_lookup"][kind]
        out[kind] = r
    return out
