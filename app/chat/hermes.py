"""Hermes / Qwen2.5 / Qwen3: a call is JSON in `<tool_call>` tags,
`<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, several one after another. Small
Qwen coders also answer a call as a ```json block or a bare JSON object; llama.cpp's Hermes parser
takes those too (as the whole answer)."""

from __future__ import annotations

import re

from app.chat.format import Scan, ToolFormat, Tools, json_call_rule, json_call_start, json_calls, rule_name, scan_blocks
from app.chat.gbnf import Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FENCED = re.compile(r"\A\s*```(?:json)?\s*(\{.*\}|\[.*\])\s*```\s*\Z", re.S)
_BARE = re.compile(r"\A\s*(\{.*\}|\[.*\])\s*\Z", re.S)
_MAYBE = re.compile(r"\A\s*(?:```(?:json)?\s*(?:[\[{].*)?|[\[{].*)\Z", re.S)


class Hermes(ToolFormat):
    name = "hermes"
    label = "Hermes JSON in <tool_call> tags"
    opening = OPEN
    markup = (OPEN, CLOSE)

    def renders(self, text: str, name: str, arg: str) -> bool:
        return re.search(re.escape(OPEN) + r'\s*\{\s*"name"\s*:\s*"' + re.escape(name) + '"', text) is not None

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        found = scan_blocks(text, OPEN, CLOSE, lambda blob: json_calls(blob.strip(), tools), final)
        if found.calls or OPEN in text:
            return found
        if not final:  # the whole answer may still be a fenced or bare JSON call
            lead = text.lstrip()
            if not lead or "```json".startswith(lead) or _MAYBE.match(lead):
                return Scan("")
            return found
        for pattern in (_FENCED, _BARE):
            m = pattern.match(text)
            calls = json_calls(m.group(1), tools) if m else None
            if calls:
                return Scan("", calls)
        return found

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """Where `<tool_call>` is no token of the vocabulary, a token may complete it and go on (`>\n\n`)."""
        return ["\n" + json_call_start(t) for t in tools]

    def call_rule(self, g: Grammar, tool: dict) -> str:
        return f'"{OPEN}\\n" {g.rule("json-" + rule_name(tool["name"]), json_call_rule(g, tool))} "\\n{CLOSE}"'
