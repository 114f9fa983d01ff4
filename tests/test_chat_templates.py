"""Chat formats against real chat templates: llama.cpp's models/templates, from the llama-cpp-python
sdist (tests/support/templates.py fetches them once per machine). Detection on every template,
and each handled family's own rendering of tools, calls, results and reasoning read back."""

from __future__ import annotations

import json

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from support.templates import templates_dir

from app.chat import formats
from app.chat.detect import REASONING, detect
from app.chat.format import Call
from app.chat.generic import Generic
from app.chat.spec import NOT_PARSED

THINK, CHANNEL, MTHINK = REASONING

WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
TOOLS = [{"type": "function", "function": WEATHER}]
FUNCTIONS = {"get_weather": WEATHER}
OSLO = Call("get_weather", {"city": "Oslo", "days": 3})
CALL = {"id": "a1b2c3d4e", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}
RESULT = "sunny, 21 C"
HISTORY = [{"role": "user", "content": "Weather in Oslo?"},
           {"role": "assistant", "content": "", "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": RESULT},
           {"role": "assistant", "content": "Sunny, 21 C."},
           {"role": "user", "content": "And tomorrow?"}]


@pytest.fixture(scope="module")
def templates():
    return templates_dir()


def _source(templates, name: str) -> str:
    return (templates / f"{name}.jinja").read_text(encoding="utf-8")


def _renderer(source: str, **kwargs):
    """Render as llama-cpp-python renders a GGUF's template (detect.Render's shape)."""
    compiled = {}

    def render(messages, tools, generation_prompt):
        if generation_prompt not in compiled:
            compiled[generation_prompt] = Jinja2ChatFormatter(source, "</s>", "<s>",
                                                              add_generation_prompt=generation_prompt)
        return compiled[generation_prompt](messages=messages, tools=tools or None, **kwargs).prompt

    return render


def test_every_template_gets_a_format_or_says_calls_are_not_parsed(templates):
    files = sorted(templates.glob("*.jinja"))
    assert len(files) >= 60
    for path in files:
        spec = detect(path.read_text(encoding="utf-8"), _renderer(path.read_text(encoding="utf-8")))
        assert spec.tools is not None or spec.note == NOT_PARSED, path.name
        assert spec.tools is None or spec.note is None, path.name


@pytest.mark.parametrize("name, tools, reasoning", [
    ("Qwen3.5-4B", "qwen3-coder", THINK),
    ("Qwen3-Coder", "qwen3-coder", None),  # the Coder instruct model does not reason
    ("Qwen-Qwen3-0.6B", "hermes", THINK),
    ("Qwen-Qwen2.5-7B-Instruct", "hermes", None),
    ("google-gemma-4-31B-it", "gemma4", CHANNEL),
    ("google-gemma-4-31B-it-interleaved", "gemma4", CHANNEL),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3", None),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3", None),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3", None),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral-nemo", None),
    ("unsloth-mistral-Devstral-Small-2507", "mistral", None),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral-call-id", None),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral", MTHINK),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", None, THINK),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", None, THINK),
    ("llama-cpp-deepseek-r1", None, THINK),
    ("google-gemma-2-2b-it", "generic", None),
    ("microsoft-Phi-3.5-mini-instruct", "generic", None),
    ("ByteDance-Seed-OSS", None, None),  # <seed:tool_call>: XML like Qwen3-Coder's, but not in its tags
    ("GLM-4.6", None, THINK),  # <tool_call>name<arg_key>...: not Hermes JSON
])
def test_known_templates_detect_as_their_format(templates, name, tools, reasoning):
    source = _source(templates, name)
    spec = detect(source, _renderer(source))
    assert (spec.tools.name if spec.tools else None, spec.reasoning) == (tools, reasoning)
    assert spec.note == (None if tools else NOT_PARSED)


# the call of HISTORY as each family's template writes it
HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}\n</tool_call>'
NATIVE = [
    ("Qwen-Qwen2.5-7B-Instruct", HERMES),
    ("Qwen-Qwen3-0.6B", HERMES),
    ("Qwen3.5-4B", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
                   "</parameter>\n</function>\n</tool_call>"),
    ("Qwen3-Coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>"),
    ("google-gemma-4-31B-it", '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3}<tool_call|>'),
    ("meta-llama-Llama-3.1-8B-Instruct", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'),
    ("meta-llama-Llama-3.2-3B-Instruct", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'),
    ("meta-llama-Llama-3.3-70B-Instruct", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'),
    ("mistralai-Mistral-Nemo-Instruct-2407",
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}, "id": "a1b2c3d4e"}]'),
    ("unsloth-mistral-Devstral-Small-2507", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 3}'),
    ("mistralai-Ministral-3-14B-Reasoning-2512", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 3}'),
    ("Mistral-Small-3.2-24B-Instruct-2506",
     '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo", "days": 3}'),
]


@pytest.mark.parametrize("name, written", NATIVE, ids=[n for n, _ in NATIVE])
def test_a_call_history_renders_in_the_formats_own_markup(templates, name, written):
    source = _source(templates, name)
    spec = detect(source, _renderer(source))
    prompt = _renderer(source)(HISTORY, TOOLS, True)
    assert written in prompt
    assert RESULT in prompt and "The weather in a city" in prompt  # the result, and the tool offered
    assert prompt.index(written) < prompt.index(RESULT) < prompt.index("And tomorrow?")
    assert spec.tools.scan(written, FUNCTIONS, final=True).calls == [OSLO]  # what it wrote reads back


@pytest.mark.parametrize("name, system_role", [("google-gemma-2-2b-it", False),
                                               ("microsoft-Phi-3.5-mini-instruct", True)])
def test_the_generic_format_writes_tools_calls_and_results_into_a_template_without_them(templates, name, system_role):
    """Gemma 3's template ignores tools; Gemma 2's (no tools either, and no system role) stands in."""
    source = _source(templates, name)
    spec = detect(source, _renderer(source))
    assert isinstance(spec.tools, Generic) and not spec.tools.native and spec.tools.system_role is system_role
    messages = spec.tools.render_tools([{"role": "system", "content": "Be terse."}, *HISTORY], TOOLS)
    prompt = _renderer(source)(messages, None, True)  # Gemma 2's raises unless user and model alternate
    written = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}'
    assert written in prompt and json.dumps({"tool_response": {"name": "get_weather", "content": RESULT}}) in prompt
    assert '{"response": "Sunny, 21 C."}' in prompt and '"description": "The weather in a city"' in prompt
    assert prompt.index("Be terse.") < prompt.index("You can call these tools") < prompt.index("Weather in Oslo?")
    assert spec.tools.scan(written, FUNCTIONS, final=True).calls == [OSLO]


@pytest.mark.parametrize("name, thought", [
    ("Qwen3.5-4B", "<think>\nI should look it up.\n</think>"),
    ("Qwen-Qwen3-0.6B", "<think>\nI should look it up.\n</think>"),
    ("google-gemma-4-31B-it", "<|channel>thought\nI should look it up.\n<channel|>"),
])
def test_reasoning_content_of_the_last_turn_reaches_the_template(templates, name, thought):
    source = _source(templates, name)
    turn = {"role": "assistant", "content": "", "reasoning_content": "I should look it up.", "tool_calls": [CALL]}
    result = {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": RESULT}
    prompt = _renderer(source)([HISTORY[0], turn, result], TOOLS, True)
    assert thought in prompt and prompt.index(thought) < prompt.index(RESULT)


def test_a_generation_prompt_that_opens_the_reasoning_is_seen(templates):
    source = _source(templates, "Qwen3.5-4B")
    assert THINK.opened_by(_renderer(source)(HISTORY, TOOLS, True))
    assert not THINK.opened_by(_renderer(source, enable_thinking=False)(HISTORY, TOOLS, True))
    r1 = _source(templates, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
    question = [{"role": "user", "content": "2+2?"}]
    assert THINK.opened_by(_renderer(r1, enable_thinking=True)(question, None, True))
    assert not THINK.opened_by(_renderer(r1)(question, None, True))  # this copy closes it unless asked to think


def test_formats_are_named_once():
    names = [f.name for f in formats.ALL]
    assert len(names) == len(set(names)) and set(names) < set(formats.BY_NAME)
