"""The go-live checklist, run over a server's HTTP API (in-process or `--url`, the same code):
health, a smoke request streamed and not, decode speed with speculation on and off, acceptance,
greedy equivalence, TTFT cold and cached, aggregate throughput at 1 and `parallel` streams, a
request near the planned context with its peak memory against the plan, an optional soak, and the
GPU's temperature and power throughout.

Every check returns a `Check` (ok / warn / fail / skip, a one-line summary, its figures); the figures
of all checks are the flat dict a baseline records and `compare` judges. Nothing here draws: the
command renders the table and the progress bar.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.errors import SpecdeckError
from app.ops.client import Client, completion, wait_ready
from app.ops.readings import Sampler

GAP_TOLERANCE = 1.0  # logits: a top-two gap within this is a near-tie that batch numerics can flip (single vs
# batched numerics differ by up to ~0.8 here; `specdeck verify` and `validate` share the rule)

EDIT_SOURCE = (
    "def parse_line(line):\n    name, _, value = line.partition('=')\n    name = name.strip()\n"
    "    value = value.strip()\n    if not name:\n        raise ValueError('empty name')\n    return name, value\n"
)
DECODE_PROMPTS = (  # a code edit (the answer copies the request: what coding agents send most) and a completion
    f"# Add type hints to this function. Keep everything else as it is.\n{EDIT_SOURCE}\n# With type hints:\n"
    "def parse_line(line: str) -> tuple[str, str]:\n",
    "def quicksort(items: list[int]) -> list[int]:\n    \"\"\"Sort a list of integers.\"\"\"\n",
)
EQUIVALENCE_PROMPTS = (
    "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n",
    "# A command-line tool that counts words in a file\nimport argparse\n",
    "Q: What does HTTP status 429 mean?\nA:",
    "SELECT name, COUNT(*) FROM orders",
)
LONG_LINES = (  # varied source lines, so the long document is text a model reads, not one line repeated
    "def handler_{i}(request, limit={i}):\n    return [x * {i} for x in request.items[:limit]]\n",
    "class Record{i}:\n    \"\"\"Row {i} of the ledger.\"\"\"\n    amount: int = {i}\n",
    "# step {i}: check the input, log it, and move on to step {j}\n",
    "assert compute({i}) == {j}, 'value {i} should map to {j}'\n",
)


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    summary: str
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "figures": self.figures,
                "seconds": round(self.seconds, 2)}


@dataclass
class Options:
    decode_tokens: int = 64  # fixed-length generation for the speed checks
    repeats: int = 2  # ABBA rounds of (on, off, off, on) per prompt
    equivalence_tokens: int = 48
    context_margin: int = 256  # tokens the long document leaves free of the planned context
    soak_minutes: float = 0.0
    ready_timeout: float = 600.0  # seconds to wait for a loading server's /health


# -- the checks ----------------------------------------------------------------------------------

def check_health(client: Client, opts: Options, facts: dict) -> Check:
    waited = wait_ready(client, opts.ready_timeout)
    status = client.get("/v1/status")
    facts.update(status=status)
    plan = status.get("plan") or {}
    return Check("health", "ok", f"ready{f' after {waited:.0f} s loading' if waited >= 1 else ''}; {status.get('model_id')}, context {plan.get('ctx', 0):,}, "
                 f"{status.get('slots_total', plan.get('parallel'))} slot(s), draft {'loaded' if (status.get('models') or {}).get('draft') else 'none'}",
                 {"ctx": plan.get("ctx"), "parallel": plan.get("parallel")})


def check_smoke(client: Client, opts: Options, facts: dict) -> Check:
    """The API's own path: the whole answer and the streamed one, equal token for token, or parted
    at a near-tie. Neither drafts from earlier requests: the second would copy the first's answer
    (the suffix index) in long verify batches. Even so the two runs draft differently (the
    controller has learned in between), and a verify batch's arithmetic is not a single decode's:
    where the whole answer's top-two gap is within GAP_TOLERANCE they may part (`specdeck verify`'s
    rule); whether drafting changes the output is the greedy-equivalence check's question."""
    prompt = "Write a Python function that returns the largest of three numbers.\n"
    whole = completion(client, prompt, 32, ignore_eos=False, n_probs=2)
    text, tokens = whole.get("content", ""), whole.get("tokens") or []
    streamed_text, streamed_tokens = "", []
    for _, event in client.stream("/completion", {"prompt": prompt, "n_predict": 32, "temperature": 0.0,
                                                  "return_tokens": True, "speculative": {"cross_request": False}}):
        streamed_text += event.get("content", "")
        if not event.get("stop"):
            streamed_tokens += event.get("tokens") or []
    problems = []
    if not text.strip():
        problems.append("empty answer")
    if "\ufffd" in text or "\ufffd" in streamed_text:
        problems.append("a replacement character (U+FFFD) in the text")
    at, gap = _divergence(whole, {"tokens": streamed_tokens}) if streamed_tokens else (None, None)
    near_tie = at is not None and gap is not None and gap <= GAP_TOLERANCE
    if at is not None and not near_tie:
        problems.append(f"the streamed tokens differ from the whole answer's from token {at}"
                        f" (top-two gap {'?' if gap is None else f'{gap:.3f}'})")
    elif at is None and streamed_text != text:
        problems.append("the streamed text differs from the whole answer")
    if problems:
        return Check("smoke", "fail", "; ".join(problems), {"smoke_ok": False})
    if near_tie:
        return Check("smoke", "ok", f"{len(tokens)} tokens, valid UTF-8; streamed and whole part at token {at}, "
                     f"a near-tie (gap {gap:.3f})", {"smoke_ok": True, "retokenizes": None})
    again = client.post("/tokenize", {"content": text, "add_special": False}).get("tokens", [])
    same = again == tokens
    where = next((i for i, (a, b) in enumerate(zip(again, tokens)) if a != b), min(len(again), len(tokens)))
    return Check("smoke", "ok" if same else "warn",
                 f"{len(tokens)} tokens, valid UTF-8, streamed = whole; " +
                 ("the text re-tokenizes to the same tokens" if same else
                  f"the text re-tokenizes differently from token {where} (a non-canonical tokenization the model chose)"),
                 {"smoke_ok": True, "retokenizes": same})


def check_decode(client: Client, opts: Options, facts: dict) -> Check:
    """Fixed-length greedy generation, speculation on and off in ABBA order per prompt; the server's own
    decode timings (prompt evaluation excluded)."""
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for prompt in DECODE_PROMPTS:
        for _ in range(opts.repeats):
            for mode in (True, False, False, True):
                t = completion(client, prompt, opts.decode_tokens, speculative=mode).get("timings", {})
                runs[mode].append(t)
    tps = {m: statistics.median(r["predicted_per_second"] for r in runs[m]) for m in runs}
    drafted = sum(r.get("draft_n") or 0 for r in runs[True])
    accepted = sum(r.get("draft_n_accepted") or 0 for r in runs[True])
    steps = [r["tokens_per_step"] for r in runs[True] if r.get("tokens_per_step")]
    acceptance = accepted / drafted if drafted else None
    figures = {"decode_tps_spec": tps[True], "decode_tps_plain": tps[False], "spec_ratio": tps[True] / tps[False],
               "acceptance": acceptance, "drafted": drafted, "draft_model": bool((facts["status"].get("models") or {}).get("draft")),
               "tokens_per_step": statistics.median(steps) if steps else None}
    lo_hi = {m: (min(r["predicted_per_second"] for r in runs[m]), max(r["predicted_per_second"] for r in runs[m])) for m in runs}
    text = (f"{tps[True]:.1f} tok/s speculative ({lo_hi[True][0]:.1f}-{lo_hi[True][1]:.1f}) vs {tps[False]:.1f} plain "
            f"({lo_hi[False][0]:.1f}-{lo_hi[False][1]:.1f}): {figures['spec_ratio']:.2f} x; acceptance "
            f"{'-' if acceptance is None else f'{acceptance:.2f}'}, {figures['tokens_per_step'] or 0:.2f} tokens/step")
    status = "ok" if drafted else "warn"
    if not drafted:
        text += " (nothing was drafted: the controller judged plain decoding faster here, or there is no draft)"
    return Check("decode speed", status, text, figures)


def _divergence(plain: dict, spec: dict) -> tuple[int | None, float | None]:
    a, b = plain.get("tokens") or [], spec.get("tokens") or []
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) == len(b):
        return None, None
    i = min(len(a), len(b)) if i is None else i
    probs = plain.get("completion_probabilities") or []
    if i < len(probs) and len(probs[i].get("top_logprobs") or []) >= 2:
        top = sorted((t["logprob"] for t in probs[i]["top_logprobs"]), reverse=True)
        return i, top[0] - top[1]
    return i, None


def check_equivalence(client: Client, opts: Options, facts: dict) -> Check:
    """Greedy with speculation on = off, token for token; where they part, the plain run's top-two gap
    must be a near-tie (`specdeck verify`'s rule)."""
    identical = near = differ = 0
    notes = []
    for prompt in EQUIVALENCE_PROMPTS:
        plain = completion(client, prompt, opts.equivalence_tokens, speculative=False, ignore_eos=False, n_probs=2)
        spec = completion(client, prompt, opts.equivalence_tokens, speculative=True, ignore_eos=False)
        at, gap = _divergence(plain, spec)
        if at is None:
            identical += 1
        elif gap is not None and gap <= GAP_TOLERANCE:
            near += 1
            notes.append(f"parts at token {at}, a near-tie (gap {gap:.3f})")
        else:
            differ += 1
            notes.append(f"parts at token {at} with a top-two gap of {'?' if gap is None else f'{gap:.3f}'}")
    n = len(EQUIVALENCE_PROMPTS)
    status = "fail" if differ else "ok"
    return Check("greedy equivalence", status, f"{identical} of {n} identical, {near} near-tie, {differ} not explained"
                 + (f" ({'; '.join(notes)})" if notes else ""),
                 {"equivalence_identical": identical, "equivalence_near_tie": near, "equivalence_failures": differ})


def _first_token_time(client: Client, prompt: str) -> tuple[float, dict]:
    first, last = None, {}
    for t, event in client.stream("/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0.0}):
        if first is None and event.get("content"):
            first = t
        last = event
    return (first if first is not None else 0.0), last


def check_ttft(client: Client, opts: Options, facts: dict) -> Check:
    nonce = uuid.uuid4().hex[:8]  # a prompt no cache holds
    n_ctx = int((facts["status"].get("plan") or {}).get("ctx") or 2048)
    doc = long_document(client, max(32, min(512, n_ctx // 4)))
    prompt = f"# session {nonce}\n{doc}\n# Summarise the code above in one sentence:\n"
    cold, c_last = _first_token_time(client, prompt)
    cached, k_last = _first_token_time(client, prompt)
    n = (c_last.get("timings") or {}).get("prompt_n")
    reused = (k_last.get("timings") or {}).get("prompt_cached")
    return Check("time to first token", "ok",
                 f"cold {cold * 1e3:.0f} ms ({n} prompt tokens), cached {cached * 1e3:.0f} ms ({reused} from the cache): "
                 f"{cached / cold if cold else 0:.3f} x",
                 {"ttft_cold_s": cold, "ttft_cached_s": cached})


def check_throughput(client: Client, opts: Options, facts: dict) -> Check:
    parallel = int((facts["status"].get("plan") or {}).get("parallel") or 1)

    def one(i: int) -> int:
        r = completion(client, DECODE_PROMPTS[i % len(DECODE_PROMPTS)] + f"# variant {i}\n", opts.decode_tokens)
        return len(r.get("tokens") or []) or int((r.get("timings") or {}).get("predicted_n") or 0)

    figures, parts = {}, []
    for streams in sorted({1, parallel}):
        t = time.perf_counter()
        with ThreadPoolExecutor(streams) as pool:
            n = sum(pool.map(one, range(streams * 2)))
        agg = n / (time.perf_counter() - t)
        figures["throughput_1" if streams == 1 else "throughput_parallel"] = agg
        parts.append(f"{agg:.1f} tok/s at {streams} stream(s)")
    figures.setdefault("throughput_parallel", figures["throughput_1"])
    figures["parallel"] = parallel
    return Check("throughput", "ok", ", ".join(parts) + " (aggregate, prompt included)", figures)


def long_document(client: Client, tokens: int) -> str:
    """Source text of about `tokens` tokens (measured with the server's own tokenizer)."""
    def block(start: int) -> str:
        return "".join(LONG_LINES[i % len(LONG_LINES)].format(i=i, j=i * 7 % 1000) for i in range(start, start + 64))

    per = len(client.post("/tokenize", {"content": block(0)}).get("tokens", [])) or 1
    text = "".join(block(64 * b) for b in range(tokens // per + 1))
    ids = client.post("/tokenize", {"content": text}).get("tokens", [])
    if len(ids) > tokens:
        text = client.post("/detokenize", {"tokens": ids[:tokens]}).get("content", text)
    return text


def check_long_context(client: Client, opts: Options, facts: dict) -> Check:
    status, sampler = facts["status"], facts.get("sampler")
    models = client.get("/v1/models")
    n_ctx = int(((models.get("data") or [{}])[0].get("meta") or {}).get("n_ctx") or status.get("plan", {}).get("ctx") or 0)
    want = n_ctx - opts.context_margin - 16
    if want < 128:
        return Check("long context", "skip", f"the context ({n_ctx} tokens) leaves no room for a long document", {})
    doc = long_document(client, want)
    since = time.monotonic()
    # a head no cache holds (as check_ttft's): the document of an earlier run may still be cached
    prompt = f"# {uuid.uuid4().hex[:8]}\n" + doc + "\n# What does handler_3 return?\n"
    t, last = _first_token_time(client, prompt)
    if sampler is not None:
        sampler.read()
    n = (last.get("timings") or {}).get("prompt_n", 0) + (last.get("timings") or {}).get("prompt_cached", 0)
    plan = status.get("plan") or {}
    figures = {"long_ctx_tokens": n, "long_ctx_ttft_s": t}
    text = f"{n:,} of {n_ctx:,} tokens, first token after {t:.2f} s"
    verdict = "ok"
    if sampler is not None:
        peak_rss, peak_vram = sampler.peak("rss", since), sampler.peak("vram", since)
        figures.update(peak_rss=peak_rss, peak_vram=peak_vram)
        if plan.get("device") == "cuda" and peak_vram is not None:
            planned = plan.get("used") or 0
            figures["peak_memory"], figures["planned_memory"] = peak_vram, planned
            text += f"; peak VRAM {peak_vram / 2**30:.2f} GiB, plan {planned / 2**30:.2f} of {plan.get('budget', 0) / 2**30:.2f} GiB"
            verdict = "fail" if peak_vram > (plan.get("budget") or peak_vram) else "ok"
        elif peak_rss is not None:
            planned = (plan.get("used") or 0) + (plan.get("host_used") or 0)
            figures["peak_memory"], figures["planned_memory"] = peak_rss, planned
            text += f"; peak RSS {peak_rss / 2**30:.2f} GiB, plan {planned / 2**30:.2f} GiB"
            if planned and peak_rss > planned * 1.10 + 512 * 2**20:
                verdict = "warn"
                text += " (over the plan)"
    return Check("long context", verdict, text, figures)


def check_soak(client: Client, opts: Options, facts: dict) -> Check:
    sampler, tick = facts.get("sampler"), facts.get("on_soak")
    if opts.soak_minutes <= 0:
        return Check("soak", "skip", "not asked (--soak MIN)", {})
    parallel = int((facts["status"].get("plan") or {}).get("parallel") or 1)
    errors_before, refused_before = len(client.errors), client.refused
    restarts_before = sampler.restarts if sampler else 0
    since, end = time.monotonic(), time.monotonic() + opts.soak_minutes * 60
    done = [0]

    def worker(w: int) -> None:
        i = 0
        while time.monotonic() < end:
            try:
                if i % 3 == 2:  # streamed through the OpenAI route (a plain prompt: any model, template or not)
                    list(client.stream("/v1/completions", {"prompt": f"# a colour ({w}.{i}):", "max_tokens": 24}))
                else:
                    completion(client, DECODE_PROMPTS[i % 2] + f"# {w}.{i}\n", 32, ignore_eos=False,
                               temperature=0.7 if i % 2 else 0.0)
                done[0] += 1
            except SpecdeckError:
                time.sleep(1.0)  # counted in client.errors; a restarting server gets a moment
            i += 1
            if tick is not None:
                tick(min(1.0, (time.monotonic() - since) / (end - since)))

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(worker, range(parallel)))
    errors = len(client.errors) - errors_before
    restarts = (sampler.restarts if sampler else 0) - restarts_before
    trend = sampler.rss_trend(since) if sampler else None
    refused = client.refused - refused_before
    figures = {"soak_requests": done[0], "soak_errors": errors, "soak_restarts": restarts, "soak_refused": refused,
               "soak_rss_mib_per_min": trend}
    status = "fail" if errors or restarts else "ok"
    first = f" (first: {client.errors[errors_before]})" if errors else ""
    return Check("soak", status, f"{opts.soak_minutes:g} min, {done[0]} requests at {parallel} stream(s), {errors} error(s){first}, "
                 f"{refused} refused with 429 and retried, {restarts} restart(s), RSS trend {'-' if trend is None else f'{trend:+.1f}'} MiB/min", figures)


def check_gpu(sampler: Sampler) -> Check:
    temp, power = sampler.peak("temperature"), sampler.peak("power")
    if temp is None and power is None:
        return Check("GPU temperature and power", "skip", "no GPU readings (no NVIDIA GPU, or NVML does not report them)", {})
    limit = sampler.peak("power_limit")
    slowdown = sampler.peak("slowdown")
    hot = temp is not None and slowdown is not None and temp >= slowdown - 5
    text = (f"peak {temp if temp is not None else '-'} °C (slowdown {slowdown or '-'} °C), "
            f"peak {power or 0:.0f} W of {limit or 0:.0f} W")
    return Check("GPU temperature and power", "warn" if hot else "ok", text,
                 {"gpu_temperature_max": temp, "gpu_power_max": power})


CHECKS = (("health", check_health), ("smoke", check_smoke), ("decode speed", check_decode),
          ("greedy equivalence", check_equivalence), ("time to first token", check_ttft),
          ("throughput", check_throughput), ("long context", check_long_context), ("soak", check_soak))


def run_checks(client: Client, opts: Options, on_check: Callable[[str, Check | None], None] | None = None,
               on_soak: Callable[[float], None] | None = None) -> tuple[list[Check], dict]:
    """All checks in order (health first: nothing runs against a server that is not ready).
    Returns the checks and the facts (the server's /v1/status at the start as "status"; the checks also
    find the live Sampler and the soak's progress callback there)."""
    facts: dict = {"on_soak": on_soak}
    results: list[Check] = []
    sampler: Sampler | None = None
    try:
        for name, fn in CHECKS:
            if on_check:
                on_check(name, None)
            t = time.perf_counter()
            try:
                check = fn(client, opts, facts)
            except SpecdeckError as e:
                check = Check(name, "fail", e.message)
            check.seconds = time.perf_counter() - t
            results.append(check)
            if on_check:
                on_check(name, check)
            if name == "health":
                if check.status == "fail":
                    break
                sampler = facts["sampler"] = Sampler(client).start()
    finally:
        if sampler is not None:
            sampler.stop()
    if sampler is not None:
        results.append(check_gpu(sampler))
        results[-1].figures["restarts"] = sampler.restarts
    results.append(Check("errors", "fail" if client.errors else "ok",
                         f"{len(client.errors)} failed request(s)" + (f": {client.errors[0]}" if client.errors else ""),
                         {"errors": len(client.errors)}))
    return results, facts


def figures_of(checks: list[Check]) -> dict:
    out: dict = {}
    for c in checks:
        out.update(c.figures)
    return out


