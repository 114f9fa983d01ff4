#!/usr/bin/env python3
"""The MTP head draft for draft against llama.cpp's own: llama-server `--spec-type draft-mtp` and
specdeck's engine with its `MtpDrafter`, on the MTP stand-in whose head reads the target's hidden
state as much as the token (`app.gguf.synthetic.write_mtp_standin`, state weight 1.0), greedy, the
same draft length (llama.cpp's n_max 3) and p_min (llama.cpp's default 0: every draft is n_max long
where the answer leaves room).

    python scripts/mtp_vs_llama_server.py [--tokens 48] [--json out.json]

Cases, each a request or two of token ids (the stand-in's vocabulary makes no text):
  fresh      a new prompt
  resent     the same conversation sent again, longer (the slot's cache reused up to it)
  restored   another prompt takes the one slot, then the conversation comes back: its cache is
             restored from host memory (`--cache-ram` on both sides)
  two slots  two prompts decoded at once (2 slots, one verify batch and one head batch per step)
  fresh, replayed   the fresh prompt again on an engine that keeps 1 rollback snapshot: a draft
             of 3 is verified from a context checkpoint, and a rejection past the snapshot puts
             the state back and evaluates the kept tokens again (the head follows the replay)
Every target decode of the hybrid stand-in's partly rejected drafts is a recurrent rollback:
llama-server restores a checkpoint and evaluates the kept tokens again; specdeck rolls back through
llama.cpp's rollback snapshots (n_rs_seq 3).

Per request it compares the answer's tokens, every draft's tokens (llama-server's from its debug log:
the head's top candidate at each draft position), and the drafted and accepted counts. llama-server
is built by scripts/build_llama_server.sh (SPECDECK_LLAMA_SERVER overrides). Exit 0 when all agree.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.anchors import find_llama_server, free_port  # noqa: E402
from app.engine.checkpoints import Checkpoints  # noqa: E402
from app.engine.drafters.mtp import MtpDrafter  # noqa: E402
from app.engine.engine import Engine, Request, SpecParams  # noqa: E402
from app.gguf.synthetic import write_mtp_standin  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.params import ModelParams  # noqa: E402
from app.ops.client import wait_until_ready  # noqa: E402

N_MAX = 3  # llama.cpp's draft-mtp default
NEAR_TIE = 0.01  # a differing draft token counts as batch numerics where llama-server's top two are this close
N_CTX = 4096
CACHE_RAM_MIB = 64
# llama-server's debug line for each draft position's candidates (common/speculative.cpp, draft-mtp)
_CANDIDATE = re.compile(r"seq_id (\d+), draft candidate +(\d+), pos +(\d+): +(\d+) \( *([\d.]+)\)")


def prompts(vocab: int, n: int = 4, length: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(8, vocab - 8, length)] for _ in range(n)]


def conversation(ask, ps: list[list[int]]) -> None:
    """The one-slot cases, the same on both sides: `ask(name, ids)` answers one request."""
    a = ask("fresh", ps[0])
    conv = ps[0] + a["tokens"] + ps[1][:8]
    b = ask("resent", conv)
    ask("other prompt", ps[2])
    ask("restored", conv + b["tokens"] + ps[1][8:16])


# -- llama-server ---------------------------------------------------------------------------------

class LlamaServer:
    def __init__(self, server: Path, model: Path, slots: int, threads: int, log: Path) -> None:
        self.port = free_port()
        self.log = log
        args = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-c", str(N_CTX),
                "-np", str(slots), "-t", str(threads), "-tb", str(threads), "-fa", "on", "--no-warmup",
                "--spec-type", "draft-mtp", "--spec-draft-n-max", str(N_MAX), "--spec-draft-p-min", "0",
                "--cache-ram", str(CACHE_RAM_MIB), "-v"]
        self.out = log.open("w")
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until_ready(self.url, self.proc)

    def ask(self, ids: list[int], n: int) -> dict:
        body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": True,
                "return_tokens": True, "ignore_eos": True}
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        t = out["timings"]
        return {"tokens": list(out["tokens"]), "drafted": int(t.get("draft_n") or 0),
                "accepted": int(t.get("draft_n_accepted") or 0)}

    def drafts_since(self, offset: int) -> tuple[dict[int, list[list[int]]], int]:
        """Each sequence's drafts logged after byte `offset` of the log, and the log's end. Each
        draft is a list of positions, each its top three candidates as (token, probability)."""
        self.out.flush()
        text = self.log.read_bytes()
        drafts: dict[int, list[list[list]]] = {}
        for m in _CANDIDATE.finditer(text[offset:].decode(errors="replace")):
            seq, k, pos, tok = map(int, m.groups()[:4])
            chains = drafts.setdefault(seq, [])
            if pos == 0 and k == 0:
                chains.append([])
            if k == 0:
                chains[-1].append([])
            chains[-1][-1].append((tok, float(m.group(5))))
        return drafts, len(text)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.close()


def llama_server_runs(server: Path, model: Path, ps: list[list[int]], n: int, threads: int, work: Path) -> dict:
    out = {}
    one = LlamaServer(server, model, 1, threads, work / "one.log")
    try:
        offset = 0

        def ask(name: str, ids: list[int]) -> dict:
            nonlocal offset
            r = one.ask(ids, n)
            d, offset = one.drafts_since(offset)
            r["drafts"] = d.get(0, [])
            out[name] = r
            return r

        conversation(ask, ps)
    finally:
        one.close()
    two = LlamaServer(server, model, 2, threads, work / "two.log")
    try:
        got: dict[int, dict] = {}
        threads_ = [threading.Thread(target=lambda i=i: got.__setitem__(i, two.ask(ps[2 + i], n))) for i in range(2)]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        drafts, _ = two.drafts_since(0)
        # llama-server gives each request its own slot; which one is its business: match them by the answer
        chains = list(drafts.values())
        for i in range(2):
            got[i]["drafts_by_slot"] = chains
            out[f"two slots #{i + 1}"] = got[i]
    finally:
        two.close()
    return out


# -- specdeck's engine ------------------------------------------------------------------------------

def engine_for(model: Model, slots: int, threads: int, snapshots: int = N_MAX) -> tuple[Engine, list[tuple[int, list[int]]]]:
    """The target and head contexts as a plan makes them (output rows capped as llama-server caps
    them), the head drafting alone at length N_MAX with no p_min, and the drafts it makes, recorded.
    `snapshots` below N_MAX: a draft longer than the recurrent rollback snapshots is verified from
    a saved partial state (a context checkpoint), and a rollback past them replays the kept tokens."""
    p = ModelParams(N_CTX, 2048, 512, slots, True, "f16", "f16", True, False, snapshots, 0, n_outputs_max=slots * (1 + N_MAX))
    target = Context(model, p, threads)
    hp = ModelParams(N_CTX, 2048, 512, slots, True, "f16", "f16", True, False, 0, 0, n_outputs_max=slots)
    head = MtpDrafter(target, Context(model, hp, threads, mtp_of=target), p_min=0.0)
    drafts: list[tuple[int, list[int]]] = []
    propose_all = head.propose_all

    def recorded(asks):
        out = propose_all(asks)
        drafts.extend((a.seq, list(d.tokens)) for a, d in zip(asks, out) if d.tokens)
        return out

    head.propose_all = recorded
    checkpoints = Checkpoints(target, 4, 256) if snapshots < N_MAX else None
    return Engine(target, head, slots, draft_limit=N_MAX, saved_bytes=CACHE_RAM_MIB * 2**20, checkpoints=checkpoints), drafts


def _summary(steps: list, drafts: list[list[int]]) -> dict:
    return {"tokens": [t for s in steps for t in s.tokens], "drafted": sum(s.drafted for s in steps),
            "accepted": sum(s.accepted for s in steps), "drafts": drafts}


def _request(ids: list[int], n: int) -> Request:
    return Request(prompt=ids, max_tokens=n, speculative=SpecParams(n_max=N_MAX), stop_tokens=set())


def specdeck_runs(model: Model, ps: list[list[int]], n: int, threads: int) -> dict:
    out = {}
    engine, drafts = engine_for(model, 1, threads)

    def ask(name: str, ids: list[int]) -> dict:
        drafts.clear()
        out[name] = _summary(list(engine.generate(_request(ids, n))), [d for _, d in drafts])
        return out[name]

    conversation(ask, ps)
    out["restored"]["reused_tokens"] = engine.slots[0].record.reused_tokens  # the conversation's, from host memory
    engine.drafter.close()

    engine, drafts = engine_for(model, 1, threads, snapshots=1)
    restores = []  # each replay puts the slot's partial state from before the verify back first
    load_partial = engine.target.load_partial
    engine.target.load_partial = lambda seq, data: restores.append(seq) or load_partial(seq, data)
    steps = list(engine.generate(_request(ps[0], n)))
    out["fresh, replayed"] = {**_summary(steps, [d for _, d in drafts]), "replays": len(restores)}
    engine.drafter.close()

    engine, drafts = engine_for(model, 2, threads)
    slots = engine.slots
    recs = {s.id: [engine.start(s, _request(ps[2 + s.id], n))] for s in slots}
    active = [s for s in slots if recs[s.id][0].finish_reason is None]
    while active:
        for rec in engine.step(active):
            recs[rec.slot].append(rec)
        for s in list(active):
            if recs[s.id][-1].finish_reason is not None:
                engine.finish(s, recs[s.id][-1].finish_reason)
                active.remove(s)
    for s in slots:
        out[f"two slots #{s.id + 1}"] = _summary(recs[s.id], [d for seq, d in drafts if seq == s.id])
    engine.drafter.close()
    return out


# -- the comparison -------------------------------------------------------------------------------

def _kept(draft: list[int], answer: list[int], at: int) -> int:
    n = 0
    while n < len(draft) and at + n < len(answer) and draft[n] == answer[at + n]:
        n += 1
    return n


def compare(ours: dict, theirs: dict, n: int) -> list[dict]:
    """Per case: the answers, and draft by draft the tokens. llama-server's head drafts n_max tokens
    and the server then cuts the draft to the room the answer has left; specdeck asks the head for
    only that many: the drafts are compared over that room. Where they differ, llama-server's top two
    candidates at the first differing position say whether it was a near-tie."""
    rows = []
    for name, o in ours.items():
        t = theirs[name.split(",")[0]]
        chains = t["drafts_by_slot"] if "drafts_by_slot" in t else [t["drafts"]]
        # two slots: llama-server's slot for this request is the one whose drafts agree with ours most
        their = max(chains, key=lambda c: sum(a[:1] == [p[0][0] for p in b][:1] for a, b in zip(o["drafts"], c)))
        at, differing = 1, []  # the first token comes with the prompt
        for i, (a, b) in enumerate(zip(o["drafts"], their)):
            room = min(N_MAX, n - at - 1)
            b_tokens = [p[0][0] for p in b][:room]
            if a != b_tokens:
                j = next(j for j in range(min(len(a), len(b_tokens))) if a[j] != b_tokens[j])
                differing.append({"draft": i, "position": j, "ours": a[j], "llama_server_top2": b[j][:2]})
            at += _kept(a, o["tokens"], at) + 1
        rows.append({"case": name, "tokens_equal": o["tokens"] == t["tokens"], "drafts": (len(o["drafts"]), len(their)),
                     "differing": differing, "drafted": (o["drafted"], t["drafted"]), "accepted": (o["accepted"], t["accepted"])})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path, help="keep the stand-in and llama-server's logs here")
    a = ap.parse_args()
    server = find_llama_server()
    if server is None:
        print("no llama-server: bash scripts/build_llama_server.sh builds one", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        work = a.workdir or Path(d)
        work.mkdir(parents=True, exist_ok=True)
        path = write_mtp_standin(work / "mtp.gguf")
        model = Model(path, load_mtp=True)
        ps = prompts(model.n_vocab)
        ours = specdeck_runs(model, ps, a.tokens, a.threads)  # one llama.cpp process at a time
        model.close()
        theirs = llama_server_runs(server, path, ps, a.tokens, a.threads, work)
    rows = compare(ours, theirs, a.tokens)
    print(f"MTP stand-in (state weight 1.0), greedy, n_max {N_MAX}, p_min 0, {a.tokens} tokens per request")
    print(f"{'case':<14} {'answer':<8} {'drafts (ours/theirs)':<21} {'differing drafts':<17} "
          f"{'drafted':<10} {'accepted':<10}")
    ok = True
    for r in rows:
        ties = all(abs(d["llama_server_top2"][0][1] - d["llama_server_top2"][1][1]) < NEAR_TIE for d in r["differing"]
                   if len(d["llama_server_top2"]) == 2)
        ok &= r["tokens_equal"] and r["drafted"][0] == r["drafted"][1] and r["accepted"][0] == r["accepted"][1] and ties
        print(f"{r['case']:<14} {'same' if r['tokens_equal'] else 'DIFFERS':<8} {'%d / %d' % r['drafts']:<21} "
              f"{len(r['differing']):<17} {'%d / %d' % r['drafted']:<10} {'%d / %d' % r['accepted']:<10}")
        for d in r["differing"]:
            top = ", ".join(f"{tok} ({p:.3f})" for tok, p in d["llama_server_top2"])
            print(f"    draft {d['draft']} position {d['position']}: ours {d['ours']}, llama-server's top two {top}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "ours": ours, "theirs": theirs}, indent=1))
    print("all agree" if ok else "differences above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
