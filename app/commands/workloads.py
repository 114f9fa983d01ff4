"""Benchmark workloads made of real code: the agent workload replays two coding sessions
interleaved, as an agent sends them, built from specdeck's own modules.

Each turn is a request of its own. Some answers overlap the request's own prompt (an edit of the
file it carries); the `cross` turns' answers overlap an *earlier request's* answer instead:

- a module regenerated in a fresh conversation (the context was trimmed, the same task sent again);
- a second sub-agent writing tests for a function like the first sub-agent's;
- a tool call of the same shape as an earlier one, for another file.

The turns run in this order in every mode, each mode starting from an empty suffix index, so the
index holds exactly what the earlier turns of the same run put there, as in real use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import app
from app.engine.drafters.base import Ask, Draft
from app.engine.kv import common_prefix

SOURCE = Path(app.__file__).resolve().parent
SYSTEM = ("You are a coding agent working in the specdeck repository (Python 3.11). Answer with code only, "
          "no explanations.")
TOOLS = ('Tools: read_file(path), write_file(path, content), run_tests(path). To call one, answer with one JSON '
         'object and nothing else: {"tool": NAME, "arguments": {...}}.')


def function_source(module: str, name: str) -> str:
    """The source of one top-level function (or class) of an app module, as it is in the package."""
    path = SOURCE / module
    text = path.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise KeyError(f"{module} has no {name}")


def _chat(*user: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(user)}]


def agent_turns() -> list[dict]:
    """The agent workload: two sessions, interleaved, each turn {"kind", "session", "turn", "cross",
    "messages"}. `kind` is agent-<what the turn is>; `cross` marks the turns whose answer overlaps an
    earlier request's answer rather than the turn's own prompt."""
    code_a = function_source("server/keys.py", "parse_keys") + "\n\n\n" + function_source("server/keys.py", "_no_repeats")
    edit = "Add type hints to every argument and a one-line docstring to every function. Answer with the complete code."
    test_a = function_source("server/keys.py", "bearer")
    test_b = function_source("server/access.py", "client_address")
    tests = "Write pytest tests for this function, in one file, with the imports it needs."
    a = [
        ("edit", False, _chat(f"File app/server/keys.py, the functions to change:\n```python\n{code_a}\n```", edit)),
        ("tool-call", False, _chat(TOOLS, "Read the file app/server/keys.py.", system=SYSTEM)),
        # the context was trimmed: the same task again in a fresh conversation, worded as the agent's retry
        ("regenerate", True, _chat("Retry of the last task.", f"File app/server/keys.py:\n```python\n{code_a}\n```", edit)),
    ]
    b = [
        ("tests", False, _chat(f"Module app/server/keys.py:\n```python\n{test_a}\n```", tests)),
        # a second sub-agent: the same kind of task for a function like the first one
        ("tests-like", True, _chat(f"Module app/server/access.py:\n```python\n{test_b}\n```", tests)),
        ("tool-call-again", True, _chat(TOOLS, "Read the file app/server/access.py.", system=SYSTEM)),
    ]
    turns = []
    for i in range(max(len(a), len(b))):  # two sessions interleaved, as two agents share one server
        for session, items in (("A", a), ("B", b)):
            if i < len(items):
                what, cross, messages = items[i]
                turns.append({"kind": f"agent-{what}", "session": session, "turn": i + 1, "cross": cross,
                              "messages": messages})
    return turns


def copy_runs(earlier: list[int], prompt: list[int], answer: list[int], draft_max: int = 16, key: int = 0) -> list[int]:
    """For each position i of the answer, the longest run of its next tokens (up to `draft_max`)
    found in `earlier` + the prompt + the answer before i: what a draft copied from that text could
    keep at i at best. With `key` 0 the run may start anywhere; with `key` n it must follow an
    occurrence of the history's last n tokens, as lookup's, the suffix index's and llama-server's
    n-gram drafts do."""
    text = list(earlier) + list(prompt)
    runs = []
    for i in range(len(answer)):
        history = text + answer[:i]
        tail = history[len(history) - key:] if key else []
        best = 0
        for j in range(key, len(history)):
            if key and history[j - key:j] != tail:
                continue
            n = 0
            while n < draft_max and i + n < len(answer) and j + n < len(history) and history[j + n] == answer[i + n]:
                n += 1
            best = max(best, n)
        runs.append(best)
    return runs


def copy_bound(earlier: list[int], prompt: list[int], answer: list[int], draft_max: int = 16, key: int = 0) -> int:
    """Target decodes an answer takes at best when drafts are copied from text: at each step the
    draft is the longest run of the answer's next tokens (`copy_runs`), chosen knowing the answer, so
    every drafted token is kept. With `key` 0 no drafter that copies text it has seen does better (a
    copy resumed past a changed token included); a draft model is bounded by neither. The first
    token comes from the prompt's evaluation."""
    return copy_decodes(copy_runs(earlier, prompt, answer, draft_max, key))


def copy_decodes(runs: list[int]) -> int:
    """The fewest decodes with each draft the longest copy at its position (`copy_runs`)."""
    decodes, i = 0, min(1, len(runs))
    while i < len(runs):
        decodes += 1
        i += runs[i] + 1
    return decodes


def copy_seconds(runs: list[int], c_verify) -> float:
    """Seconds an answer's decodes take at best with drafts copied from text, on a machine where a
    decode of n tokens takes `c_verify(n)` s: at each position any draft up to `runs[i]` tokens long
    (`copy_runs`), chosen knowing the answer and the costs (a shorter draft is cheaper to verify,
    and the next position may offer a longer run). Drafting itself is counted free."""
    n = len(runs)
    best = [0.0] * (n + 1)  # best[i]: seconds from position i to the end
    for i in range(n - 1, 0, -1):
        best[i] = min(c_verify(k + 1) + best[min(n, i + k + 1)] for k in range(min(runs[i], n - 1 - i) + 1))
    return best[1] if n > 1 else 0.0


def replay(drafter, prompt: list[int], answer: list[int], c_verify, draft_max: int = 16,
           max_tokens: int | None = None, partition: str = "") -> tuple[int, float]:
    """(target decodes, seconds) a drafter takes to reach a known greedy answer, its steps replayed
    as the engine runs them, without the target: each step the drafter proposes after the history,
    the draft's prefix that agrees with the answer is kept with one token more (what a greedy verify
    gives, since drafting never changes the answer), and the step costs `c_verify(drafted + 1)`.
    Drafting itself is counted free. The drafter sees the request begin, learn from every verify,
    and finish (so a suffix index takes the answer in), as in a real run. The first token comes from
    the prompt's evaluation; no draft runs past `max_tokens` (default: the answer's length)."""
    limit = max_tokens or len(answer)
    drafter.begin_request(0, partition)
    history, i, decodes, seconds = list(prompt) + answer[:1], min(1, len(answer)), 0, 0.0
    while i < len(answer):
        k = max(0, min(draft_max, limit - i - 1))
        d = drafter.propose_all([Ask(0, history, k)])[0] if k else Draft([])
        tokens = d.tokens[:k]
        kept = common_prefix(tokens, answer[i:])
        if tokens:
            drafter.accepted(0, d, kept)
        step = answer[i: i + kept + 1]
        history += step
        i += len(step)
        decodes += 1
        seconds += c_verify(len(tokens) + 1)
    drafter.finish_request(0, history)
    drafter.release(0)
    return decodes, seconds
