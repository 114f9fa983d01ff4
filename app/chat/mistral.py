"""Mistral: each call after a `[TOOL_CALLS]`, in one of two syntaxes.

Mistral Nemo writes the calls as one JSON list,
`[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}, ...]`.
Devstral, Mistral Small 3.2 and Ministral 3 write the name, then the JSON arguments, one
`[TOOL_CALLS]` per call: `[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}`; Mistral Small 3.2 puts
the call's id between them, `[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{...}`. (Ministral 3 reasons in
[THINK]...[/THINK]: see detect.REASONING.)"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from app.chat.format import Call, Scan, ToolFormat, Tools, held_prefix, json_call_start, json_calls, rule_name
from app.chat.gbnf import Grammar, literal

OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_HEAD = re.compile(r"\A\s*([^\[\]\s{}]+)\s*(?:\[CALL_ID\]\s*([^\[\]\s]*)\s*)?\[ARGS\]\s*")
_DECODER = json.JSONDecoder()
_ID = "[a-zA-Z0-9]{9}"  # the call ids Mistral's templates accept


def scan_calls(text: str, final: bool, parse: Callable[[str], tuple[list[Call], str] | None]) -> Scan:
    """Calls each after a `[TOOL_CALLS]`, up to the next one or the end: `parse(segment)` gives the calls
    and the text left after them, or None (the segment, its `[TOOL_CALLS]` with it, stays in the
    content). Partial: content stops at the first `[TOOL_CALLS]` (or a tail that may begin one); a
    call counts once its JSON is closed."""
    first = text.find(OPEN)
    if first < 0:
        return Scan(text if final else text[: len(text) - held_prefix(text, OPEN)])
    content, calls = [text[:first]], []
    for segment in text[first + len(OPEN):].split(OPEN):
        found = parse(segment)
        if found is None:
            content.append(OPEN + segment)
        else:
            calls += found[0]
            content.append(found[1])
    return Scan("".join(content) if final else content[0], calls)


def _decode(text: str, at: int):
    """The JSON value starting at `at` (after any space) and where it ends, or None."""
    at += len(text[at:]) - len(text[at:].lstrip())
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        return None


class MistralNemo(ToolFormat):
    name = "mistral-nemo"
    label = "Mistral Nemo JSON list after [TOOL_CALLS]"
    opening = OPEN
    markup = (OPEN,)

    def renders(self, text: str, name: str, arg: str) -> bool:
        return re.search(re.escape(OPEN) + r'\s*\[\s*\{\s*"name"\s*:\s*"' + re.escape(name) + '"', text) is not None

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        def parse(segment: str) -> tuple[list[Call], str] | None:
            found = _decode(segment, 0)
            if found is None or not isinstance(found[0], (list, dict)):
                return None
            calls = json_calls(json.dumps(found[0]), tools)
            return (calls, segment[found[1]:]) if calls else None

        return scan_calls(text, final, parse)

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`[TOOL_CALLS]` written as text: a token may complete it and go on (`].`)."""
        return ["[" + json_call_start(t) for t in tools]

    def _item(self, g: Grammar, tool: dict) -> str:
        args = g.schema(tool.get("parameters") or {"type": "object"}, f"args-{rule_name(tool['name'])}")
        call_id = g.rule("call-id", f'"\\"" {_ID} "\\""')
        body = (f'"{{" space "\\"name\\"" space ":" space {literal(json.dumps(tool["name"]))} space '
                f'"," space "\\"arguments\\"" space ":" space {args} '
                f'("," space "\\"id\\"" space ":" space {call_id} space)? "}}" space')
        return g.rule(f"item-{rule_name(tool['name'])}", body)

    def call_rule(self, g: Grammar, tool: dict) -> str:
        return f'{literal(OPEN + "[")} {self._item(g, tool)} "]"'

    def calls_rule(self, g: Grammar, tools: list[dict], parallel: bool) -> str:
        item = g.rule("item", " | ".join(self._item(g, t) for t in tools))
        more = f' ("," space {item})*' if parallel else ""
        return f'{literal(OPEN + "[")} {item}{more} "]"'


class Mistral(ToolFormat):
    name = "mistral"
    label = "Mistral [TOOL_CALLS]name[ARGS]{...}"
    opening = OPEN
    markup = (OPEN, ARGS, CALL_ID)
    call_ids = False  # the template writes [CALL_ID] and the call's id between the name and [ARGS]

    def renders(self, text: str, name: str, arg: str) -> bool:
        return f"{OPEN}{name}{CALL_ID if self.call_ids else ARGS}" in text

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        def parse(segment: str) -> tuple[list[Call], str] | None:
            m = _HEAD.match(segment)
            found = _decode(segment, m.end()) if m is not None and m.group(1) in tools else None
            if found is None:
                return None
            args, end = found
            if isinstance(args, str):  # arguments given as JSON text, written as a JSON string
                inner = _decode(args, 0)
                args = inner[0] if inner is not None and not args[inner[1]:].strip() else None
            return ([Call(m.group(1), args)], segment[end:]) if isinstance(args, dict) else None

        return scan_calls(text, final, parse)

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`[TOOL_CALLS]` written as text: a token may complete it and go on (`].`)."""
        return [t["name"] + (CALL_ID if self.call_ids else ARGS) for t in tools]

    def call_rule(self, g: Grammar, tool: dict) -> str:
        args = g.schema(tool.get("parameters") or {"type": "object"}, f"args-{rule_name(tool['name'])}")
        head = literal(OPEN + tool["name"])
        call_id = f" {literal(CALL_ID)} {_ID}" if self.call_ids else ""
        return f"{head}{call_id} {literal(ARGS)} {args}"

    def calls_rule(self, g: Grammar, tools: list[dict], parallel: bool) -> str:
        one = g.rule("call", " | ".join(g.rule(f"call-{rule_name(t['name'])}", self.call_rule(g, t)) for t in tools))
        return f"{one}+" if parallel else one


class MistralCallId(Mistral):
    name = "mistral-call-id"
    label = "Mistral [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}"
    call_ids = True
