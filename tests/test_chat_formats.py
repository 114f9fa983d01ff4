"""Chat formats on canned answers (no model, no template): every handled format's answers split into
reasoning, content and tool calls, the same whole as streamed at any split, markup never in the
content, argument types from the schema, malformed calls kept as text, and call grammars that
llama.cpp's own grammar parser accepts."""

import ctypes
import json
import re
from pathlib import Path

import pytest

from app.chat import formats
from app.chat.detect import REASONING
from app.chat.format import Call
from app.chat.generic import Generic
from app.chat.grammar import call_grammar
from app.chat.spec import ChatSpec
from app.chat.stream import CallArguments, CallEnd, CallStart, ChatStream, Parsed, ReasoningDelta, TextDelta

F = formats.BY_NAME
THINK, CHANNEL, MTHINK = REASONING

WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "opts": {"type": "object"}, "code": {"type": "string"}, "units": {"type": "string", "enum": ["c", "f"]}}}}
SEARCH = {"name": "search", "description": "Search the web", "parameters": {
    "type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}}
PING = {"name": "ping", "description": "No arguments", "parameters": {"type": "object", "properties": {}}}
TOOLS = [WEATHER, SEARCH, PING]
OSLO = Call("get_weather", {"city": "Oslo", "days": 3})
RAIN = Call("search", {"query": "rain"})

MARKUP = ("<tool_call>", "</tool_call>", "<function=", "<parameter=", "<think>", "</think>", "[TOOL_CALLS]", "[ARGS]",
          "[CALL_ID]", "[THINK]", "[/THINK]", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>",
          "<|python_tag|>", '{"tool_call', '{"response"', '"arguments"', '"parameters"')

HERMES_OSLO = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'
HERMES_RAIN = '<tool_call>\n{"name": "search", "arguments": {"query": "rain"}}\n</tool_call>'
XML_OSLO = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
XML_RAIN = "<tool_call>\n<function=search>\n<parameter=query>\nrain\n</parameter>\n</function>\n</tool_call>"
GEMMA_OSLO = '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3}<tool_call|>'
GEMMA_RAIN = '<|tool_call>call:search{query:<|"|>rain<|"|>}<tool_call|>'

# (id, spec, started, answer, expected parse)
CASES = [
    ("hermes-think", ChatSpec(F["hermes"], THINK), False,
     f"<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n{HERMES_OSLO}\n{HERMES_RAIN}",
     Parsed("The user wants the weather.", "Let me check.", [OSLO, RAIN])),
    ("hermes", ChatSpec(F["hermes"]), False, f"Sure.\n{HERMES_RAIN}", Parsed("", "Sure.", [RAIN])),
    ("hermes-text", ChatSpec(F["hermes"]), False, "Oslo is <b>fine</b> today, see <tool>.",
     Parsed("", "Oslo is <b>fine</b> today, see <tool>.", [])),
    ("qwen3-coder-started", ChatSpec(F["qwen3-coder"], THINK), True,
     f"I need the weather.\n</think>\n\nChecking.\n{XML_OSLO}\n{XML_RAIN}",
     Parsed("I need the weather.", "Checking.", [OSLO, RAIN])),
    ("qwen3-coder-not-started", ChatSpec(F["qwen3-coder"], THINK), False,
     f"<think>\nHmm.\n</think>\n\n{XML_RAIN}", Parsed("Hmm.", "", [RAIN])),
    ("qwen3-coder-text", ChatSpec(F["qwen3-coder"], THINK), True, "Short.</think>\n\nIt is 21 C.",
     Parsed("Short.", "It is 21 C.", [])),
    ("mistral-args", ChatSpec(F["mistral"]), False,
     'Checking both.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 3}[TOOL_CALLS]search[ARGS]{"query": "rain"}',
     Parsed("", "Checking both.", [OSLO, RAIN])),
    ("ministral-think", ChatSpec(F["mistral"], MTHINK), False,
     '[THINK]Weather first.[/THINK]Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 3}',
     Parsed("Weather first.", "Checking.", [OSLO])),
    ("mistral-call-id", ChatSpec(F["mistral-call-id"]), False,
     '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo", "days": 3}'
     '[TOOL_CALLS]search[CALL_ID]f5g6h7i8j[ARGS]{"query": "rain"}', Parsed("", "", [OSLO, RAIN])),
    ("mistral-nemo", ChatSpec(F["mistral-nemo"]), False,
     'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}, "id": "a1b2c3d4e"}, '
     '{"name": "search", "arguments": {"query": "rain"}, "id": "f5g6h7i8j"}]', Parsed("", "Checking.", [OSLO, RAIN])),
    ("mistral-text", ChatSpec(F["mistral"]), False, "No [TOOLS] needed [here].",
     Parsed("", "No [TOOLS] needed [here].", [])),
    ("llama3", ChatSpec(F["llama3"]), False, '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}',
     Parsed("", "", [OSLO])),
    ("llama3-python-tag", ChatSpec(F["llama3"]), False,
     'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}; '
     '{"name": "search", "parameters": {"query": "rain"}}', Parsed("", "Checking.", [OSLO, RAIN])),
    ("llama3-text", ChatSpec(F["llama3"]), False, "Oslo is {usually} rainy.",
     Parsed("", "Oslo is {usually} rainy.", [])),
    ("gemma4", ChatSpec(F["gemma4"], CHANNEL), False,
     f"<|channel>thought\nThe user wants weather.<channel|>Checking.{GEMMA_OSLO}{GEMMA_RAIN}",
     Parsed("The user wants weather.", "Checking.", [OSLO, RAIN])),
    ("gemma4-thought-off", ChatSpec(F["gemma4"], CHANNEL), False, "It is sunny in Oslo.",
     Parsed("", "It is sunny in Oslo.", [])),
    ("generic-call", ChatSpec(Generic()), False,
     '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}', Parsed("", "", [OSLO])),
    ("generic-calls", ChatSpec(Generic()), False,
     '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}, '
     '{"name": "search", "arguments": {"query": "rain"}}]}', Parsed("", "", [OSLO, RAIN])),
    ("generic-response", ChatSpec(Generic()), False,
     '{"response": "It is \\"sunny\\" in Oslo, caf\\u00e9 open.\\nBye \\ud83d\\ude00 \\\\o/"}',
     Parsed("", 'It is "sunny" in Oslo, café open.\nBye \U0001F600 \\o/', [])),
    ("generic-text", ChatSpec(Generic()), False, "Just text.", Parsed("", "Just text.", [])),
    ("generic-think", ChatSpec(Generic(), THINK), False,
     '<think>\nCall it.\n</think>\n```json\n{"tool_call": {"name": "search", "arguments": {"query": "rain"}}}\n```',
     Parsed("Call it.", "", [RAIN])),
    ("deepseek-r1-started", ChatSpec(None, THINK), True, "Two plus two.\n</think>\n\nThe answer is 4.",
     Parsed("Two plus two.", "The answer is 4.", [])),
    ("deepseek-r1", ChatSpec(None, THINK), False, "<think>\nTwo plus two.\n</think>\n\nThe answer is 4.",
     Parsed("Two plus two.", "The answer is 4.", [])),
    # A model that thinks again after closing its reasoning (seen sampled on the CPU pair with Qwen3.5's
    # template): the later block is reasoning too, its markers never content.
    ("qwen3-thinks-again", ChatSpec(None, THINK), True,
     "Light scatters.\n</think>\n\n<think>\nRayleigh scattering.\n</think>\nBlue light scatters most. Done.",
     Parsed("Light scatters.\n\nRayleigh scattering.", "Blue light scatters most. Done.", [])),
    ("qwen3-coder-opens-again", ChatSpec(F["qwen3-coder"], THINK), True,
     f"<think>\nHm.\n</think>\n\nChecking.\n{XML_RAIN}", Parsed("Hm.", "Checking.", [RAIN])),
    ("qwen3-thinks-between", ChatSpec(None, THINK), True,
     "A.</think>First part. <think>B.</think>Second part.", Parsed("A.\n\nB.", "First part. Second part.", [])),
    ("gemma4-thinks-again", ChatSpec(F["gemma4"], CHANNEL), False,
     f"<|channel>thought\nOne.<channel|>Checking.<|channel>thought\nTwo.<channel|>{GEMMA_RAIN}",
     Parsed("One.\n\nTwo.", "Checking.", [RAIN])),
]


def _whole(spec, started, text, tools=TOOLS) -> Parsed:
    stream = ChatStream(spec, tools, started)
    stream.push(text)
    return stream.finish()[1]


def _streamed(spec, started, pieces, tools=TOOLS) -> Parsed:
    """The deltas of a stream of `pieces`, put back together (and checked to come in order)."""
    stream = ChatStream(spec, tools, started)
    deltas = [d for p in pieces for d in stream.push(p)] + stream.finish()[0]
    calls, open_ = [], None
    for d in deltas:
        if isinstance(d, CallStart):
            assert open_ is None and d.index == len(calls)
            open_ = d
        elif isinstance(d, CallArguments):
            assert open_ is not None and d.index == open_.index
            args = json.loads(d.text)
        elif isinstance(d, CallEnd):
            assert open_ is not None and d.call == Call(open_.name, args)
            calls.append(d.call)
            open_ = None
    assert open_ is None
    return Parsed("".join(d.text for d in deltas if isinstance(d, ReasoningDelta)),
                  "".join(d.text for d in deltas if isinstance(d, TextDelta)), calls)


@pytest.mark.parametrize("spec, started, text, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_answer_parses_the_same_whole_or_streamed_at_any_split(spec, started, text, expected):
    assert _whole(spec, started, text) == expected
    for at in range(len(text) + 1):
        assert _streamed(spec, started, [text[:at], text[at:]]) == expected, at
    assert _streamed(spec, started, list(text)) == expected
    assert not [m for m in MARKUP if m in expected.content]


def test_a_generic_response_streams_as_it_comes():
    stream = ChatStream(ChatSpec(Generic()), TOOLS)
    assert stream.push('{"response": "Hel') == [TextDelta("Hel")]
    assert stream.push("lo, ") == [TextDelta("lo,")]  # the space may still come before a call: held
    assert stream.push('world \\u00e') == [TextDelta(" world")]  # half an escape: held
    assert stream.push('9"}') == [TextDelta(" \u00e9")]
    assert stream.finish() == ([], Parsed("", "Hello, world \u00e9", []))


def test_without_tools_offered_calls_stay_text():
    spec = ChatSpec(F["hermes"], THINK)
    text = f"<think>\nHm.\n</think>\n\nSure.\n{HERMES_RAIN}"
    assert _whole(spec, False, text, tools=[]) == Parsed("Hm.", f"Sure.\n{HERMES_RAIN}", [])


def test_values_given_as_text_take_the_schema_types():
    xml = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n3\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
           "<parameter=metric>\ntrue\n</parameter>\n"
           "<parameter=opts>\n{\"hourly\": true, \"hours\": [1, 2]}\n</parameter>\n"
           "<parameter=code>\n007\n</parameter>\n</function>\n</tool_call>")
    want = {"city": "3", "days": 3, "metric": True, "opts": {"hourly": True, "hours": [1, 2]}, "code": "007"}
    assert _whole(ChatSpec(F["qwen3-coder"]), False, xml).calls == [Call("get_weather", want)]
    gemma = ('<|tool_call>call:get_weather{city:<|"|>3<|"|>,code:<|"|>007<|"|>,days:<|"|>3<|"|>,metric:true,'
             'opts:{hourly:true,hours:[1,2]}}<tool_call|>')
    assert _whole(ChatSpec(F["gemma4"]), False, gemma).calls == [Call("get_weather", want)]
    odd = '<|tool_call>call:get_weather{city:<|"|>Oslo, "NO" {x}<|"|>,opts:{<|"|>a b<|"|>:null,n:-1.5e2}}<tool_call|>'
    assert _whole(ChatSpec(F["gemma4"]), False, odd).calls == [
        Call("get_weather", {"city": 'Oslo, "NO" {x}', "opts": {"a b": None, "n": -150.0}})]
    small = '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]"{\\"city\\": \\"Oslo\\", \\"days\\": 3}"'
    assert _whole(ChatSpec(F["mistral-call-id"]), False, small).calls == [OSLO]  # arguments as a JSON string


MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'),
    ("hermes", 'Sure <tool_call>\n{"name": "search"'),
    ("qwen3-coder", "<tool_call>\n<function=nope>\n</function>\n</tool_call>"),
    ("qwen3-coder", "<tool_call>\n<function=search>\nquery=rain\n</function>\n</tool_call>"),
    ("qwen3-coder", "<tool_call>\n<function=search>\n<parameter=query>\nrain"),
    ("mistral", "[TOOL_CALLS]nope[ARGS]{}"),
    ("mistral", '[TOOL_CALLS]search[ARGS]{"query": '),
    ("mistral", "Well [TOOL_CALLS]search{}"),
    ("mistral-call-id", '[TOOL_CALLS]search[CALL_ID]x[ARGS]["rain"]'),
    ("mistral-nemo", '[TOOL_CALLS][{"name": "nope", "arguments": {}}]'),
    ("mistral-nemo", '[TOOL_CALLS][{"name": "search"'),
    ("mistral-nemo", '[TOOL_CALLS]"search"'),
    ("llama3", '{"name": "nope", "parameters": {}}'),
    ("llama3", '{"name": "search", "parameters": {"query": "x"}'),
    ("llama3", '{"name": "search", "parameters": {"query": "x"}} and then text'),
    ("llama3", "<|python_tag|>brave_search.call(query=\"x\")"),
    ("gemma4", "<|tool_call>call:nope{}<tool_call|>"),
    ("gemma4", '<|tool_call>call:search{query:<|"|>rain}<tool_call|>'),
    ("gemma4", "<|tool_call>call:search{query:rain}<tool_call|>"),
    ("gemma4", '<|tool_call>call:search{query:<|"|>x'),
    ("gemma4", '<|tool_call>call:search{query:<|"|>x<|"|>,}<tool_call|>'),
    ("generic", '{"tool_call": {"name": "nope", "arguments": {}}}'),
    ("generic", '{"tool_call": {"name": "search", "arguments": '),
    ("generic", '{"tool_calls": "search"}'),
    ("generic", '{"tool_call": {"name": "search", "arguments": {"query": "x"}}, "more": 1}'),
]


@pytest.mark.parametrize("name, text", MALFORMED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MALFORMED)])
def test_a_malformed_or_unknown_call_stays_text(name, text):
    spec = ChatSpec(F[name])
    assert _whole(spec, False, text) == Parsed("", text, [])
    assert _streamed(spec, False, list(text)) == Parsed("", text, [])


@pytest.mark.parametrize("spec, started, text, reasoning", [
    (ChatSpec(F["qwen3-coder"], THINK), True, "Still about <tool_call> maybe", "Still about <tool_call> maybe"),
    (ChatSpec(F["hermes"], THINK), False, "<think>\nStill thinking", "Still thinking"),
    (ChatSpec(F["gemma4"], CHANNEL), False, "<|channel>thought\nhmm, <|tool_call>", "hmm, <|tool_call>"),
    (ChatSpec(F["mistral"], MTHINK), False, "[THINK]Maybe [TOOL_CALLS]", "Maybe [TOOL_CALLS]"),
    (ChatSpec(None, THINK), True, "Two plus", "Two plus"),
])
def test_an_answer_cut_inside_the_reasoning_is_all_reasoning(spec, started, text, reasoning):
    assert _whole(spec, started, text) == Parsed(reasoning, "", [])
    assert _streamed(spec, started, list(text)) == Parsed(reasoning, "", [])


def test_generic_render_tools_writes_the_calls_and_results_in():
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"query": "rain"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c2", "content": "no rain"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "Thanks"}]
    tools = [{"type": "function", "function": t} for t in TOOLS]
    out = Generic().render_tools(messages, tools)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be terse.\n\n") and '"get_weather"' in out[0]["content"]
    assert '{"tool_call": {"name":' in out[0]["content"] and '{"response":' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}},
                                                            {"name": "search", "arguments": {"query": "rain"}}]}
    results = [json.loads(part) for part in out[3]["content"].split("\n\n")]
    assert results == [{"tool_response": {"name": "get_weather", "content": "sunny"}},
                       {"tool_response": {"name": "search", "content": "no rain"}}]
    assert json.loads(out[4]["content"]) == {"response": "Sunny."}
    assert out[5] == {"role": "user", "content": "Thanks"}
    assert messages[2]["content"] is None  # the caller's messages are left as they were
    bare = Generic(system_role=False).render_tools(messages[1:], tools)
    assert [m["role"] for m in bare] == ["user", "assistant", "user", "assistant", "user"]
    assert bare[0]["content"].startswith("You can call these tools") and bare[0]["content"].endswith("Weather in Oslo?")


# --- grammars, checked by llama.cpp's own GBNF parser -------------------------------------------


@pytest.fixture(scope="module")
def gbnf_check(tmp_path_factory):
    """llama.cpp's grammar parser (through its grammar sampler, on a tiny model's vocabulary: the
    parser needs one): `check(gbnf, triggers)` is True if llama.cpp accepts the grammar.
    (llama_cpp.LlamaGrammar.from_string does not parse the text in llama-cpp-python 0.3.36.)"""
    import llama_cpp
    from support.tinymodels import write_tiny_model

    if not hasattr(llama_cpp, "llama_sampler_init_grammar_lazy_patterns"):
        pytest.skip("this llama-cpp-python has no grammar sampler to parse GBNF with")
    path = write_tiny_model(tmp_path_factory.mktemp("vocab") / "vocab.gguf", n_layers=1)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    vocab = llama_cpp.llama_model_get_vocab(model)

    def check(gbnf: str, triggers: tuple[str, ...] = ()) -> bool:
        for t in triggers:
            re.compile(t)
        patterns = (ctypes.c_char_p * max(1, len(triggers)))(*[t.encode() for t in triggers])
        sampler = (llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, gbnf.encode(), b"root", patterns,
                                                                       len(triggers), None, 0) if triggers
                   else llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root"))
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    yield check
    llama_cpp.llama_model_free(model)


def test_the_grammar_check_rejects_a_bad_grammar(gbnf_check):
    assert gbnf_check('root ::= "a" [0-9]{9}')
    assert not gbnf_check('root ::= "a" undefined-rule')
    assert not gbnf_check('root ::= "a')


def _top_level(gbnf: str) -> str:
    """The root rule's body outside quotes, classes and parentheses."""
    body = next(line for line in gbnf.splitlines() if line.startswith("root ::= "))[len("root ::= "):]
    body = re.sub(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', "", body)
    while re.search(r"\([^()]*\)", body):
        body = re.sub(r"\([^()]*\)", "", body)
    return body


GRAMMAR_SPECS = [ChatSpec(F[name], r) for name in F for r in (None, THINK)] + [
    ChatSpec(F["gemma4"], CHANNEL), ChatSpec(F["mistral"], MTHINK), ChatSpec(Generic(system_role=False))]


@pytest.mark.parametrize("spec", GRAMMAR_SPECS, ids=[s.name for s in GRAMMAR_SPECS])
def test_call_grammars_parse_in_llama_cpp(spec, gbnf_check):
    for forced in (True, False):
        for parallel in (True, False):
            for started in ((False, True) if spec.reasoning else (False,)):
                for tools in (TOOLS, [SEARCH]):
                    g = call_grammar(spec, tools, forced, parallel, started)
                    assert bool(g.triggers) != forced
                    assert gbnf_check(g.gbnf, g.triggers), (forced, parallel, started, g.gbnf, g.triggers)
                    assert "|" not in _top_level(g.gbnf), g.gbnf  # the reasoning then the calls, not either
                    for t in tools:
                        assert t["name"] in g.gbnf


@pytest.mark.parametrize("spec, answer, triggers", [
    (ChatSpec(F["llama3"]), '{"name": "search", "parameters": {}}', True),
    (ChatSpec(F["llama3"]), 'See {"name": "search"}', False),
    (ChatSpec(Generic(), THINK), '<think>\nhm\n</think>\n{"tool_call": {}}', True),
    (ChatSpec(Generic(), THINK), 'Say {"tool_call": {}}', False),
    (ChatSpec(F["hermes"], THINK), "<think>\nhm\n</think>\nSay <tool_call>", True),
    (ChatSpec(F["gemma4"]), "Say <|tool_call>call:", True),
])
def test_a_lazy_grammar_starts_at_the_formats_opening(spec, answer, triggers):
    """llama.cpp tries the pattern on the answer as it grows, token by token (here: character by character)."""
    (pattern,) = call_grammar(spec, TOOLS, forced=False).triggers
    assert any(re.search(pattern, answer[:n]) for n in range(len(answer) + 1)) == triggers


@pytest.mark.parametrize("spec, answer, triggers", [
    (ChatSpec(F["qwen3-coder"]), "Say <function=get_w", True),
    (ChatSpec(F["qwen3-coder"]), "Say <function=add", False),
    (ChatSpec(F["qwen3-coder"]), "Say <tool_call>\n<func", True),
    (ChatSpec(F["qwen3-coder"]), "Say <tool_call>\n\n", False),
    (ChatSpec(F["hermes"]), 'Say <tool_call>\n{"name":"sea', True),
    (ChatSpec(F["hermes"]), 'Say <tool_call>\n{ "name" : "ping" , "arguments" : ', True),
    (ChatSpec(F["hermes"]), "Say <tool_call>s", False),
    (ChatSpec(F["hermes"]), 'Say <tool_call>\n{"name": "add"', False),
    (ChatSpec(F["llama3"]), '{"name": "search"', True),
    (ChatSpec(F["llama3"]), '{"name",', False),
    (ChatSpec(F["llama3"]), '{"name":  "', False),  # two spaces: the grammar's `space` is one or none
    (ChatSpec(Generic()), '{"tool_calls": [{"', True),
    (ChatSpec(Generic()), '{"tool_call_id"', False),
    (ChatSpec(F["mistral"]), "Say [TOOL_CALLS]search[AR", True),
    (ChatSpec(F["mistral"]), "Say [TOOL_CALLS].", False),
    (ChatSpec(F["mistral-call-id"]), "Say [TOOL_CALLS]ping[CALL_ID]", True),
    (ChatSpec(F["mistral-call-id"]), "Say [TOOL_CALLS]ping[ARGS]", False),
    (ChatSpec(F["mistral-nemo"]), 'Say [TOOL_CALLS][{"name": "ping", "arg', True),
    (ChatSpec(F["mistral-nemo"]), "Say [TOOL_CALLS]ping", False),
    (ChatSpec(F["gemma4"]), "Say <|tool_call>call:ping{", True),
    (ChatSpec(F["gemma4"]), "Say <|tool_call>\n", False),
])
def test_a_lazy_grammar_starts_only_where_the_rest_of_the_token_can_start_a_call(spec, answer, triggers):
    """The answer so far ends in a token that completes the opening and goes on: the pattern matches only
    if what follows the opening is the start of a call of an offered function as the grammar takes it."""
    (pattern,) = call_grammar(spec, TOOLS, forced=False).triggers
    assert bool(re.search(pattern, answer)) == triggers


def test_generic_tool_calls_start_a_lazy_grammar_only_where_calls_may_be_parallel():
    one, several = (call_grammar(ChatSpec(Generic()), TOOLS, forced=False, parallel=p).triggers[0] for p in (False, True))
    assert re.search(several, '{"tool_calls') and not re.search(one, '{"tool_calls')
    assert re.search(one, '{"tool_call"') and re.search(several, '{"tool_call"')


LAZY_ACCEPT = """
import ctypes, json, sys
import llama_cpp
from app.chat import formats
from app.chat.detect import REASONING
from app.chat.grammar import call_grammar
from app.chat.spec import ChatSpec
from app.engine.sampling import grammar_sampler

path, name, parallel, words, *answers = sys.argv[1:]
words = json.loads(words)  # the vocabulary's own tokens (ids 300 on); any other text: a token a byte
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
params.vocab_only = True
model = llama_cpp.llama_model_load_from_file(path.encode(), params)
vocab = llama_cpp.llama_model_get_vocab(model)
n = llama_cpp.llama_vocab_n_tokens(vocab)
tool = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
g = call_grammar(ChatSpec(formats.BY_NAME[name], REASONING[0]), [tool], forced=False, parallel=parallel == "1")
for answer in answers:
    sampler = grammar_sampler(vocab, g.gbnf, g.triggers)
    for piece in json.loads(answer):
        for t in [300 + words.index(piece)] if piece in words else [3 + b for b in piece.encode()]:
            llama_cpp.llama_sampler_accept(sampler, t)
    data = (llama_cpp.llama_token_data * n)(*[llama_cpp.llama_token_data(i, 0.0, 0.0) for i in range(n)])
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(llama_cpp.llama_token_data_array(data, n, -1, False)))
    free = all(data[i].logit != float("-inf") for i in range(n))  # the grammar not (yet) triggered
    llama_cpp.llama_sampler_free(sampler)
    print("accepted", "free" if free else "constrained", answer, flush=True)
"""

# (format, parallel calls, the vocabulary's own tokens, an answer whose call triggers the grammar (and
# the grammar takes it), an answer with a token that completes the opening and goes on with text the
# grammar cannot take)
LAZY_CASES = [
    ("qwen3-coder", True, ["=add", "=get", "<function"],
     ["Sure ", "<function", "=get", "_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>"],
     ["Sure ", "<function", "=add", ">\n</function>\nDone."]),
    ("qwen3-coder", True, ["<tool_call", ">\n", ">\n\n"],
     ["Sure ", "<tool_call", ">\n", "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"],
     ["Sure ", "<tool_call", ">\n\n", "Done."]),
    ("hermes", True, ["<tool_call", ">\n", ">\n\n"],
     ["Sure ", "<tool_call", ">\n", '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'],
     ["Sure ", "<tool_call", ">\n\n", "Done."]),
    ("llama3", True, ['{"name', '":', '":{'],
     ['{"name', '":', ' "get_weather", "parameters": {"city": "Oslo"}}'],
     ['{"name', '":{', '"first": "Ada"}}']),
    ("generic", False, ['{"tool', '_call":', "_calls"],
     ['{"tool', '_call":', ' {"name": "get_weather", "arguments": {"city": "Oslo"}}}'],
     ['{"tool', "_calls", '": [{"name": "get_weather", "arguments": {}}]}']),
    ("generic", True, ['{"tool', "_calls", "_call_"],
     ['{"tool', "_calls", '": [{"name": "get_weather", "arguments": {}}]}'],
     ['{"tool', "_call_", 'id": "a1"}']),
    ("mistral", True, ["[TOOL_CALLS", "]get", "]."],
     ["Sure ", "[TOOL_CALLS", "]get", '_weather[ARGS]{"city": "Oslo"}'],
     ["Use ", "[TOOL_CALLS", "].", " Done."]),
    ("mistral-call-id", True, ["[TOOL_CALLS", "]get", "]."],
     ["Sure ", "[TOOL_CALLS", "]get", '_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo"}'],
     ["Use ", "[TOOL_CALLS", "].", " Done."]),
    ("mistral-nemo", True, ["[TOOL_CALLS", '][{"', "]."],
     ["Sure ", "[TOOL_CALLS", '][{"', 'name": "get_weather", "arguments": {"city": "Oslo"}}]'],
     ["Use ", "[TOOL_CALLS", "].", " Done."]),
    ("gemma4", True, ["<|tool_call", ">call", ">\n"],
     ["Sure ", "<|tool_call", ">call", ':get_weather{city:<|"|>Oslo<|"|>}<tool_call|>'],
     ["Sure ", "<|tool_call", ">\n", "Done."]),
]
LAZY_IDS = ["qwen3-coder-function", "qwen3-coder-tool-call", "hermes", "llama3", "generic", "generic-parallel", "mistral",
            "mistral-call-id", "mistral-nemo", "gemma4"]


@pytest.mark.parametrize("name, parallel, words, call, text", LAZY_CASES, ids=LAZY_IDS)
def test_a_lazy_grammar_survives_a_token_that_completes_an_opening_and_goes_on(tmp_path, name, parallel, words,
                                                                               call, text):
    """An opening that is no special token (`<function=`; `<tool_call>`, `[TOOL_CALLS]`... where a
    vocabulary has no such token) may be completed by a token that goes on (`=add`, `>\n\n`, `].`).
    llama.cpp feeds a lazy grammar, once triggered, the text from the opening on and aborts the process
    (an uncaught C++ exception) if the grammar cannot take it: the trigger must not fire there (the text
    stays text); a call of an offered function, its first token going on as the grammar takes it,
    triggers (the grammar constrains what follows) as before."""
    import subprocess
    import sys

    from support.tinymodels import tiny_vocab, write_tiny_model

    tokens = list(tiny_vocab()[0])
    tokens[300:300 + len(words)] = words
    vocab = write_tiny_model(tmp_path / "vocab.gguf", n_layers=1, tokens=tokens)
    r = subprocess.run([sys.executable, "-c", LAZY_ACCEPT, str(vocab), name, "1" if parallel else "0", json.dumps(words),
                        json.dumps(call), json.dumps(text)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout.splitlines() == [f"accepted constrained {json.dumps(call)}", f"accepted free {json.dumps(text)}"]


def test_a_stray_closing_marker_never_reaches_the_content():
    """Told not to think, a model may still write </think>: the marker is dropped, whole and streamed."""
    spec = ChatSpec(F["qwen3-coder"], THINK)
    text = f"I will call it.\n</think>\n{XML_RAIN}"
    whole = _whole(spec, False, text)
    assert whole == Parsed("", "I will call it.", [RAIN])
    for cut in range(len(text) + 1):
        assert _streamed(spec, False, [text[:cut], text[cut:]]) == whole


def test_text_values_stop_at_the_calls_own_closing_tags(gbnf_check):
    """A Qwen3-Coder text value may not run past </parameter>, </function> or </tool_call>: a model
    that closes a parameter with the wrong tag is led back to the call's end, not kept in the value."""
    from app.chat.gbnf import until

    rule = until("\n</parameter>", "\n</function>", "\n</tool_call>")
    for delimiter in ("\n</parameter>", "\n</function>", "\n</tool_call>"):
        assert f"{json.dumps(delimiter[:-1])} [^{delimiter[-1]}]" in rule, rule
    assert '"\\n</" [^fpt]' in rule  # the shared start continues only where no delimiter does
    assert gbnf_check(f"root ::= {rule}")


def test_after_lazy_calls_the_answer_may_go_on_in_text(gbnf_check):
    """Lazy: calls, then free text (not markup) or the end; a model is not made to write call after call.
    Forced: calls only."""
    spec = ChatSpec(F["qwen3-coder"], THINK)
    lazy = call_grammar(spec, TOOLS, forced=False)
    root = next(line for line in lazy.gbnf.splitlines() if line.startswith("root ::="))
    assert root.endswith("after-calls") and gbnf_check(lazy.gbnf, lazy.triggers)
    forced = call_grammar(spec, TOOLS, forced=True)
    assert "after-calls" not in forced.gbnf
    whole = call_grammar(ChatSpec(F["llama3"]), TOOLS, forced=False)  # a JSON answer: nothing after it
    assert "after-calls" not in whole.gbnf


def test_system_messages_join_at_the_start_only_when_there_are_several_or_late_ones():
    from app.server.answer import leading_system

    one = [{"role": "system", "content": "a"}, {"role": "user", "content": "q"}]
    assert leading_system(one) is one
    late = [{"role": "system", "content": "a"}, {"role": "user", "content": "q"}, {"role": "system", "content": "b"}]
    assert leading_system(late) == [{"role": "system", "content": "a\n\nb"}, {"role": "user", "content": "q"}]
    two = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "q"}]
    assert leading_system(two)[0] == {"role": "system", "content": "a\n\nb"} and len(leading_system(two)) == 2


def test_a_call_written_again_is_one_call_and_marks_a_loop():
    spec = ChatSpec(F["qwen3-coder"])
    stream = ChatStream(spec, TOOLS)
    deltas = stream.push(f"{XML_RAIN}\n{XML_OSLO}\n")
    assert not stream.repeating and [d.call for d in deltas if isinstance(d, CallEnd)] == [RAIN, OSLO]
    assert [d for d in stream.push(XML_RAIN) if isinstance(d, CallEnd)] == [] and stream.repeating
    _, whole = stream.finish()
    assert whole.calls == [RAIN, OSLO]
