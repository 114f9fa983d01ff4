"""The agent workload as `specdeck bench --workload agent` runs it: built from specdeck's own
modules, two sessions interleaved, and measured honestly: every mode starts from an empty suffix
index, which the turns then fill in session order (a cross-request turn drafts from the earlier
turn's answer); the built-in prompts clear the index before every run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from app.commands.anchors import AnchorServers
from app.commands.benchruns import AGENT_MODES, run_agent, run_engine
from app.commands.ratios import agent_ratios, workload_per_decode
from app.commands.workloads import agent_turns, function_source
from app.engine.loader import load
from app.gguf.info import read_model_info
from app.plan.hardware import detect
from app.plan.planner import PlanRequest, make_plan


def test_the_agent_workload_is_real_code_in_session_order():
    turns = agent_turns()
    assert [t["session"] + str(t["turn"]) for t in turns] == ["A1", "B1", "A2", "B2", "A3", "B3"]
    assert {t["kind"] for t in turns if t["cross"]} == {"agent-regenerate", "agent-tests-like", "agent-tool-call-again"}
    text = "\n".join(m["content"] for t in turns for m in t["messages"])
    assert function_source("server/keys.py", "parse_keys") in text and "def client_address(" in text


def _loaded(tiny):
    t, d = read_model_info(tiny.target), read_model_info(tiny.draft)
    plan = make_plan(t, d, PlanRequest(ctx=1024, ctx_is_user_choice=True, parallel=1, draft_max=8), detect(), 1024)
    return load(plan, t, d, 1)


def test_each_mode_starts_from_an_empty_index_that_the_turns_fill(tiny):
    turns = [{"kind": "agent-first", "session": "A", "turn": 1, "cross": False, "prompt": "a b c d e"},
             {"kind": "agent-again", "session": "B", "turn": 1, "cross": True, "prompt": "a b c d e"}]
    lines: list[str] = []
    loaded = _loaded(tiny)
    try:
        summary, _, per_decode, totals = run_agent(loaded, turns, 24, 2, log=lines.append)
        builtin, _, _ = run_engine(loaded, [{"kind": "p", "prompt": "a b c d e"}], 24, 2, modes=("suffix",),
                                   log=lines.append)
    finally:
        loaded.close()
    held = [(m.group(1), int(m.group(2))) for line in lines
            if (m := re.search(r"agent-(\w+) .*index held (\d+) requests", line))]
    # every mode with an index: the first turn finds it empty, the second finds the first turn's request
    assert held and all(n == 0 for kind, n in held if kind == "first") and all(n == 1 for kind, n in held if kind == "again")
    assert len(held) == 2 * 2 * 2  # two turns, two repeats, two modes with an index (adaptive, suffix)
    assert set(totals) == set(AGENT_MODES) and all(len(totals[m]["cross"]) == 2 for m in AGENT_MODES)
    again = summary["agent-again"]
    assert again["suffix"]["tokens_per_decode"] > 3 and again["plain"]["tokens_per_decode"] < 1.1  # the first answer, copied
    assert again["adaptive-local"]["tokens_per_decode"] < again["suffix"]["tokens_per_decode"]  # no index: no such copy
    # each run's answer is kept as a digest: plain decoding answers the same in both repeats
    plain = again["plain"]["answers"]
    assert len(plain) == 2 and plain[0] == plain[1] and all(len(again[m]["answers"]) == 2 for m in AGENT_MODES)
    # the turns together: tokens over decodes, so between the turns' own figures; the one cross turn is itself
    for m in AGENT_MODES:
        for rep in range(2):
            one = [summary[k][m]["tokens_per_decode_all"][rep] for k in ("agent-first", "agent-again")]
            assert per_decode[m]["cross"][rep] == pytest.approx(one[1])
            assert min(one) - 1e-9 <= per_decode[m]["all"][rep] <= max(one) + 1e-9
    assert workload_per_decode(per_decode)["suffix"]["cross"] > 3
    ratios = agent_ratios(totals)
    assert ratios["adaptive_vs_plain_cross"] > 0 and "adaptive_vs_adaptive_local_cross_min" in ratios
    # the built-in prompts clear the index before every run: the second repeat drafts as the first did
    first, second = builtin["p"]["suffix"]["tokens_per_decode_all"]
    assert first == second < again["suffix"]["tokens_per_decode"]


def test_answers_unlike_plain_decoding_are_named_by_turn_and_mode():
    """A mode whose answer is not plain decoding's in the same repeat is reported; the closing stop
    token does not count (llama-server's answers leave it out)."""
    from app.commands.benchruns import answer_digest, answers_unlike_plain

    stop = {2}
    a, b = answer_digest([5, 6, 7, 2], stop), answer_digest([5, 6, 8], stop)
    assert a == answer_digest([5, 6, 7], stop) != b
    workloads = {"agent-edit": {"plain": {"answers": [a, a]}, "adaptive": {"answers": [a, a]},
                                "llama_server_ngram_mod": {"answers": []}},
                 "agent-regenerate": {"plain": {"answers": [a, a]}, "adaptive": {"answers": [b, a]},
                                      "suffix": {"answers": [b, b]}}}
    assert answers_unlike_plain(workloads) == [
        {"kind": "agent-regenerate", "mode": "adaptive", "differ": 1, "runs": 2},
        {"kind": "agent-regenerate", "mode": "suffix", "differ": 2, "runs": 2}]
    assert answers_unlike_plain({"agent-edit": workloads["agent-edit"]}) == []


def test_llama_server_tokens_per_decode_from_its_timings():
    """Each decode after the prompt's yields one token plus the drafts it kept: 97 tokens with 64 drafts
    accepted took 32 decodes after the prompt's."""
    from app.commands.anchors import counted

    # the first token comes with the prompt's decode (as specdeck's own records count it)
    assert counted({"predicted_n": 97, "predicted_ms": 8000.0, "draft_n": 80, "draft_n_accepted": 64}) == (97, 8.0, 97 / 32)
    assert counted({"predicted_n": 11, "predicted_ms": 1000.0}) == (11, 1.0, 1.1)  # plain: no draft fields
    assert counted({"predicted_n": 1, "predicted_ms": 10.0}) == (1, 0.01, 1.0)  # the prompt's token alone


def test_anchors_start_every_repeat_from_a_fresh_process(tiny, tmp_path):
    """llama-server's ngram-mod keeps its pool across requests: an anchor left up would draft the second
    repeat's turns from its own answers to the first's. A stand-in whose drafts grow with the requests it
    has served shows each repeat's first turn measured as the first repeat's was."""
    server = tmp_path / "llama-server"
    stand_in = Path(__file__).resolve().parent / "support" / "fake_llama_server.py"
    server.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{stand_in}" "$@"\n')
    server.chmod(0o755)
    turns = [{"kind": "agent-first", "session": "A", "turn": 1, "cross": False, "prompt": "a b c d e"},
             {"kind": "agent-again", "session": "B", "turn": 1, "cross": True, "prompt": "a b c d e"}]
    loaded = _loaded(tiny)
    try:
        with AnchorServers(server, tiny.target, None, 1, 1024, {"llama_server_ngram_mod": []}) as anchors:
            summary, _, _, _ = run_agent(loaded, turns, 8, 3, modes=("plain",), log=lambda *a: None, anchors=anchors)
    finally:
        loaded.close()
    first = summary["agent-first"]["llama_server_ngram_mod"]["tokens_per_decode_all"]
    again = summary["agent-again"]["llama_server_ngram_mod"]["tokens_per_decode_all"]
    # 8 tokens, the first with the prompt's decode: 7 decodes where nothing was drafted
    assert first == [8 / 7] * 3 and again[0] == again[1] == again[2] > 8 / 7


def test_the_copy_bound_counts_decodes_with_the_best_copy_known():
    from app.commands.workloads import copy_bound

    prompt = list(range(1, 41))
    assert copy_bound([], prompt, list(range(100, 130))) == 29  # nothing to copy: one decode per token after the first
    assert copy_bound([], prompt, prompt[10:40]) == 2  # 29 tokens after the first: a draft of 16, then of 12
    assert copy_bound([], prompt, prompt[10:40], draft_max=4) == 6  # in steps of 5
    # an earlier request's answer is copied only when it is given
    earlier = [7, 7] + list(range(200, 260))
    answer = list(range(200, 260))
    assert copy_bound([], prompt, answer) == 59 and copy_bound(earlier, prompt, answer) == 4
    # a copy resumes anywhere past a changed token; the run that goes on agreeing longest is taken
    changed = answer[:20] + [999] + answer[21:]
    assert copy_bound(earlier, prompt, changed) == 2 + 3  # 19 tokens, 999, then 39 in runs of up to 17
    two = [5, 6, 7, 50, 51, 52, 9, 5, 6, 7, 50, 60, 61]
    assert copy_bound(two, [5], [6, 7, 50, 51, 52, 9]) == 1
    # after a 3-token key: two plain steps before the key is in the text, and three after a change
    assert copy_bound([], prompt, prompt[10:40], key=3) == 2 + 2
    assert copy_bound(earlier, prompt, changed, key=3) == 2 + 1 + 4 + 3  # 2 plain, a draft, 999 and 3 plain, 3 drafts
    assert copy_bound(two, [5], [6, 7, 50, 51, 52, 9], key=3) == 2  # a plain step, then the occurrence that agrees


def test_vs_commit_sums_the_turns_and_pairs_the_repeats():
    """scripts/vs_commit.py: a turn group's tokens/s is its tokens over its seconds, tokens per decode
    its tokens over its decodes; ratios are paired per repeat."""
    import argparse
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("vs_commit", ROOT / "scripts" / "vs_commit.py")
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    turn = lambda n, s, d: {"tokens": n, "seconds": s, "decodes": d}  # noqa: E731
    cross = [False, True, True]
    plain = [[turn(100, 10.0, 100), turn(50, 5.0, 50), turn(50, 5.0, 50)]] * 2
    fast = [[turn(100, 5.0, 25), turn(50, 1.0, 10), turn(50, 4.0, 40)],  # cross: 100 tokens in 5 s, 50 decodes
            [turn(100, 5.0, 25), turn(50, 2.0, 10), turn(50, 3.0, 40)]]
    assert vs._rate(fast[0], cross) == (20.0, 2.0)
    runs = {"plain": plain, "adaptive": fast, "adaptive-local": plain, "79d153f adaptive": plain}
    got = vs.summarize(runs, cross, argparse.Namespace(commit="79d153f", max_tokens=8, repeats=2, threads=1))
    assert got["modes"]["adaptive"]["cross"] == {"tok_s": 20.0, "tokens_per_decode": 2.0}
    assert got["modes"]["adaptive"]["all"]["tokens_per_decode"] == 200 / 75
    assert got["ratios"]["adaptive / 79d153f adaptive, cross turns"] == (2.0, 2.0, 2.0)
    assert got["ratios"]["adaptive / plain, all turns"] == (2.0, 2.0, 2.0)  # 200 tokens in 10 s against 20 s


def test_the_copy_bound_in_time_picks_draft_lengths_by_what_verifies_cost():
    from app.commands.workloads import copy_bound, copy_runs, copy_seconds

    prompt = list(range(1, 41))
    earlier = [7, 7] + list(range(200, 260))
    answer = list(range(200, 260))
    changed = answer[:20] + [999] + answer[21:]
    runs = copy_runs(earlier, prompt, changed)
    assert len(runs) == len(changed) and runs[20] == 0 and runs[21] == 16 and runs[19] == 1
    assert copy_runs([], prompt, answer) == [0] * 60  # nothing of it in the text
    # flat costs (a verify of n tokens costs what one does): the fewest decodes, as copy_bound counts them
    assert copy_seconds(runs, lambda n: 1.0) == copy_bound(earlier, prompt, changed) == 5
    # costs linear in n: drafting gains nothing, so the bound is plain decoding's time
    assert copy_seconds(runs, lambda n: float(n)) == len(changed) - 1
    assert copy_seconds(copy_runs([], prompt, answer), lambda n: 1.0) == 59
    # a long verify that costs more than its tokens are worth is cut short where a shorter one pays
    costs = {1: 1.0, 2: 1.0, 3: 10.0}
    assert copy_seconds([0, 2, 1, 0], lambda n: costs[n]) == 2.0  # a draft of 1 (2 tokens for 1.0), then 1 plain
    costs[3] = 1.5
    assert copy_seconds([0, 2, 1, 0], lambda n: costs[n]) == 1.5  # the whole rest in one verify of 3
    assert copy_seconds([0], lambda n: 1.0) == 0.0 and copy_seconds([], lambda n: 1.0) == 0.0


def test_a_replay_reaches_the_answer_no_faster_than_the_copy_bound_and_learns_across_turns():
    """`replay` runs a drafter's steps against a known answer without the target: a drafter that
    copies text never needs fewer decodes than the copy bound, one with nothing to copy needs one per
    token, and the suffix index takes each replayed answer in, so the same answer comes faster again."""
    from app.commands.workloads import copy_bound, replay
    from app.engine.controller import Controller, CostModel
    from app.engine.loader import build_drafter

    costs = CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.6, 17: 2.5})
    rng = __import__("random").Random(5)
    prompt = [rng.randrange(50) for _ in range(300)]
    answer = prompt[40:120] + [rng.randrange(50) for _ in range(20)] + prompt[200:260]
    for kind in ("lookup", "suffix", "adaptive"):
        drafter = build_drafter(kind, None, Controller(costs, learn_costs=False))
        decodes, seconds = replay(drafter, prompt, answer, costs.c_verify, draft_max=16)
        assert copy_bound([], prompt, answer) <= decodes < len(answer) - 1, kind
        assert seconds >= decodes * costs.c_verify(1)
    fresh = list(range(1000, 1100))
    assert replay(build_drafter("lookup", None), [1, 2, 3], fresh, costs.c_verify) == (99, 99 * 1.0)
    drafter = build_drafter("adaptive", None, Controller(costs, learn_costs=False))
    first, _ = replay(drafter, [1, 2, 3], fresh, costs.c_verify, draft_max=16)
    again, _ = replay(drafter, [4, 5, 6], fresh, costs.c_verify, draft_max=16)
    assert first == 99 and again < 20
