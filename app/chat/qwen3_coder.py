"""Qwen3-Coder / Qwen3.5 / Qwen3.6 (also Nemotron Nano 3): calls in XML, every value as text,

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Oslo
    </parameter>
    </function>
    </tool_call>

Values become the types the function's schema declares (`app.chat.types`). In a grammar a text value
ends at its `</parameter>` and may not hold the call's own closing tags either, so a model that closes
a parameter with the wrong tag is led back to the right one instead of writing on inside the value. Small models often
leave out the <tool_call> tags around a <function=...> block: such a block is a call too (as
llama.cpp's parser takes it), and a lazy grammar also starts at it."""

from __future__ import annotations

import re

from app.chat.format import Call, Scan, ToolFormat, Tools, rule_name, scan_kinds
from app.chat.gbnf import Grammar, literal, until
from app.chat.types import convert_arguments, declared_types, parameters

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.S)
_FUNCTION_OPEN = re.compile(r"\A\s*<function=([^>\n]+)>(.*)\Z", re.S)  # at the very end: </function> left out
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _value(text: str) -> str:
    """A parameter's text without the one new line the format puts on each side."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


class Qwen3Coder(ToolFormat):
    name = "qwen3-coder"
    label = "Qwen3-Coder XML (<function=...><parameter=...>)"
    opening = OPEN
    openings = ("<function=",)
    markup = (OPEN, CLOSE)

    def renders(self, text: str, name: str, arg: str) -> bool:
        call = re.escape(f"{OPEN}\n<function={name}>") + r"\s*" + re.escape(f"<parameter={arg}>")
        return re.search(call, text) is not None

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        return scan_kinds(text, [(OPEN, CLOSE, lambda block: self._calls(block, tools)),
                                 ("<function=", "</function>", lambda block: self._calls(f"<function={block}</function>", tools))],
                          final)

    def _calls(self, block: str, tools: Tools) -> list[Call] | None:
        m = _FUNCTION.match(block) or _FUNCTION_OPEN.match(block)
        if m is None or m.group(1).strip() not in tools:
            return None
        name, body = m.group(1).strip(), m.group(2)
        args = {p.group(1).strip(): _value(p.group(2)) for p in _PARAMETER.finditer(body)}
        if _PARAMETER.sub("", body).strip():  # text between the parameters: not this format
            return None
        return [Call(name, convert_arguments(args, tools[name]))]

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`<function=` is no special token: a token may complete it and go on (`=add`). The lazy grammar
        starts there only while what follows is the start of an offered function's `NAME>` (llama.cpp
        aborts on text the grammar cannot take: a call of another function stays text). Likewise after
        `<tool_call>`, where a vocabulary has no such token (`>` `>\n\n` completing `<tool_call`)."""
        head = "" if opening == "<function=" else "\n<function="
        return [f"{head}{t['name']}>\n" for t in tools]

    def call_rule(self, g: Grammar, tool: dict) -> str:
        schema = tool.get("parameters") if isinstance(tool.get("parameters"), dict) else {}
        required = set(schema.get("required") or [])
        parts = []
        for key, sub in parameters(tool).items():
            types = declared_types(sub)
            value = (g.rule("text-value", until("\n</parameter>", "\n</function>", "\n</tool_call>")) if "string" in types or not types
                     else g.schema(sub, f"{rule_name(tool['name'])}-{rule_name(key)}"))
            one = f'{literal(f"<parameter={key}>" + chr(10))} {value} {literal(chr(10) + "</parameter>" + chr(10))}'
            parts.append(one if key in required else f"({one})?")
        fn = g.rule(f"function-{rule_name(tool['name'])}",
                    " ".join([literal(f"<function={tool['name']}>\n"), *parts, literal("</function>")]))
        return f'{literal(OPEN + chr(10))} {fn} {literal(chr(10) + CLOSE)} | {fn}'

