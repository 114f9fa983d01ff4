"""Structured output: OpenAI's `response_format`, Ollama's `format` and tool calls, turned into
GBNF for llama.cpp's grammar sampler. The JSON-schema conversion is llama-cpp-python's
(`json_schema_to_gbnf`, a port of llama.cpp's converter); nothing here parses JSON by hand."""

from __future__ import annotations

import json
import re

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from app.errors import SpecdeckError

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def json_grammar(schema: dict | None) -> str:
    """Any JSON object (no schema), or JSON valid against `schema`."""
    if schema is None:
        return JSON_GBNF
    if not isinstance(schema, dict):
        raise SpecdeckError("the JSON schema must be an object")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions for what it does not support
        raise SpecdeckError(f"cannot turn this JSON schema into a grammar: {e}") from None


def response_format_grammar(kind: str, schema: dict | None) -> str | None:
    """OpenAI's response_format: text (none), json_object, json_schema."""
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(schema)
    if kind == "json_schema":
        if schema is None:
            raise SpecdeckError("response_format json_schema needs json_schema.schema")
        return json_grammar(schema)
    raise SpecdeckError(f"unknown response_format type {kind!r}")


def tool_call_grammar(tools: list[dict]) -> str:
    """One `<tool_call>{"name": ..., "arguments": ...}</tool_call>` for one of `tools` (OpenAI's
    function definitions), arguments valid against the function's parameters."""
    options = [{"type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": t.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"]} for t in tools]
    body = json_grammar(options[0] if len(options) == 1 else {"anyOf": options})
    body = re.sub(r"^root ::=", "tool-call-json ::=", body, flags=re.M)
    return body + f'\nroot ::= "{TOOL_CALL_OPEN}\\n" tool-call-json "\\n{TOOL_CALL_CLOSE}"\n'


# Where models put a call: Hermes / Qwen's <tool_call> tags; small Qwen coders also answer with a
# ```json fenced block or a bare JSON object (llama.cpp's Hermes parser accepts these too).
_BLOCKS = [
    re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_CLOSE), re.S),
    re.compile(r"```(?:json)?\s*(\{.*?\}|\[.*?\])\s*```", re.S),
    re.compile(r"\A\s*(\{.*\}|\[.*\])\s*\Z", re.S),
]
_MAYBE = re.compile(r"\A(?:```(?:json)?\s*(?:[\[{].*)?|[\[{].*)\Z", re.S)


def _calls_in(blob: str, known: set[str]) -> list[dict] | None:
    """The calls a JSON blob names ({"name", "arguments"} or a list of them), or None if it is not one."""
    try:
        obj = json.loads(blob)
    except json.JSONDecodeError:
        return None
    calls = []
    for item in obj if isinstance(obj, list) else [obj]:
        if not isinstance(item, dict) or item.get("name") not in known:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        calls.append({"name": item["name"], "arguments": args if isinstance(args, dict) else {}})
    return calls or None


def parse_tool_calls(text: str, known: set[str]) -> tuple[str | None, list[dict]]:
    """Split a model's answer into content and tool calls ({"name", "arguments": dict}). A block
    that is not valid JSON naming a known tool stays in the content."""
    for pattern in _BLOCKS:
        calls, kept, last = [], [], 0
        for m in pattern.finditer(text):
            found = _calls_in(m.group(1), known)
            if found is None:
                continue
            kept.append(text[last:m.start()])
            last = m.end()
            calls += found
        if calls:
            kept.append(text[last:])
            return ("".join(kept).strip() or None), calls
    return text, []


def may_be_tool_call(text: str) -> bool:
    """Could this (start of an) answer be a tool call? (Streaming holds it back until it knows.)"""
    s = text.lstrip()
    return (TOOL_CALL_OPEN.startswith(s) or s.startswith(TOOL_CALL_OPEN) or "```json".startswith(s)
            or _MAYBE.match(s) is not None)


class ToolCallHold:
    """Streaming with tools: an answer that may still turn out to be a tool call is held back;
    once it cannot be one, what was held and all that follows streams as content."""

    def __init__(self, active: bool) -> None:
        self.held = ""
        self.released = not active

    def push(self, delta: str) -> str:
        if self.released:
            return delta
        self.held += delta
        if may_be_tool_call(self.held):
            return ""
        self.released, out, self.held = True, self.held, ""
        return out


def openai_tool_calls(calls: list[dict], ids: list[str]) -> list[dict]:
    """Parsed calls in OpenAI's shape (arguments as a JSON string)."""
    return [{"id": i, "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for c, i in zip(calls, ids)]
