"""`specdeck verify`: the same prompts with speculation on and off, every step checked.

Greedy decoding. On every step of the speculative run, each emitted token must be the target's
argmax at its position given the logits the target computed in that step (the exact invariant).
The two outputs are then compared: identical, or first different at a position whose top-two
logit gap is within llama.cpp's batch-shape numerics (a batch of k tokens is not computed with
bit-identical numerics to one token at a time, so a near-tie can flip).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.commands.common import (
    catalog_from_args,
    chat_template,
    local_path,
    make_fetcher,
    make_selection,
    out,
    plan_request_of,
    projector,
    template_file,
)
from app.drafting.kinds import head_of, rows_of
from app.engine.engine import Engine, Request, SpecParams
from app.engine.text import Tokenizer
from app.errors import SpecdeckError
from app.gguf.info import read_model_info
from app.ops.validate import GAP_TOLERANCE  # one rule for `verify` and `validate`
from app.plan.hardware import detect
from app.plan.planner import make_plan

CODE_EDIT_MODULE = """import os
import sys
from collections import Counter


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\\n") for line in f]


def count_words(lines):
    total = 0
    for line in lines:
        total += len(line.split())
    return total


def most_common_words(lines, n=10):
    counter = Counter()
    for line in lines:
        counter.update(word.lower() for word in line.split())
    return counter.most_common(n)


def summarize(path):
    lines = read_lines(path)
    words = count_words(lines)
    common = most_common_words(lines)
    print(f"{path}: {len(lines)} lines, {words} words")
    for word, n in common:
        print(f"  {word}: {n}")
    return words


def main(argv):
    if len(argv) < 2:
        print("usage: wordstats.py FILE...", file=sys.stderr)
        return 2
    total = 0
    for path in argv[1:]:
        if not os.path.exists(path):
            print(f"missing: {path}", file=sys.stderr)
            continue
        total += summarize(path)
    print(f"total: {total} words")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
"""

BUILTIN_PROMPTS = [
    {"kind": "code-completion", "prompt": "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"},
    {"kind": "code-edit", "messages": [{"role": "user", "content": (
        "Rename the function `count_words` to `word_count` everywhere in this module and return the whole "
        "module, unchanged otherwise, in one code block:\n\n```python\n" + CODE_EDIT_MODULE + "```")}]},
    {"kind": "code-question", "messages": [{"role": "user", "content": "What does Python's functools.lru_cache do, in two sentences?"}]},
    {"kind": "prose", "messages": [{"role": "user", "content": "Write a short poem about the sea at night."}]},
]


@dataclass
class PromptResult:
    kind: str
    prompt_tokens: int
    plain_tokens: int
    spec_tokens: int
    identical: bool
    first_divergence: int | None
    gap_at_divergence: float | None
    numerics_delta: float | None
    explained: bool
    invariant_violations: int
    acceptance: float | None
    tokens_per_decode: float | None
    plain_tok_s: float | None
    spec_tok_s: float | None
    explanation: str = ""


@dataclass
class EquivalenceReport:
    results: list[PromptResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.invariant_violations == 0 and r.explained for r in self.results)

    def to_json(self) -> dict:
        return {"ok": self.ok, "gap_tolerance": GAP_TOLERANCE, "prompts": [asdict(r) for r in self.results]}


def load_prompts(path: Path | None) -> list[dict]:
    """The built-in set, or a JSONL file of {"messages": [...]} / {"prompt": "..."} / {"tokens": [ids]}
    lines with an optional "kind" (token ids: a model whose vocabulary makes no text, a stand-in)."""
    if path is None:
        return BUILTIN_PROMPTS
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecdeckError(f"cannot read prompts file {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecdeckError(f"{path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(item, dict) or not (isinstance(item.get("prompt"), str) or isinstance(item.get("messages"), list)
                                              or _token_ids(item.get("tokens"))):
            raise SpecdeckError(f'{path}:{n}: each line needs "prompt" (a string), "messages" (a list) or "tokens" '
                                "(a list of token ids, not empty)")
        images = item.get("images")
        if images is not None:
            if not isinstance(images, list) or not all(isinstance(f, str) for f in images):
                raise SpecdeckError(f'{path}:{n}: "images" is a list of image files')
            item["images"] = [str(path.parent / f) for f in images]  # relative to the prompts file
        out.append(item)
    if not out:
        raise SpecdeckError(f"{path}: no prompts")
    return out


def _token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                           for t in value)


def prompt_tokens(tok: Tokenizer, item: dict) -> list[int]:
    """A prompt line's token ids: given, or the chat or text tokenized."""
    if "tokens" in item:
        n_vocab = tok.model.n_vocab
        if any(t >= n_vocab for t in item["tokens"]):
            raise SpecdeckError(f"a prompt's token id is past the vocabulary ({n_vocab:,} tokens)")
        return list(item["tokens"])
    if "messages" in item:
        return tok.chat_tokens(item["messages"])
    return tok.encode(item["prompt"])


def prompt_with_images(engine: Engine, tok: Tokenizer, item: dict) -> tuple[list[int], dict]:
    """A prompt line's ids and its images by key: the images (files, read as the server reads them)
    go before the prompt's text, through the target's projector."""
    if not item.get("images"):
        return prompt_tokens(tok, item), {}
    from app.server.errors import ApiError
    from app.server.images import ImageLimits, decode

    if "prompt" not in item or engine.vision is None:
        raise SpecdeckError('images go with a "prompt" line, on a target served with --mmproj')
    limits = ImageLimits(2**31, 2**31)
    try:
        pics = [decode(Path(f).read_bytes(), f, limits) for f in item["images"]]
    except OSError as e:
        raise SpecdeckError(f"cannot read an image: {e}") from None
    except ApiError as e:
        raise SpecdeckError(e.message) from None
    ids = engine.vision.tokenize(engine.vision.marker * len(pics) + item["prompt"], pics, add_special=tok.add_bos)
    return ids, {p.key: p for p in pics}


def single_vs_batch_delta(engine: Engine, sequence: list[int], p: int, prompt_len: int,
                          pictures: dict | None = None) -> float | None:
    """At position p: the largest logit difference between the two ways the runs compute it. Plain
    decoding evaluates the prompt in one batch, then one token at a time; speculation evaluates the
    tokens after the prompt in verify batches (here: of 4, position p-1 the first row of its batch).
    The cells of earlier positions differ by the same batch numerics and carry into position p. A
    top-two gap below 2 x this can flip the argmax. `prompt_len`: where the generated tokens start."""
    from app.engine import kv
    from app.llama.context import Context

    target = engine.target
    if target.model.is_recurrent or p < 1 or p + 1 > len(sequence):
        return None
    start = min(prompt_len, p - 1)
    # a verify batch of 4 rows, whatever the served plan capped its decodes' logits rows at
    ctx = Context(target.model, target.params.with_rows(4), 2)
    try:
        kv.evaluate(ctx, 0, sequence[:start], 0, logits_last=False,
                    images=engine.images_of(Request(prompt=sequence, pictures=pictures or {})))
        b = ctx.batch
        for pos in range(start, p):  # plain: one token at a time
            b.clear()
            b.add(sequence[pos], pos, 0, pos == p - 1)
            ctx.decode(b)
        single = ctx.logits(0).copy()
        ctx.seq_rm(0, start, -1)
        for c0 in range(start, p - 1, 4):  # speculation: verify batches
            b.clear()
            for pos in range(c0, min(c0 + 4, p - 1)):
                b.add(sequence[pos], pos, 0, False)
            ctx.decode(b)
        b.clear()
        for j, tok in enumerate(sequence[p - 1 : p + 3]):
            b.add(tok, p - 1 + j, 0, True)
        ctx.decode(b)
        return float(abs(ctx.logits(0) - single).max())
    finally:
        ctx.close()


def _run(engine: Engine, req: Request) -> tuple[list[int], list, float]:
    t = time.perf_counter()
    steps = list(engine.generate(req))
    return [x for s in steps for x in s.tokens], steps, time.perf_counter() - t


def check_equivalence(engine: Engine, tok: Tokenizer, item: dict, max_tokens: int, n_max: int) -> PromptResult:
    ids, pictures = prompt_with_images(engine, tok, item)
    base = dict(prompt=ids, pictures=pictures, max_tokens=max_tokens, stop_tokens=tok.stop_tokens, trace=True)
    plain, plain_steps, t_plain = _run(engine, Request(**base, speculative=SpecParams(enabled=False)))
    spec, spec_steps, t_spec = _run(engine, Request(**base, speculative=SpecParams(n_max=n_max)))
    rec = engine.slots[0].record
    violations = sum(a != b for s in spec_steps for a, b in zip(s.tokens, s.target_argmax or []))
    gaps = [g for s in spec_steps for g in (s.top2_gap or [])]
    div = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if div is None and len(plain) != len(spec):
        div = min(len(plain), len(spec))
    gap = gaps[div] if div is not None and div < len(gaps) else None
    delta = single_vs_batch_delta(engine, ids + plain, len(ids) + div, len(ids), pictures) if div is not None else None
    bound = 2 * delta if delta is not None else GAP_TOLERANCE
    explained = div is None or (gap is not None and gap <= max(bound, 1e-6))
    if div is None:
        text = "identical"
    elif explained:
        text = (f"first differs at token {div}, where the target's top two logits are {gap:.3f} apart; "
                f"the same position computed as plain decoding and as verify batches do differs by up to "
                f"{delta if delta is None else round(delta, 3)}: "
                f"a near-tie flipped by llama.cpp's batch numerics")
    else:
        text = f"first differs at token {div} with a top-two gap of {gap if gap is None else round(gap, 3)}: NOT a near-tie"
    return PromptResult(
        kind=item.get("kind", "custom"), prompt_tokens=len(ids), plain_tokens=len(plain), spec_tokens=len(spec),
        identical=div is None, first_divergence=div, gap_at_divergence=gap, numerics_delta=delta, explained=explained,
        invariant_violations=violations, acceptance=rec.acceptance, tokens_per_decode=rec.tokens_per_decode,
        plain_tok_s=len(plain) / t_plain if t_plain else None, spec_tok_s=len(spec) / t_spec if t_spec else None,
        explanation=text,
    )


def _walk(ctx, prompt: list[int]):
    """The target alone, one token at a time on sequence 0 of a fresh context `ctx`: yields the logits
    at each next position and is sent the token to append."""
    from app.engine import kv

    ctx.clear()
    last = kv.evaluate(ctx, 0, prompt, 0, logits_last=True)
    pos = len(prompt)
    while True:
        token = yield ctx.logits(last)
        ctx.batch.clear()
        last = ctx.batch.add(int(token), pos, 0, True)
        ctx.decode(ctx.batch)
        pos += 1


def _gap(logits) -> tuple[list[int], float]:
    import numpy as np

    order = np.argpartition(logits, -8)[-8:]
    order = order[np.argsort(logits[order])[::-1]]
    return [int(t) for t in order], float(logits[order[0]] - logits[order[1]])


def token_divergence(ctx, prompt: list[int], a: list[int], b: list[int]) -> tuple[int, float] | None:
    """Where two greedy continuations of `prompt` part: (index, the target's top-two logit gap there,
    computed one token at a time along `a`), or None when they are equal. A gap within
    GAP_TOLERANCE is a near-tie that batch numerics can flip."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if i == len(a) == len(b):
        return None
    walk = _walk(ctx, prompt)
    logits = next(walk)
    for t in a[:i]:
        logits = walk.send(t)
    return i, _gap(logits)[1]


def text_divergence(ctx, tok: Tokenizer, prompt: list[int], a: str, b: str, limit: int = 4096) -> tuple[int, float] | None:
    """As `token_divergence`, for answers known only as text (what an HTTP client sees).

    Walks the target one token at a time along the two answers' common text, taking at each
    position the highest-ranked of its top 8 tokens that keeps to that text, until a token would
    cross the first differing character. Returns (token index, top-two gap there), or None when the
    texts are equal; a common text the target cannot follow gives an infinite gap.
    """
    import codecs

    if a == b:
        return None
    common = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    same, done = a[:common], b""

    def render(data: bytes) -> str:  # complete characters only, as the server streams them
        return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)

    walk = _walk(ctx, prompt)
    logits = next(walk)
    for i in range(limit):
        order, gap = _gap(logits)
        if len(render(done)) >= common:
            return i, gap
        for t in order:
            text = render(done + tok.piece_bytes(t))
            if len(text) > common and text[:common] == same:
                return i, gap  # this token crosses the first differing character
            if text != render(done) and same.startswith(text) or text == render(done) and tok.piece_bytes(t):
                break
        else:
            return i, float("inf")
        done += tok.piece_bytes(t)
        logits = walk.send(t)
    return limit, float("inf")


# -- the command -------------------------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from app.engine.loader import load

    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    if sel.draft is None and not sel.mtp:
        raise SpecdeckError("verify needs a draft model (a preset with one, or --draft), or --draft mtp")
    prompts = load_prompts(Path(args.prompts) if args.prompts else None)
    fetcher = make_fetcher(offline=True)
    target = read_model_info(local_path(fetcher, sel.target))
    draft = read_model_info(local_path(fetcher, sel.draft)) if sel.draft else None
    vision = projector(fetcher, sel, target, need=True)
    if any(item.get("images") for item in prompts) and vision is None:
        raise SpecdeckError("the prompts have images: name the target's vision projector with --mmproj")
    hw = detect()
    req = plan_request_of(ctx=args.ctx, ctx_is_user_choice=True, parallel=1, draft_max=args.draft_max)
    plan = make_plan(target, draft, req, hw, args.ctx, head=rows_of(sel), projector=vision)
    loaded = load(plan, target, draft, hw.cpu_count, chat_template=chat_template(template_file(args), sel, target), head=head_of(sel),
                  mmproj=vision.path if vision is not None else None)
    report = EquivalenceReport()
    try:
        for item in prompts:
            r = check_equivalence(loaded.engine, loaded.tokenizer, item, args.max_tokens, plan.draft_max)
            report.results.append(r)
            if not args.json:
                mark = "[green]ok[/]" if r.invariant_violations == 0 and r.explained else "[red]FAIL[/]"
                acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
                out.print(f"{mark} {r.kind}: {r.explanation}; invariant violations {r.invariant_violations}; "
                          f"acceptance {acc}, {r.tokens_per_decode or 0:.2f} tokens/decode; "
                          f"plain {r.plain_tok_s or 0:.1f} tok/s, speculative {r.spec_tok_s or 0:.1f} tok/s", soft_wrap=True)
    finally:
        loaded.close()
    if args.json:
        out.print_json(json.dumps(report.to_json()))
    return 0 if report.ok else 1
