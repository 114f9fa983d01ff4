"""llama-server as `specdeck bench`'s anchor: found, started with each anchor's flags on the same
models, token ids, context and threads, asked, and stopped; its `timings` counted as ours are."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

from app.ops.client import wait_until_ready
from app.drafting.mtp import DRAFT_MAX as MTP_DRAFT_MAX

DRAFT_N_MAX = 8  # the draft model at a fixed length, greedy (our "draft" mode, and llama-server's draft-simple)
ANCHOR_P_MIN = 0.75  # llama-server's best draft setting here (FACTS: n-max 8, p-min 0.75)

ANCHORS = {
    "llama_server_plain": [],
    "llama_server_draft": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", str(DRAFT_N_MAX),
                           "--spec-draft-p-min", str(ANCHOR_P_MIN)],
    "llama_server_lookup": ["--spec-type", "ngram-simple"],
}
MTP_ANCHORS = {  # bench --draft mtp: the head against llama.cpp's own MTP driver at the same length and p_min
    "llama_server_plain": [],
    "llama_server_draft_mtp": ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(MTP_DRAFT_MAX),
                               "--spec-draft-p-min", str(ANCHOR_P_MIN)],
    "llama_server_lookup": ["--spec-type", "ngram-simple"],
}
CARD_ANCHORS = {  # the card's regime (bench --f32-target): draft-simple at three lengths, the n-gram modes
    "llama_server_plain": [],
    **{f"llama_server_draft_n{n}": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", str(n),
                                    "--spec-draft-p-min", str(ANCHOR_P_MIN)] for n in (3, 8, 16)},
    "llama_server_ngram_simple": ["--spec-type", "ngram-simple"],
    "llama_server_ngram_map_k": ["--spec-type", "ngram-map-k"],
}
AGENT_ANCHORS = {  # the agent workload: plain and llama-server's three n-gram modes (the best is the anchor)
    "llama_server_plain": [],
    "llama_server_ngram_simple": ["--spec-type", "ngram-simple"],
    "llama_server_ngram_map_k": ["--spec-type", "ngram-map-k"],
    "llama_server_ngram_mod": ["--spec-type", "ngram-mod"],
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


class AnchorServers:
    """llama-server with each anchor's flags, all started up front and kept up, so every anchor is
    measured right next to specdeck's own runs of the same prompt (this machine's speed drifts); the
    agent workload restarts them before each repeat (`restart`)."""

    def __init__(self, server: Path, target: Path, draft: Path | None, threads: int, n_ctx: int,
                 anchors: dict | None = None, flash_attn: bool = True) -> None:
        self.urls: dict[str, str] = {}
        self.procs: list[subprocess.Popen] = []
        self.args = (server, target, draft, threads, n_ctx, flash_attn)
        self.anchors = anchors or ANCHORS

    def __enter__(self) -> AnchorServers:
        try:
            self._start_all()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start_all(self) -> None:
        server, target, draft, threads, n_ctx, flash_attn = self.args
        for name, extra in self.anchors.items():
            if any("{draft}" in a for a in extra) and draft is None:
                continue
            port = free_port()
            # the plan's attention too: the two sides then decode with the same numerics, so they
            # answer the same text (a near-tie may flip between the two kernels)
            args = [str(server), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                    "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--no-warmup", "-fa", "on" if flash_attn else "off"]
            args += [a.replace("{draft}", str(draft)) for a in extra]
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            url = f"http://127.0.0.1:{port}"
            wait_until_ready(url, proc)
            self.urls[name] = url

    def restart(self) -> None:
        """Every anchor in a fresh process: llama-server's `ngram-mod` keeps its n-gram pool across
        requests for the life of the process, so a repeat of the same turns would draft from its own
        earlier answers (its tokens/s climbed from 30.7 to 46.4 over four repeats of the agent
        workload), the measurement specdeck's modes avoid by clearing their suffix index."""
        self.__exit__()
        self.urls = {}
        self._start_all()

    def measure(self, name: str, ids: list[int], max_tokens: int) -> float:
        """Generated tokens/s for one greedy request through llama-server's /completion."""
        n, seconds, _, _ = self.measure_answer(name, ids, max_tokens)
        return n / seconds if seconds else 0.0

    def measure_answer(self, name: str, ids: list[int], max_tokens: int) -> tuple[int, float, float, list[int]]:
        """(generated tokens, seconds generating, tokens per target decode, the answer's token ids)
        for one greedy request."""
        r = _post(self.urls[name] + "/completion", {"prompt": ids, "n_predict": max_tokens, "temperature": 0,
                                                    "cache_prompt": False, "top_k": 1, "return_tokens": True})
        return (*counted(r["timings"]), list(r.get("tokens") or []))

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = []


def counted(timings: dict) -> tuple[int, float, float]:
    """llama-server's `timings` as (generated tokens, seconds generating, tokens per target decode),
    counted as specdeck counts its own: the first token comes with the prompt's decode, and each
    decode after it yields one token and the drafts it kept, so the decodes are the generated tokens
    less the first and the accepted drafts."""
    n = int(timings["predicted_n"])
    decodes = n - 1 - int(timings.get("draft_n_accepted") or 0)
    return n, float(timings["predicted_ms"]) / 1e3, n / decodes if decodes > 0 else 1.0
