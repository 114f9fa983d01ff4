"""Saved prompt caches on plain data: which entry a prompt gets, what an entry replaces, the bound."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.kv import common_prefix
from app.engine.saved import SavedPrompts


def blob(n):
    return bytearray(n)  # stands for a sequence state of n bytes


def test_a_prompt_gets_its_owners_longest_prefix():
    s = SavedPrompts(1000)
    s.add("a", [1, 2, 3, 4], blob(10))
    s.add("a", [1, 2, 9], blob(10))
    s.add("b", [1, 2, 3, 4, 5], blob(10))
    entry, n = s.best("a", [1, 2, 3, 4, 5, 6])
    assert (entry.tokens, n) == ([1, 2, 3, 4], 4)
    assert s.best("c", [1, 2, 3]) is None and s.best("a", [7]) is None
    assert s.covers("a", [1, 2, 3]) and not s.covers("a", [1, 2, 3, 4, 5]) and not s.covers("c", [1])


def test_a_longer_turn_replaces_the_copy_it_holds():
    s = SavedPrompts(1000)
    s.add("a", [1, 2, 3], blob(10))
    s.add("b", [1, 2, 3], blob(10))
    s.add("a", [1, 2, 3, 4], blob(10))
    assert [(e.owner, e.tokens) for e in s.entries] == [("b", [1, 2, 3]), ("a", [1, 2, 3, 4])]
    s.add("a", [1, 2, 5, 6], blob(10), slack=2)  # holds all but the last 2 tokens of [1, 2, 3, 4]
    assert [(e.owner, e.tokens) for e in s.entries] == [("b", [1, 2, 3]), ("a", [1, 2, 5, 6])]
    assert s.nbytes == 20


def test_the_least_recently_used_give_way_and_nothing_larger_than_the_bound_is_kept():
    s = SavedPrompts(30)
    for i in range(3):
        s.add("a", [i], blob(10))
    s.touch(s.entries[0])  # [0] is used: [1] is now the oldest
    s.add("a", [9], blob(10))
    assert [e.tokens for e in s.entries] == [[2], [0], [9]] and s.nbytes == 30
    assert not s.add("a", [8], blob(31)) and len(s) == 3
    assert not SavedPrompts(0).add("a", [1], blob(1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.lists(st.integers(0, 3), min_size=1, max_size=6),
                          st.integers(1, 40)), max_size=30),
       st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(0, 3))
def test_against_a_brute_force_of_the_same_rules(adds, prompt, slack):
    """The bound always holds, the bytes add up, and `best` is the longest prefix among the owner's."""
    s = SavedPrompts(100)
    for owner, tokens, size in adds:
        s.add(owner, tokens, blob(size), slack=slack)
        assert s.nbytes == sum(e.nbytes for e in s.entries) <= 100
        assert s.entries[-1].tokens == tokens
        for e in s.entries[:-1]:  # nothing the newest copy holds is kept beside it
            assert e.owner != owner or common_prefix(e.tokens, tokens) < len(e.tokens) - slack
    for owner in "ab":
        mine = [common_prefix(e.tokens, prompt) for e in s.entries if e.owner == owner]
        hit = s.best(owner, prompt)
        assert (hit[1] if hit else 0) == max(mine, default=0)
        assert hit is None or hit[0].owner == owner


def test_random_use_keeps_the_bytes_right():
    rng = random.Random(1)
    s = SavedPrompts(500)
    for _ in range(2000):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 8))]
        if rng.random() < 0.3 and s.entries:
            s.touch(rng.choice(s.entries))
        s.add(rng.choice("xyz"), tokens, blob(rng.randrange(1, 120)), slack=rng.randrange(3))
        assert s.nbytes == sum(e.nbytes for e in s.entries) <= 500
