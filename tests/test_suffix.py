"""The suffix index over recent requests, on plain data against a brute-force search (every
proposal occurs in the indexed text, depths and table entries right after many inserts and
evictions, partitions apart, a resent conversation not indexed twice), and behind the engine:
greedy output unchanged (the target's argmax at every step) and the sampled distribution unchanged
(chi-square), with drafts taken from an earlier request."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import ALPHA, N_SAMPLES, PROMPT, SAMPLING, _p_value, rig, run, sharp  # noqa: F401 - a fixture

from app.engine.drafters.suffix import (
    BYTES_PER_TOKEN,
    KEY,
    MAX_DEPTH,
    MAX_OCCURRENCES,
    SuffixDrafter,
    SuffixIndex,
    suffix_key,
)
from app.engine.engine import Request, SpecParams
from app.engine.sampling import SamplingParams


def live_text(ix: SuffixIndex, doc) -> dict[int, int]:
    """The document's tokens by absolute offset, as far as it still holds them."""
    return {doc.cut + i: t for i, t in enumerate(doc.text)}


def brute_entries(ix: SuffixIndex, partition: str) -> dict[tuple, set]:
    """Every (key -> positions) the table should know, found by scanning the documents."""
    out: dict[tuple, set] = {}
    for doc in ix.docs.values():
        if doc.partition != partition:
            continue
        t = live_text(ix, doc)
        for end in range(max(doc.start, doc.cut + KEY, KEY), len(doc)):
            key = tuple(t[end - KEY + i] for i in range(KEY))
            out.setdefault(key, set()).add((doc.id, end))
    return out


def check_tables(ix: SuffixIndex) -> None:
    assert ix.tokens == sum(d.indexed for d in ix.docs.values())
    for partition in {d.partition for d in ix.docs.values()} | set(ix.tables):
        brute = brute_entries(ix, partition)
        table = ix.tables.get(partition, {})
        seen = {}
        for k, occ in table.items():
            key = (k >> 42, (k >> 21) & (2**21 - 1), k & (2**21 - 1))
            got = {(p >> 32, p & (2**32 - 1)) for p in occ}
            assert len(got) == len(occ), "an occurrence listed twice"
            assert got <= brute.get(key, set()), (key, got - brute.get(key, set()))  # nothing stale
            seen[key] = got
        for key, where in brute.items():  # nothing missing, but what the per-key cap let go
            assert len(seen.get(key, ())) >= min(len(where), MAX_OCCURRENCES), key


def occurs(ix: SuffixIndex, partition: str, before: list[int], tokens: list[int]) -> bool:
    """Whether `before + tokens` occurs contiguously in one of the partition's documents."""
    want = before + tokens
    for doc in ix.docs.values():
        if doc.partition != partition:
            continue
        t = doc.text.tolist()
        for i in range(len(t) - len(want) + 1):
            if t[i:i + len(want)] == want:
                return True
    return False


def brute_depth(ix: SuffixIndex, partition: str, history: list[int], first: int | None = None) -> int:
    """The deepest match of the history's end that something (`first`, if given) followed, by
    scanning every document."""
    best = 0
    for doc in ix.docs.values():
        if doc.partition != partition:
            continue
        t = live_text(ix, doc)
        for off in range(max(doc.start, doc.cut + KEY, KEY), len(doc)):
            if first is not None and t[off] != first:
                continue
            d = 0
            while d < MAX_DEPTH and d < len(history) and off - d - 1 in t and t[off - d - 1] == history[-d - 1]:
                d += 1
            if d >= KEY:
                best = max(best, d)
    return best


docs_strategy = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(0, 5), min_size=0, max_size=60),
                                   st.lists(st.integers(0, 5), max_size=30)), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, bound=st.integers(20, 400), probes=st.lists(st.lists(st.integers(0, 5), min_size=3, max_size=12),
                                                                        min_size=1, max_size=8))
def test_index_against_brute_force(docs, bound, probes):
    ix = SuffixIndex(bound)
    rng = random.Random(len(docs))
    for partition, prompt, output in docs:
        doc = ix.open(partition, prompt)
        for chunk in np.array_split(np.array(output, dtype=int), 3):  # the output arrives in steps
            ix.extend(doc, chunk.tolist())
        if rng.random() < 0.2 and len(ix.docs) > 1:
            ix.drop(next(iter(ix.docs)))
        check_tables(ix)
        assert ix.tokens <= bound or len(ix.docs) == 1
    for partition in ("a", "b"):
        for h in probes:
            m = ix.propose(partition, h, 8)
            if m.tokens:
                assert occurs(ix, partition, h[-m.depth:], m.tokens[:1])  # the match and its first token
                assert occurs(ix, partition, h[-KEY:], m.tokens)  # the whole continuation followed the key
                assert m.count >= 1 and KEY <= m.depth <= MAX_DEPTH
            few = all(len(o) < 16 for o in ix.tables.get(partition, {}).values())
            if few and m.tokens:  # every occurrence was measured: the depth is the brute force's
                assert m.depth == brute_depth(ix, partition, h, first=m.tokens[0]), (h, m)
                assert m.depth <= brute_depth(ix, partition, h)


def test_most_frequent_continuation_and_confidence():
    ix = SuffixIndex()
    for tail in ([7, 8, 9], [7, 8, 9], [7, 8, 4], [6, 1, 1]):
        doc = ix.open("p", [1, 2, 3, 5])
        ix.extend(doc, tail)
    m = ix.propose("p", [0, 2, 3, 5], 3)  # after 2 3 5: 7 three times, 6 once; then 8, then 9 twice of three
    assert m.tokens == [7, 8, 9] and m.count == 3 and m.depth == 3
    m = ix.propose("p", [1, 2, 3, 5], 3)  # deeper: the whole prompt matched
    assert m.depth == 4 and m.tokens[:2] == [7, 8]
    assert suffix_key(4, 3) == "suffix-4-2" and suffix_key(40, 1) == "suffix-32-1" and suffix_key(9, 9) == "suffix-8-4"


def test_partitions_never_see_each_other():
    ix = SuffixIndex()
    ix.extend(ix.open("alice", [1, 2, 3, 4, 5, 6]), [7, 8])
    assert ix.propose("alice", [9, 2, 3, 4], 4).tokens == [5, 6, 7, 8]
    assert ix.propose("bob", [9, 2, 3, 4], 4).tokens == []
    ix.extend(ix.open("bob", [2, 3, 4, 9, 9]), [])
    assert ix.propose("bob", [0, 2, 3, 4], 4).tokens == [9, 9]
    assert ix.propose("alice", [0, 2, 3, 4], 4).tokens == [5, 6, 7, 8]


def test_a_resent_conversation_is_indexed_once():
    ix = SuffixIndex()
    turn1 = list(range(10, 200))
    doc = ix.open("p", turn1)
    answer = list(range(300, 400))
    ix.extend(doc, answer)
    assert ix.tokens == 290
    turn2 = turn1 + answer + [500, 501, 502]
    ix.open("p", turn2)  # only the new turn is indexed again
    assert ix.tokens == 293
    assert ix.propose("p", [0, 301, 302, 303], 3).tokens == [304, 305, 306]
    ix.open("q", turn2)  # another partition holds nothing of it
    assert ix.tokens == 293 + len(turn2)


def test_eviction_keeps_the_bound_oldest_first():
    ix = SuffixIndex(max_tokens=1000)
    ids = []
    for i in range(30):
        doc = ix.open("p", [i % 7 + 1] * 3 + list(range(1000 + 100 * i, 1000 + 100 * i + 97)))
        ids.append(doc.id)
        check_tables(ix)
        assert ix.tokens <= 1000
    assert list(ix.docs) == ids[-10:]  # the ten newest
    assert ix.propose("p", [1000 + 100 * 29 + 5, 1000 + 100 * 29 + 6, 1000 + 100 * 29 + 7], 2).tokens == \
        [1000 + 100 * 29 + 8, 1000 + 100 * 29 + 9]
    assert ix.propose("p", [1005, 1006, 1007], 2).tokens == []  # the first document is gone
    # what a memory alert leaves out: the index's bytes, which stay within its bound
    assert SuffixDrafter(ix).host_bytes() == ix.tokens * BYTES_PER_TOKEN <= 1000 * BYTES_PER_TOKEN


# -- behind the engine -------------------------------------------------------------------------------

def test_greedy_output_unchanged_with_drafts_from_an_earlier_request(tiny):
    r = rig(tiny.target, None)
    truth, _ = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(enabled=False)))
    drafter = SuffixDrafter(SuffixIndex())
    r.engine.drafter = drafter
    first, _ = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8), trace=True))
    # the same request again (a module regenerated in a fresh conversation): drafts come from the first
    again, steps = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8), trace=True))
    other, plain = PROMPT, truth
    assert first == truth and again == plain
    assert all(s.tokens == s.target_argmax for s in steps)
    assert sum(s.accepted for s in steps) >= 30 and all(s.drafter == "suffix" for s in steps[1:]), steps
    # a wrong earlier text drafts and misses; the output does not change
    doc = drafter.index.open("", other)
    drafter.index.extend(doc, [(t + 7) % 300 + 5 for t in plain])
    wrong, steps = run(r.engine, Request(prompt=other, max_tokens=40, speculative=SpecParams(n_max=8), trace=True))
    assert wrong == plain and all(s.tokens == s.target_argmax for s in steps)


def test_sampling_distribution_unchanged_with_suffix_drafts(sharp):  # noqa: F811 - the fixture
    t, _ = sharp
    r = rig(t, None)
    plain = [run(r.engine, Request(prompt=PROMPT, max_tokens=3, speculative=SpecParams(enabled=False),
                                   sampling=SamplingParams(seed=s, **SAMPLING)))[0][1:3] for s in range(N_SAMPLES)]
    r.engine.drafter = SuffixDrafter(SuffixIndex())
    drafted = accepted = 0
    spec = []
    for s in range(10_000, 10_000 + N_SAMPLES):  # every answer joins the index: later ones draft from it
        toks, steps = run(r.engine, Request(prompt=PROMPT, max_tokens=3, speculative=SpecParams(n_max=2),
                                            sampling=SamplingParams(seed=s, **SAMPLING)))
        drafted += sum(x.drafted for x in steps)
        accepted += sum(x.accepted for x in steps)
        spec.append(toks[1:3])
    assert drafted >= N_SAMPLES // 2 and 0.05 < accepted / drafted < 1.0, (drafted, accepted)  # measured: 283, 268
    for position in (0, 1):
        assert _p_value([tuple(x)[position] for x in plain], [tuple(x)[position] for x in spec]) > ALPHA


@pytest.mark.parametrize("n", [1, 2])
def test_drafter_interface_keeps_the_index_in_step(n):
    d = SuffixDrafter(SuffixIndex())
    d.begin_request(0, "k")
    h = [5, 6, 7, 8, 9, 10]
    d.propose(0, h, 0)  # a step that drafts nothing still indexes
    h += [11] * n
    d.finish_request(0, h)
    d.release(0)
    d.begin_request(1, "k")
    assert d.propose(1, [0, 6, 7, 8], 4).tokens == ([9, 10] + [11] * n)[:4]


def test_one_keys_text_never_drives_anothers_drafts(tiny):
    """Behind the engine: a request under another partition drafts exactly as the very first one
    did; the same partition's second request copies the first answer."""
    r = rig(tiny.target, None)
    r.engine.drafter = SuffixDrafter(SuffixIndex())

    def drafted(partition: str) -> tuple[list[int], int, int]:
        out, steps = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8),
                                           partition=partition))
        return out, sum(s.drafted for s in steps), sum(s.accepted for s in steps)

    alice = drafted("alice")
    bob = drafted("bob")
    alice_again = drafted("alice")
    assert bob == alice  # nothing of alice's request reached bob's drafts
    assert alice_again[0] == alice[0] and alice_again[2] >= alice[2] + 20


def test_the_server_partitions_by_the_key_name():
    from app.server.audit import Usage, current_usage
    from app.server.core import request_partition

    assert request_partition() == ""
    token = current_usage.set(Usage(key="alice"))
    try:
        assert request_partition() == "alice"
    finally:
        current_usage.reset(token)


def test_a_request_that_keeps_out_of_the_index(tiny):
    """partition None (the API's `speculative.cross_request: false`): it neither drafts from
    earlier requests nor joins them."""
    r = rig(tiny.target, None)
    drafter = SuffixDrafter(SuffixIndex())
    r.engine.drafter = drafter
    first, _ = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8)))
    held = drafter.index.holds()
    out, steps = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8), partition=None))
    assert out == first and sum(s.drafted for s in steps) == 0 and drafter.index.holds() == held
    _, steps = run(r.engine, Request(prompt=PROMPT, max_tokens=40, speculative=SpecParams(n_max=8)))
    assert sum(s.accepted for s in steps) >= 30  # the next ordinary request copies the first again
