"""Llama 3.1 / 3.2 / 3.3: a call is the whole answer, one JSON object,
`{"name": "get_weather", "parameters": {"city": "Oslo"}}`, maybe after `<|python_tag|>` (text before
the tag is content). Several calls: objects one after another (space or `;` between them)."""

from __future__ import annotations

import json
import re

from app.chat.format import SPACE, Call, Scan, ToolFormat, Tools, held_prefix, json_call_rule, json_call_start, json_calls, rule_name
from app.chat.gbnf import Grammar

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_GAP = re.compile(r"[\s;]*")


def json_objects(text: str, tools: Tools) -> list[Call] | None:
    """Calls written as JSON objects one after another, nothing else; None if any is not a call."""
    calls, at = [], _GAP.match(text).end()
    while at < len(text):
        try:
            obj, end = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        found = json_calls(text[at:end], tools) if isinstance(obj, dict) else None
        if not found:
            return None
        calls += found
        at = _GAP.match(text, end).end()
    return calls or None


class Llama3(ToolFormat):
    name = "llama3"
    label = 'Llama 3.x JSON ({"name": ..., "parameters": {...}}) as the whole answer'
    opening = '{"name"'
    markup = (PYTHON_TAG,)
    whole_answer = True

    def renders(self, text: str, name: str, arg: str) -> bool:
        return re.search(r'\{"name":\s*"' + re.escape(name) + r'",\s*"parameters":', text) is not None

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            head, body = text[:tag], text[tag + len(PYTHON_TAG):]
        elif text.lstrip().startswith("{"):
            head, body = "", text
        elif final or not text.strip():
            return Scan(text if final else "")
        else:
            return Scan(text[: len(text) - held_prefix(text, PYTHON_TAG)])
        if not final:
            return Scan(head)
        calls = json_objects(body, tools)
        return Scan(head, calls) if calls else Scan(text)

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`{"name"` is no special token: a token may complete it and go on (`":{`, `",`)."""
        head = "{" + SPACE + '"name"'
        return [json_call_start(t, args_key="parameters")[len(head):] for t in tools]

    def call_rule(self, g: Grammar, tool: dict) -> str:
        return g.rule("json-" + rule_name(tool["name"]), json_call_rule(g, tool, args_key="parameters"))
