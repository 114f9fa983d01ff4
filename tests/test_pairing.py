import pytest

from app.commands.check import check_pair, result_json
from app.gguf.pairing import PairVocab, first_incompatibility

TOKS = tuple(f"t{i}" for i in range(1000))


def v(**kw):
    base = dict(type="gpt2", add_bos=False, add_eos=False, bos=1, eos=2, tokens=TOKS)
    return PairVocab(**{**base, **kw})


@pytest.mark.parametrize(
    "draft, rule",
    [
        (v(type="llama"), "vocab-type"),
        (v(add_bos=True), "add-bos"),
        (v(add_eos=True), "add-eos"),
        (v(tokens=TOKS[:800]), "vocab-size"),
        (v(tokens=TOKS[:5] + ("X",) + TOKS[6:]), "token-text"),
    ],
)
def test_each_rule_fails_alone(draft, rule):
    bad = first_incompatibility(v(), draft)
    assert bad is not None and bad.rule == rule


def test_rules_that_pass():
    assert first_incompatibility(v(), v()) is None
    # ids differ but neither side adds the token: llama.cpp allows it
    assert first_incompatibility(v(), v(bos=7, eos=9)) is None
    # tokens 0-4 are not compared; sizes may differ by up to 128
    assert first_incompatibility(v(), v(tokens=("a",) * 5 + TOKS[5:900])) is None
    assert first_incompatibility(v(add_bos=True), v(add_bos=True, bos=3)).rule == "bos-id"
    assert first_incompatibility(v(add_eos=True), v(add_eos=True, eos=3)).rule == "eos-id"


def test_token_text_names_the_first_differing_id():
    d = list(TOKS)
    d[700], d[900] = "a", "b"
    bad = first_incompatibility(v(), v(tokens=tuple(d)))
    assert bad.rule == "token-text" and "700" in bad.message and "'t700'" in bad.message and "'a'" in bad.message


def test_tiny_pair(tiny):
    r = check_pair(tiny.target, tiny.draft)
    assert r.compatible and r.draft.facts is not None and r.draft.facts.add_bos
    assert result_json(r)["compatible"] is True


def test_tiny_mismatch_names_token(tiny):
    r = check_pair(tiny.target, tiny.mismatch)
    assert not r.compatible
    assert r.incompatibility.rule == "token-text"
    assert "token 300" in r.incompatibility.message and "▁changed" in r.incompatibility.message


def test_tiny_eos_and_bos_rules(tiny):
    assert check_pair(tiny.target, tiny.no_bos).incompatibility.rule == "add-bos"
    # EOS is not added by either model, so a different EOS id alone is allowed (llama.cpp's rule)
    assert check_pair(tiny.target, tiny.other_eos).compatible


def test_real_pair_is_compatible(real_pair):
    r = check_pair(real_pair.target, real_pair.draft)
    assert r.compatible, r.incompatibility
    j = result_json(r)
    assert j["target"]["fim"]["pre"] == 151659  # inferred by llama.cpp from the token text
    assert j["target"]["add_bos"] is False and j["target"]["confirmed_by_llama_cpp"]


def test_gemma_cannot_draft_for_qwen(real_pair, gemma_270m):
    r = check_pair(real_pair.target, gemma_270m)
    assert not r.compatible
    assert r.incompatibility.rule == "vocab-type"
    assert "gpt2" in r.incompatibility.message and "llama" in r.incompatibility.message
