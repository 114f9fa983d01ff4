"""Which chat format a template speaks, found as llama.cpp finds it: by rendering a conversation
with a known tool call through the template and reading what it wrote, and by the reasoning markers
it uses. A template whose call syntax is not one of the formats here is served with calls as text,
said in one line at start (`ChatSpec.note`)."""

from __future__ import annotations

from collections.abc import Callable

from app.chat import formats
from app.chat.format import ToolFormat
from app.chat.reasoning import Reasoning
from app.chat.spec import NOT_PARSED, ChatSpec

# render(messages, tools, add_generation_prompt) -> the prompt text (raises what the template raises)
Render = Callable[[list[dict], list[dict] | None, bool], str]

PROBE_NAME, PROBE_ARG, PROBE_VALUE = "probe_function", "probe_arg", "probe_value"
PROBE_TOOL = {"type": "function", "function": {
    "name": PROBE_NAME, "description": "a probe",
    "parameters": {"type": "object", "properties": {PROBE_ARG: {"type": "string"}}, "required": [PROBE_ARG]}}}


PROBE_ID = "probe0001"  # nine letters and digits: Mistral's templates refuse any other call id


def _probe_messages(arguments, content: str | None = "") -> list[dict]:
    call = {"id": PROBE_ID, "type": "function", "function": {"name": PROBE_NAME, "arguments": arguments}}
    return [{"role": "user", "content": "probe question"},
            {"role": "assistant", "content": content, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": PROBE_ID, "name": PROBE_NAME, "content": "probe result"},
            {"role": "assistant", "content": "probe answer"}]


def rendered_call(render: Render) -> str | None:
    """The template's rendering of a conversation holding one call of the probe function (arguments
    given as an object, else as JSON text; the calling message's content empty, else None: templates
    differ), or None if it renders none."""
    shapes = [(arguments, content) for content in ("", None)
              for arguments in ({PROBE_ARG: PROBE_VALUE}, '{"' + PROBE_ARG + '": "' + PROBE_VALUE + '"}')]
    for arguments, content in shapes:
        try:
            text = render(_probe_messages(arguments, content), [PROBE_TOOL], False)
        except Exception:  # noqa: BLE001 - a template that raises on this shape: try the other
            continue
        if PROBE_NAME in text:
            return text
    return None


def tool_format(text: str | None, source: str, render: Render | None = None) -> ToolFormat | None:
    """The format whose markup the rendered call shows."""
    if text is None:
        return formats.without_native_tools(source, render)
    for fmt in formats.ALL:
        if fmt.renders(text, PROBE_NAME, PROBE_ARG):
            return fmt
    return None


def reasoning_markers(source: str) -> Reasoning | None:
    for r in REASONING:
        if r.closing in source:
            return r
    return None


REASONING = (Reasoning("<think>", "</think>"), Reasoning("<|channel>thought", "<channel|>"),
             Reasoning("[THINK]", "[/THINK]"))  # Qwen3 / DeepSeek-R1, Gemma 4, Ministral 3


def detect(source: str | None, render: Render) -> ChatSpec:
    """The chat format of a template (`source`, rendered by `render`)."""
    if not source:
        return ChatSpec()
    fmt = tool_format(rendered_call(render), source, render)
    return ChatSpec(fmt, reasoning_markers(source), None if fmt is not None else NOT_PARSED)
