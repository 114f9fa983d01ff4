"""What every tool-call format is: how a call opens (the lazy grammar's trigger), how an answer
splits into content and calls (`scan`, on a whole answer or on the part streamed so far), and the
grammar of a call in the format's own shape. The formats: one module each in this folder."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from app.chat.gbnf import Grammar, literal


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Scan:
    """An answer split: the text outside calls and the calls. On a partial answer, `content` stops
    before anything that may still turn out to be a call (an opening, or the start of one)."""

    content: str
    calls: list[Call] = field(default_factory=list)


Tools = dict[str, dict]  # function name -> its definition (name, description, parameters)


class ToolFormat:
    name = "none"
    label = "no tool calls"
    opening = ""  # the text a call starts with (the lazy grammar's trigger)
    openings: tuple[str, ...] = ()  # more texts a call may start with (also triggers), beyond `opening`
    markup: tuple[str, ...] = ()  # strings that may be special tokens: shown in the answer's text to parse it
    native = True  # the template renders tools and calls itself (False: `render_tools` writes them in)
    whole_answer = False  # calls are the whole answer (after any reasoning), not anywhere in it

    def renders(self, text: str, name: str, arg: str) -> bool:
        """Is `text` (a template's rendering of a call of `name` with one argument `arg`) in this format?"""
        return False

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        return Scan(text)

    def call_rule(self, g: Grammar, tool: dict) -> str:
        """The grammar rule (its body) for one call of `tool` in this format."""
        raise NotImplementedError

    def calls_rule(self, g: Grammar, tools: list[dict], parallel: bool) -> str:
        """One call of one of `tools`, or (parallel) several, as the format separates them."""
        one = g.rule("call", " | ".join(g.rule(f"call-{rule_name(t['name'])}", self.call_rule(g, t)) for t in tools))
        return f'{one} ("\\n" {one})*' if parallel else one

    def render_tools(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        """Messages for a template that does not render tools itself (the generic format): as they are here."""
        return messages

    def trigger(self, opening: str, tools: list[dict], parallel: bool = True) -> str:
        """The lazy grammar's trigger pattern for one of the openings. llama.cpp, once a pattern matches,
        feeds the grammar the text from the opening on, the rest of the token that completed it
        included, and aborts the process (an uncaught C++ exception) if the grammar cannot take it.
        An opening need not be one special token (a model may write it as text, `]` `].` completing
        `[TOOL_CALLS`): the pattern matches only while what follows the opening is the start of what the
        grammar takes there (`after_opening`), so a malformed call, or one of a function not offered,
        stays text."""
        after = self.after_opening(opening, tools, parallel)
        if after is None:
            return re.escape(opening)
        return re.escape(opening) + "(?=" + prefix_pattern(after) + END + ")"

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str] | None:
        """What the call grammar takes right after `opening`, as far as it is the same text in every call
        of a tool (its name and what is fixed after it): the texts, SPACE where the grammar has an
        optional space; None: anything (no check)."""
        return None


SPACE = "\x00"  # in prefix_pattern's texts: the JSON grammar's `space` (one space or none)
END = "(?![\\s\\S])"  # the end of the text, in std::regex as in Python (whose $ also matches before a last new line)


def prefix_pattern(texts: list[str]) -> str:
    """A regex for any prefix (the empty one too) of one of `texts` (SPACE: an optional space)."""
    def one(text: str) -> str:
        out = ""
        for ch in reversed(text):
            if ch == SPACE:
                out = f"(?: ?{out})"  # "", " ", " " and more, or the more alone
                continue
            esc = "\\n" if ch == "\n" else re.escape(ch)  # a new line as \n, which std::regex reads
            out = f"(?:{esc}{out})?"
        return out

    return "(?:" + "|".join(one(t) for t in texts) + ")"


def rule_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9-]+", "-", name) or "fn"


Block = tuple[str, str, Callable[[str], "list[Call] | None"]]  # opening, closing, parse of what is between


def scan_blocks(text: str, opening: str, closing: str, parse: Callable[[str], list[Call] | None],
                final: bool) -> Scan:
    """Calls written as `opening ... closing` blocks anywhere in the answer; a block that does not
    parse (unknown function, bad arguments) stays in the content. Partial: content stops at an
    unclosed opening or at a tail that may begin one."""
    return scan_kinds(text, [(opening, closing, parse)], final)


def scan_kinds(text: str, kinds: list[Block], final: bool) -> Scan:
    """As `scan_blocks`, with blocks of several kinds (the first opening found decides)."""
    content, calls, at = [], [], 0
    while True:
        found_at = [(text.find(o, at), (o, c, p)) for o, c, p in kinds]
        found_at = [(i, k) for i, k in found_at if i >= 0]
        if not found_at:
            break
        i, (opening, closing, parse) = min(found_at, key=lambda x: x[0])
        j = text.find(closing, i + len(opening))
        if j < 0:
            if not final:
                content.append(text[at:i])
                return Scan("".join(content), calls)
            found = parse(text[i + len(opening):])  # the last call's closing left out before the end
            if found:
                content.append(text[at:i])
                calls += found
                at = len(text)
            break
        found = parse(text[i + len(opening):j])
        content.append(text[at:i] if found else text[at:j + len(closing)])
        calls += found or []
        at = j + len(closing)
    tail = text[at:]
    if not final:
        tail = tail[: len(tail) - max(held_prefix(tail, o) for o, _, _ in kinds)]
    content.append(tail)
    return Scan("".join(content), calls)


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def json_calls(blob: str, tools: Tools, name_keys=("name",), args_keys=("arguments", "parameters")) -> list[Call] | None:
    """Calls in a JSON blob: {"name", "arguments"} or a list of them; None if it is not that, or names
    a function not offered."""
    try:
        obj = json.loads(blob)
    except (json.JSONDecodeError, ValueError):
        return None
    calls = []
    for item in obj if isinstance(obj, list) else [obj]:
        if not isinstance(item, dict):
            return None
        name = next((item[k] for k in name_keys if isinstance(item.get(k), str)), None)
        if name not in tools:
            return None
        args = next((item[k] for k in args_keys if k in item), {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (json.JSONDecodeError, ValueError):
                return None
        if not isinstance(args, dict):
            return None
        calls.append(Call(name, args))
    return calls or None


def json_call_start(tool: dict, name_key: str = "name", args_key: str = "arguments") -> str:
    """The start of `json_call_rule`'s text, up to its arguments (SPACE where the rule has `space`)."""
    return (f"{{{SPACE}{json.dumps(name_key)}{SPACE}:{SPACE}{json.dumps(tool['name'])}{SPACE},{SPACE}"
            f"{json.dumps(args_key)}{SPACE}:{SPACE}")


def json_call_rule(g: Grammar, tool: dict, name_key: str = "name", args_key: str = "arguments") -> str:
    """{"name": <the function>, "arguments": <valid against its parameters>} as one grammar rule."""
    args = g.schema(tool.get("parameters") or {"type": "object"}, f"args-{rule_name(tool['name'])}")
    return (f'"{{" space {literal(json.dumps(name_key))} space ":" space {literal(json.dumps(tool["name"]))} space '
            f'"," space {literal(json.dumps(args_key))} space ":" space {args} "}}" space')
