"""Picking a copy up again after the answer parted from it (pure parts on plain data)."""

from hypothesis import given
from hypothesis import strategies as st

from app.engine.controller import CostModel
from app.engine.drafters.adaptive import AdaptiveDrafter, adaptive_controller
from app.engine.drafters.lookup import LookupDrafter, lookup_key
from app.engine.drafters.resume import WINDOW, Resume

TAIL = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # the source after the draft token not kept
HEAD = [1, 2, 3, 4, 5]  # the history before the change


def test_right_after_a_change_the_source_goes_on_as_if_one_token_was_replaced():
    r = Resume()
    r.parted(0, len(HEAD), TAIL)
    got = r.propose(0, HEAD + [99], 4)
    assert got.tokens == [11, 12, 13, 14] and got.depth == 0


def test_a_longer_or_shorter_change_is_found_by_the_answers_last_tokens():
    r = Resume()
    r.parted(0, len(HEAD), TAIL)
    longer = r.propose(0, HEAD + [99, 98, 12], 3)  # two tokens replaced one: the source resumes at 12
    assert longer.tokens == [13, 14, 15] and longer.depth == 1
    deeper = r.propose(0, HEAD + [99, 12, 13], 3)
    assert deeper.tokens == [14, 15, 16] and deeper.depth == 2
    dropped = r.propose(0, HEAD + [11], 3)  # the drafted token left out: the answer went on with the next
    assert dropped.tokens == [12, 13, 14] and dropped.depth == 1


def test_nothing_where_the_answer_went_elsewhere_and_the_state_expires():
    r = Resume()
    r.parted(0, len(HEAD), TAIL)
    assert r.propose(0, HEAD + [99, 98], 4).tokens == []  # two tokens since the change, none of the source's
    assert r.propose(1, HEAD + [99], 4).tokens == []  # another sequence has no source
    long_after = HEAD + [99] * WINDOW + [12]
    assert r.propose(0, long_after, 4).tokens == []
    assert r.propose(0, HEAD + [99], 4).tokens == []  # expired: forgotten
    r.parted(0, len(HEAD), TAIL)
    r.forget(0)
    assert r.propose(0, HEAD + [99], 4).tokens == []


@given(tail=st.lists(st.integers(0, 5), min_size=0, max_size=20), since=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       k=st.integers(0, 10))
def test_every_proposal_is_the_source_text_after_where_the_answer_stands(tail, since, k):
    r = Resume()
    r.parted(0, len(HEAD), tail)
    got = r.propose(0, HEAD + since, k)
    assert len(got.tokens) <= k
    if not got.tokens:
        return
    assert len(since) <= WINDOW
    if got.depth == 0:
        assert len(since) == 1 and got.tokens == tail[:k]
        return
    starts = [i + 1 for i in range(min(len(tail) - 1, WINDOW))
              if tail[max(0, i - got.depth + 1): i + 1] == since[len(since) - got.depth:] and got.depth <= i + 1]
    assert any(tail[s: s + k] == got.tokens for s in starts)


def test_the_adaptive_drafter_picks_the_copy_up_after_a_renamed_token():
    """An edit copies the prompt's code with one token renamed: after lookup's draft misses at the
    rename, the next draft is the code after it, without waiting for an n-gram to match again."""
    costs = CostModel(verify={1: 0.025, 2: 0.0255, 5: 0.027, 9: 0.030, 17: 0.036})  # GPU-like: drafts are cheap
    c = adaptive_controller(costs, learn_costs=False)
    drafter = AdaptiveDrafter(c, LookupDrafter(), None)
    drafter.begin_request(0)
    code = list(range(100, 140))
    prompt = code + [7]
    for _ in range(4):
        c.observe(lookup_key(16), 8, 8, seq=0)
    history = prompt + code[:20]  # the answer copies the code so far
    draft = drafter.propose(0, history, 8)
    assert draft.source == "lookup" and draft.tokens == code[20:28]
    drafter.accepted(0, draft, 3)  # the target kept 3, then chose 555 for code[23]
    history += code[20:23] + [555]
    again = drafter.propose(0, history, 8)
    assert again.source == "resume" and again.tokens[:4] == code[24:28], again
