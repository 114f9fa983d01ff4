"""Gemma 4: a call is `<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3}<tool_call|>`, several
one after another. Keys are bare, a string value sits between `<|"|>` quotes (taken as written, no
escapes), other values are JSON-like: numbers, true / false / null, `{key:value,...}` objects (keys
bare or quoted) and `[...]` lists. Reasoning: the thought channel, `<|channel>thought` ... `<channel|>`."""

from __future__ import annotations

import json
import re

from app.chat.format import Call, Scan, ToolFormat, Tools, rule_name, scan_blocks
from app.chat.gbnf import Grammar, literal, until
from app.chat.types import convert_arguments, declared_types, parameters

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_HEAD = re.compile(r"\A\s*call:([^{}\s]+)\s*(?=\{)")
_BARE = re.compile(r"[^,:{}\[\]]*")
_LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class _Malformed(ValueError):
    pass


class _Reader:
    """Gemma 4's argument syntax read into Python values (raises _Malformed)."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def take(self, s: str) -> bool:
        self.space()
        if self.text.startswith(s, self.at):
            self.at += len(s)
            return True
        return False

    def quoted(self) -> str:
        end = self.text.find(QUOTE, self.at)
        if end < 0:
            raise _Malformed("unclosed string")
        value, self.at = self.text[self.at:end], end + len(QUOTE)
        return value

    def bare(self) -> str:
        m = _BARE.match(self.text, self.at)
        self.at = m.end()
        return m.group(0).strip()

    def value(self):
        if self.take(QUOTE):
            return self.quoted()
        if self.take("{"):
            return self.members()
        if self.take("["):
            items = []
            if self.take("]"):
                return items
            while True:
                items.append(self.value())
                if self.take("]"):
                    return items
                if not self.take(","):
                    raise _Malformed("expected , or ]")
        word = self.bare()
        if word in _LITERALS:
            return _LITERALS[word]
        try:
            number = json.loads(word)
        except ValueError:
            raise _Malformed(f"not a value: {word!r}") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise _Malformed(f"not a value: {word!r}")
        return number

    def members(self) -> dict:
        """An object's members up to its closing brace (the opening one read)."""
        out: dict = {}
        if self.take("}"):
            return out
        while True:
            key = self.quoted() if self.take(QUOTE) else self.bare()
            if not key or not self.take(":"):
                raise _Malformed("expected key:")
            out[key] = self.value()
            if self.take("}"):
                return out
            if not self.take(","):
                raise _Malformed("expected , or }")


def parse_call(block: str, tools: Tools) -> list[Call] | None:
    """The call in one `<|tool_call>...<tool_call|>` block; None if it is not one of `tools` well written."""
    m = _HEAD.match(block)
    if m is None or m.group(1) not in tools:
        return None
    reader = _Reader(block)
    reader.at = m.end() + 1  # past the opening brace
    try:
        args = reader.members()
    except _Malformed:
        return None
    if block[reader.at:].strip():
        return None
    name = m.group(1)
    return [Call(name, convert_arguments(args, tools[name]))]


class Gemma4(ToolFormat):
    name = "gemma4"
    label = "Gemma 4 (<|tool_call>call:name{key:value}<tool_call|>)"
    opening = OPEN
    markup = (OPEN, CLOSE, QUOTE)

    def renders(self, text: str, name: str, arg: str) -> bool:
        return f"{OPEN}call:{name}{{{arg}:" in text

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        return scan_blocks(text, OPEN, CLOSE, lambda block: parse_call(block, tools), final)

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`<|tool_call>` written as text: a token may complete it and go on (`>\n`)."""
        return [f"call:{t['name']}{{" for t in tools]

    def _values(self, g: Grammar) -> dict[str, str]:
        """Rules for Gemma 4's own values (any of them, strings, objects)."""
        q = literal(QUOTE)
        string = g.rule("gemma4-string", f"{q} {g.rule('gemma4-text', until(QUOTE))} {q}")
        number = g.rule("gemma4-number", '"-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?')
        g.rule("gemma4-value",
               'gemma4-string | gemma4-object | gemma4-list | gemma4-number | "true" | "false" | "null"')
        g.rule("gemma4-member", '(gemma4-string | [^,:{}<\\[\\]" \\n]+) ":" gemma4-value')
        g.rule("gemma4-object", '"{" (gemma4-member ("," gemma4-member)*)? "}"')
        g.rule("gemma4-list", '"[" (gemma4-value ("," gemma4-value)*)? "]"')
        return {"string": string, "number": number, "value": "gemma4-value"}

    def _value_rule(self, g: Grammar, tool: dict, key: str, schema: dict, values: dict[str, str]) -> str:
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return "(" + " | ".join(literal(QUOTE + v + QUOTE) for v in enum) + ")"
        types = declared_types(schema)
        if types == {"string"}:
            return values["string"]
        if types and types <= {"integer", "number", "boolean", "null"}:
            return g.schema(schema, f"{rule_name(tool['name'])}-{rule_name(key)}")
        return values["value"]

    def call_rule(self, g: Grammar, tool: dict) -> str:
        values = self._values(g)
        props, head = parameters(tool), literal(OPEN + "call:" + tool["name"] + "{")
        declared = isinstance(tool.get("parameters"), dict) and "properties" in tool["parameters"]
        if not props and declared:  # no arguments
            return f'{head} {literal("}" + CLOSE)}'
        if props:
            members = " | ".join(f"{literal(key + ':')} {self._value_rule(g, tool, key, sub, values)}"
                                 for key, sub in props.items())
            member = g.rule(f"member-{rule_name(tool['name'])}", members)
        else:  # arguments not described: any
            member = "gemma4-member"
        return f'{head} ({member} ("," {member})*)? {literal("}" + CLOSE)}'

    def calls_rule(self, g: Grammar, tools: list[dict], parallel: bool) -> str:
        one = g.rule("call", " | ".join(g.rule(f"call-{rule_name(t['name'])}", self.call_rule(g, t)) for t in tools))
        return f"{one}+" if parallel else one
