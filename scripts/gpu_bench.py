#!/usr/bin/env python3
"""The 27B preset's shapes on a real accelerator: memory against the plan, draft and verify costs,
and the speed speculation would reach.

    python scripts/gpu_bench.py --preset qwen3.6-27b        on a GPU machine (CUDA build of llama-cpp-python)
    python scripts/gpu_bench.py --preset qwen3.6-27b-mtp    the target drafting with its own MTP head
    python scripts/gpu_bench.py --dry-run                   the same steps at a small shape on the CPU

Steps: write target and draft files of the preset's shapes with random weights; plan them with
`specdeck`'s planner for the card (110K context); create both contexts with the plan's parameters
and compare what llama.cpp allocates (and, on a GPU, the VRAM pynvml sees) with each planned term;
time a draft token (c_draft) and a target verify batch of k tokens (c_verify(k), k = 1..16) at a
short and at a long context; project tokens/s for acceptance 0.6 / 0.7 / 0.8 with the best draft
length, next to plain decoding. With the MTP preset the drafter is the target's nextn head: c_draft
is one head token (c_mtp), and c_verify(k) includes the head's evaluation of the verified tokens,
which every step pays. Beside a prompt (#63): a verify, a prompt chunk and both in one decode at a
16K-token prompt's depth, and what each way of reading it leaves the prompt within the time-between-
tokens budget. Prints a table, writes gpu_bench.json to --out (or $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.drafting.mtp import KIND as MTP  # noqa: E402
from app.gguf.info import read_model_info  # noqa: E402
from app.gguf.synthetic import SHAPES, small, write_random  # noqa: E402
from app.llama.backend import capture_llama_log  # noqa: E402
from app.llama.context import Context, Model  # noqa: E402
from app.llama.measure import parse_allocation  # noqa: E402
from app.plan import terms as M  # noqa: E402
from app.plan.hardware import detect, read_gpus  # noqa: E402
from app.plan.planner import PlanRequest, make_plan  # noqa: E402

PAIRS = {"qwen3.6-27b": ("qwen3.6-27b", "qwen3.5-0.8b"), "gemma3-27b": ("gemma3-27b", "gemma3-270m"),
         "qwen3.6-27b-mtp": ("qwen3.6-27b-mtp",)}  # no draft model: the target's MTP head drafts
KS = list(range(1, 17))
ALPHAS = (0.6, 0.7, 0.8)
MIX_TOKENS = (16, 64, 128, 256, 512)  # prompt tokens beside a verify in the mixed-batch case
TBT_BUDGET = 1.5  # specdeck serve's default --tbt-budget
MiB = 1024 * 1024


def write_models(preset: str, dry_run: bool, workdir: Path) -> tuple[Path, Path | None]:
    workdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in PAIRS[preset]:
        shape = small(SHAPES[name]) if dry_run else SHAPES[name]
        path = workdir / f"{shape.name}.gguf"
        if not path.exists():
            t = time.perf_counter()
            write_random(path, shape, seed=len(paths))
            print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s", flush=True)
        paths.append(path)
    return paths[0], paths[1] if len(paths) > 1 else None


def load(path: Path, params, threads: int, load_mtp: bool = False):
    with capture_llama_log() as lines:
        model = Model(path, params.n_gpu_layers, load_mtp=load_mtp)
        ctx = Context(model, params, threads)
    return model, ctx, parse_allocation(lines)


def load_mtp_head(tc: Context, params, threads: int):
    """The target's MTP head context and its drafter; the allocation of that context."""
    from app.engine.drafters.mtp import MtpDrafter

    with capture_llama_log() as lines:
        head = Context(tc.model, params, threads, mtp_of=tc)
    return MtpDrafter(tc, head), parse_allocation(lines)


class HeadStream:
    """Times one MTP head draft token after the target's stream (the head follows the target)."""

    def __init__(self, drafter, target: Stream) -> None:
        self.drafter, self.target = drafter, target

    def step(self, k: int) -> None:
        history = [5] * (self.target.pos + 1)  # only the length matters: the head drafts at its end
        self.drafter.propose(0, history, k)
        self.drafter.mtp.synchronize()

    def fill(self, upto: int) -> float:
        return 0.0  # the head evaluated the prompt with the target


def vram_used() -> int | None:
    gpus = read_gpus()
    return gpus[0].total - gpus[0].free if gpus else None


def mtp_rows(plan, alloc, device: str) -> list[dict]:
    """The MTP head's planned terms vs its context's allocation."""
    planned = {t.name: t.bytes for t in plan.terms}
    on_dev = (lambda kind: sum(v for b, v in alloc.by_kind.get(kind, {}).items() if b.startswith("CUDA") and "Host" not in b)) \
        if device == "cuda" else alloc.total
    rows = [("KV cache", planned.get("MTP KV cache", 0), on_dev("KV")),
            ("compute buffer", planned.get("MTP compute buffer", 0), on_dev("compute"))]
    return [{"model": "MTP head", "term": n, "planned": p, "measured": m, "ratio": (p / m) if m else None}
            for n, p, m in rows if p or m]


def memory_rows(plan, role: str, alloc, device: str, path: Path) -> list[dict]:
    """Planned term vs what llama.cpp allocated for it."""
    planned = {t.name: t.bytes for t in plan.terms}
    dev = [b for b in alloc.by_kind.get("model", {}) if b.startswith("CUDA") and "Host" not in b]
    if device == "cuda":
        weights = sum(alloc.get("model", b) for b in dev)
        rows = [("weights", planned.get(f"{role} weights", 0), weights),
                ("weights on host", planned.get(f"{role} weights on host", 0), alloc.get("model", "CPU_Mapped"))]
        on_dev = lambda kind: sum(v for b, v in alloc.by_kind.get(kind, {}).items() if b.startswith("CUDA") and "Host" not in b)  # noqa: E731
    else:  # llama.cpp reports the mapped span; the plan counts all tensors (>= the span)
        info = read_model_info(path)
        rows = [("weights (mapped span)", M.mapped_report_bytes(info), alloc.get("model", "CPU_Mapped")),
                ("CPU repack copy", planned.get(f"{role} CPU repack copy", 0), alloc.get("model", "CPU_REPACK"))]
        on_dev = alloc.total
    rows += [("KV cache", planned.get(f"{role} KV cache", 0), on_dev("KV")),
             ("recurrent state", planned.get(f"{role} recurrent state", 0), on_dev("RS")),
             ("compute buffer", planned.get(f"{role} compute buffer", planned.get(f"{role} compute (hidden-state output)", 0)),
              on_dev("compute"))]
    return [{"model": role, "term": n, "planned": p, "measured": m,
             "ratio": (p / m) if m else None} for n, p, m in rows if p or m]


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


class Stream:
    """Feeds tokens to one context at increasing positions (no rollback needed for timing)."""

    def __init__(self, ctx: Context, n_vocab: int) -> None:
        self.ctx, self.pos, self.n_vocab = ctx, 0, n_vocab

    def step(self, k: int, logits: bool = True) -> None:
        b = self.ctx.batch
        b.clear()
        for _ in range(k):
            b.add((self.pos * 7919 + 13) % (self.n_vocab - 10) + 5, self.pos, 0, logits)
            self.pos += 1
        self.ctx.decode(b)
        self.ctx.synchronize()

    def fill(self, upto: int) -> float:
        """Prefill to position `upto` in n_batch chunks; returns tokens/s."""
        t, n0 = time.perf_counter(), self.pos
        while self.pos < upto:
            self.step(min(self.ctx.params.n_batch, upto - self.pos), logits=False)
        return (self.pos - n0) / (time.perf_counter() - t)


def costs(target: Stream, draft: Stream, reps: int) -> dict:
    c_draft = timed(lambda: draft.step(1), reps * 2)
    c_verify = {k: timed(lambda k=k: target.step(k), reps) for k in KS}
    return {"c_draft_s": c_draft, "c_verify_s": c_verify}


def mixed_costs(target: Stream, depth: int, k: int, reps: int) -> dict:
    """A prompt read beside an answer (#63's case): sequence 1 is filled to `depth`; then, timed at
    that depth, the answer's verify of k tokens on sequence 0 (the target's stream) alone, m prompt tokens of
    sequence 1 alone, and both in one decode (a mixed batch), m in MIX_TOKENS. Both sequences only
    go forward (as a step keeping its tokens and a prompt read on), so a model with recurrent layers
    is timed the same way. Returns the costs and, for a time between tokens of at most TBT_BUDGET
    times the verify's, the prompt's tokens/s decoding first (chunks of 512 in the time the budget
    leaves) against riding in the verify (the largest m whose mixed batch keeps the budget)."""
    ctx, n_vocab = target.ctx, target.n_vocab
    pos = {0: target.pos, 1: 0}  # the answer's next position, the prompt's

    def run(n0: int, n1: int) -> None:
        b = ctx.batch
        b.clear()
        for seq, n in ((0, n0), (1, n1)):
            for _ in range(n):
                b.add((pos[seq] * 7919 + 13 + seq) % (n_vocab - 10) + 5, pos[seq], seq, seq == 0)
                pos[seq] += 1
        ctx.decode(b)
        ctx.synchronize()

    while pos[1] < depth:
        run(0, min(ctx.params.n_batch, depth - pos[1]))
    verify = timed(lambda: run(k, 0), reps)
    chunk = {m: timed(lambda m=m: run(0, m), reps) for m in MIX_TOKENS}
    mixed = {m: timed(lambda m=m: run(k, m), reps) for m in MIX_TOKENS}
    target.pos = pos[0]
    ctx.seq_rm(1, 0, -1)  # the prompt's cells back for what follows
    allowed = TBT_BUDGET * verify
    fits = [m for m in MIX_TOKENS if mixed[m] <= allowed]
    best = max(MIX_TOKENS)
    return {"depth": depth, "k": k, "verify_s": verify, "chunk_s": chunk, "mixed_s": mixed,
            "mixed_over_parts": {m: mixed[m] / (verify + chunk[m]) for m in MIX_TOKENS},
            "prompt_tok_s_decode_first": (TBT_BUDGET - 1) / TBT_BUDGET * best / chunk[best],
            "prompt_tok_s_mixed": max((m / mixed[m] for m in fits), default=0.0),
            "tbt_over_alone_llama_server": mixed[best] / verify}


def project(c: dict) -> dict:
    """Tokens/s with the best draft length for each acceptance rate: E[tokens] / step cost."""
    plain = 1.0 / c["c_verify_s"][1]
    out = {"plain_tok_s": plain}
    for a in ALPHAS:
        best = max(((1 - a ** (k + 1)) / (1 - a) / (k * c["c_draft_s"] + c["c_verify_s"][k + 1]), k)
                   for k in KS if k + 1 in c["c_verify_s"])
        out[f"alpha_{a}"] = {"tok_s": best[0], "k": best[1], "speedup": best[0] / plain}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PAIRS), default="qwen3.6-27b")
    ap.add_argument("--dry-run", action="store_true", help="small shapes on the CPU (what the tests run)")
    ap.add_argument("--ctx", type=int, help="planned context (default 110000; dry run 8192)")
    ap.add_argument("--vram", type=float, help="card total in GiB to plan for (default: the card's total)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "specdeck-bench")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)

    device = "cpu" if args.dry_run else "cuda"
    hw = detect()
    if device == "cuda" and not hw.gpus:
        print("error: no NVIDIA GPU found (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    ctx = args.ctx or (8192 if args.dry_run else 110_000)
    t_path, d_path = write_models(args.preset, args.dry_run, args.workdir)
    t_info, d_info = read_model_info(t_path), read_model_info(d_path) if d_path else None
    mtp = d_path is None
    vram = int(args.vram * 2**30) if args.vram else (hw.gpus[0].total if hw.gpus and device == "cuda" else None)
    req = PlanRequest(device=device, vram=vram, ctx=ctx, ctx_is_user_choice=True)
    plan = make_plan(t_info, d_info, req, hw, ctx, head=MTP.rows if mtp else None)
    threads = 2 if device == "cpu" else 8

    before = vram_used()
    # c_verify(k) is timed up to k = 16 in one sequence, past the plan's cap on a decode's logits rows
    # (slots x (1 + draft length)): llama.cpp refuses a batch over it, so the timed context gets 16
    # (the compute buffer's logits phase is then 16 rows, not the layer phase that sets its size)
    # and two sequences at least: the mixed-batch case reads a prompt on a second one
    t_params = replace(plan.target.with_rows(max(KS)), n_seq_max=max(2, plan.target.n_seq_max))
    tm, tc, t_alloc = load(t_path, t_params, threads, load_mtp=mtp)
    rows = memory_rows(plan, "target", t_alloc, device, t_path)
    target = Stream(tc, tm.n_vocab)
    if mtp:
        head, h_alloc = load_mtp_head(tc, plan.head, threads)
        rows += mtp_rows(plan, h_alloc, device)
        closing = [head.mtp, tc, tm]
        draft = HeadStream(head, target)
    else:
        dm, dc, d_alloc = load(d_path, plan.draft, threads)
        rows += memory_rows(plan, "draft", d_alloc, device, d_path)
        closing = [tc, dc, tm, dm]
        draft = Stream(dc, dm.n_vocab)
    short_prefill = target.fill(256)
    draft.fill(256)
    short = costs(target, draft, args.reps)
    mixed = mixed_costs(target, min(16384, tc.n_ctx // 4), 5, args.reps)
    long_at = min(plan.ctx, tc.n_ctx) - (sum(KS) * args.reps + 64)
    long_prefill = target.fill(long_at)
    draft.fill(long_at)
    long = costs(target, draft, args.reps)
    peak = vram_used()

    modeled = sum(t.bytes for t in plan.terms if t.where == "device" and t.name not in ("runtime reserve", "safety margin"))
    report = {
        "preset": args.preset, "device": device, "dry_run": args.dry_run, "drafter": "mtp" if mtp else "draft model",
        "gpu": hw.gpus[0].name if hw.gpus and device == "cuda" else None,
        "plan": plan.to_json(),
        "memory": rows,
        "vram": None if before is None else {"before": before, "peak": peak, "used_by_run": peak - before,
                                              "planned_without_reserve_and_margin": modeled,
                                              "planned_total": plan.used, "budget": plan.budget},
        "prefill_tok_s": {"short": short_prefill, "long": long_prefill, "long_ctx": long_at},
        "short_ctx": {**short, "projection": project(short)},
        "long_ctx": {**long, "projection": project(long), "position": long_at},
        "beside_a_prompt": mixed,
    }
    print_report(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_bench.json").write_text(json.dumps(report, indent=1))
    for x in closing:
        x.close()
    return 0


def print_report(r: dict) -> None:
    p = r["plan"]
    print(f"\n{r['preset']} ({'dry run, small shape, CPU' if r['dry_run'] else r['gpu']}): "
          f"ctx {p['ctx']:,}, K/V {p['target']['type_k']}, {p['parallel']} slot(s), draft_max {p['draft_max']}")
    print(f"{'term':32} {'planned MiB':>12} {'measured MiB':>13} {'ratio':>6}")
    for row in r["memory"]:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] else "-"
        print(f"{row['model'] + ' ' + row['term']:32} {row['planned'] / MiB:12.1f} {row['measured'] / MiB:13.1f} {ratio:>6}")
    if r["vram"]:
        v = r["vram"]
        print(f"VRAM used by the run {v['used_by_run'] / MiB:.0f} MiB; planned {v['planned_without_reserve_and_margin'] / MiB:.0f} MiB "
              f"(+ reserve and margin = {v['planned_total'] / MiB:.0f} of {v['budget'] / MiB:.0f} MiB)")
    for name in ("short_ctx", "long_ctx"):
        c = r[name]
        cv = c["c_verify_s"]
        print(f"{name}: c_draft {c['c_draft_s'] * 1e3:.2f} ms{' (one MTP head token)' if r.get('drafter') == 'mtp' else ''}; "
              "c_verify(k) ms: "
              + " ".join(f"{k}:{cv[k] * 1e3:.1f}" for k in (1, 2, 4, 8, 16)))
        pr = c["projection"]
        print(f"  plain {pr['plain_tok_s']:.1f} tok/s; " + "; ".join(
            f"alpha {a}: {pr[f'alpha_{a}']['tok_s']:.1f} tok/s (k={pr[f'alpha_{a}']['k']}, {pr[f'alpha_{a}']['speedup']:.2f}x)"
            for a in ALPHAS))
    m = r["beside_a_prompt"]
    print(f"beside a prompt at {m['depth']:,} tokens, a verify of {m['k']} ({m['verify_s'] * 1e3:.1f} ms): mixed / "
          "(verify + chunk) " + " ".join(f"{n}:{v:.2f}" for n, v in m["mixed_over_parts"].items())
          + f"; the prompt at a {TBT_BUDGET}x budget: decode first {m['prompt_tok_s_decode_first']:.0f} tok/s, "
          f"riding {m['prompt_tok_s_mixed']:.0f} tok/s; 512 tokens in the batch (llama-server): "
          f"{m['tbt_over_alone_llama_server']:.1f}x the time between tokens")


if __name__ == "__main__":
    sys.exit(main())
