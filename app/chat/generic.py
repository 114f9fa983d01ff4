"""The generic JSON format, for a template with no tool support of its own (Gemma 2 and 3, Phi-3.5):
the tools and the answer's shape are written into the system message (`render_tools`), and the
model answers with one JSON object,

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}
    {"response": "the answer to the user"}

The calls of the history are written as that JSON, tool results as user messages, and messages of
one role in a row merged (Gemma's templates accept only user and assistant turns in turn). A
`response` streams as content as it comes; an answer in any other shape is content as it stands."""

from __future__ import annotations

import json
import re

from app.chat.format import SPACE, Scan, ToolFormat, Tools, json_call_rule, json_call_start, json_calls, rule_name
from app.chat.gbnf import Grammar

_FENCED = re.compile(r"\A\s*```(?:json)?\s*(.*?)\s*```\s*\Z", re.S)
_RESPONSE = re.compile(r'\A\s*(?:```(?:json)?\s*)?\{\s*"response"\s*:\s*"')
_PARTIAL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\(?:u[0-9a-fA-F]{0,3})?)\Z")
_HIGH_SURROGATE = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}\Z")

INSTRUCTIONS = """You can call these tools (each with the JSON schema of its arguments):

{tools}

Answer with one JSON object and nothing else:
- to call a tool: {{"tool_call": {{"name": "<the tool's name>", "arguments": {{<its arguments>}}}}}}
- to call several tools at once: {{"tool_calls": [{{"name": ..., "arguments": {{...}}}}, ...]}}
- to answer the user: {{"response": "<your answer>"}}
A tool's result comes back as {{"tool_response": {{"name": ..., "content": ...}}}}."""


def _response_text(text: str, start: int, final: bool) -> str:
    """The JSON string that opens at `start` (its opening quote read), decoded as far as it goes.
    Partial: an escape not yet whole (or half a surrogate pair) is held back."""
    at, end = start, len(text)
    while at < len(text):
        if text[at] == "\\":
            at += 2
        elif text[at] == '"':
            end = at
            break
        else:
            at += 1
    raw = text[start:end]
    if end == len(text):  # not closed (yet)
        raw = raw[: len(raw) - len(m.group(1))] if (m := _PARTIAL_ESCAPE.search(raw)) else raw
        if not final and (m := _HIGH_SURROGATE.search(raw)):
            raw = raw[: len(raw) - 6]
    try:
        return json.loads('"' + raw + '"', strict=False)
    except ValueError:
        return raw


def _text(content) -> str:
    """A message's content as text (the text parts of a list of parts)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _merged(a, b):
    """Two contents of one role's messages in a row, as one."""
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n\n{b}" if a and b else a or b
    parts = lambda c: c if isinstance(c, list) else ([{"type": "text", "text": c}] if c else [])  # noqa: E731
    return parts(a) + [{"type": "text", "text": "\n\n"}] + parts(b)


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value


class Generic(ToolFormat):
    name = "generic"
    label = 'generic JSON ({"tool_call": ...} or {"response": ...})'
    opening = '{"tool_call'
    native = False
    whole_answer = True

    def __init__(self, system_role: bool = True) -> None:
        self.system_role = system_role  # the template takes a system message (else: into the first user one)

    def scan(self, text: str, tools: Tools, final: bool) -> Scan:
        if m := _RESPONSE.match(text):
            return Scan(_response_text(text, m.end(), final))
        lead = text.lstrip()
        if not final:
            if not lead or lead.startswith("{") or lead.startswith("```") or "```".startswith(lead):
                return Scan("")  # may still be a call or a response
            return Scan(text)
        fenced = _FENCED.match(text)
        try:
            obj = json.loads(fenced.group(1) if fenced else text)
        except ValueError:
            return Scan(text)
        if isinstance(obj, dict) and len(obj) == 1:
            if isinstance(obj.get("tool_call"), dict) and (calls := json_calls(json.dumps(obj["tool_call"]), tools)):
                return Scan("", calls)
            if isinstance(obj.get("tool_calls"), list) and (calls := json_calls(json.dumps(obj["tool_calls"]), tools)):
                return Scan("", calls)
            if "response" in obj:
                response = obj["response"]
                return Scan(response if isinstance(response, str) else json.dumps(response, ensure_ascii=False))
        return Scan(text)

    def after_opening(self, opening: str, tools: list[dict], parallel: bool) -> list[str]:
        """`{"tool_call` is no special token: a token may complete it and go on (`_calls` where calls
        are not parallel, `_call_id`)."""
        one = [f'"{SPACE}:{SPACE}' + json_call_start(t) for t in tools]
        several = [f's"{SPACE}:{SPACE}[{SPACE}' + json_call_start(t) for t in tools] if parallel else []
        return one + several

    def call_rule(self, g: Grammar, tool: dict) -> str:
        return self._tool_call(self._call(g, tool))

    @staticmethod
    def _tool_call(call: str) -> str:
        return f'"{{" space "\\"tool_call\\"" space ":" space {call} "}}" space'

    def _call(self, g: Grammar, tool: dict) -> str:
        return g.rule("json-" + rule_name(tool["name"]), json_call_rule(g, tool))

    def calls_rule(self, g: Grammar, tools: list[dict], parallel: bool) -> str:
        calls = {t["name"]: self._call(g, t) for t in tools}
        one = g.rule("call", " | ".join(g.rule(f"call-{rule_name(name)}", self._tool_call(call))
                                        for name, call in calls.items()))
        if not parallel:
            return one
        item = g.rule("item", " | ".join(calls.values()))
        several = (f'"{{" space "\\"tool_calls\\"" space ":" space "[" space {item} ("," space {item})* "]" space '
                   '"}" space')
        return g.rule("calls", f"{one} | {g.rule('several', several)}")

    def render_tools(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        functions = [t.get("function", t) for t in tools]
        system = INSTRUCTIONS.format(tools=json.dumps(functions, indent=2, ensure_ascii=False))
        names: dict[str, str] = {}  # call id -> function name, for the results
        out: list[dict] = []
        for i, msg in enumerate(messages):
            role, content = msg.get("role"), msg.get("content")
            if role == "system" and i == 0:
                system = f"{_text(content)}\n\n{system}" if _text(content) else system
                continue
            if role == "assistant":
                calls = []
                for call in msg.get("tool_calls") or []:
                    fn = call.get("function", call)
                    names[call.get("id", "")] = fn.get("name", "")
                    calls.append({"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))})
                if calls:
                    shape = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
                    said = _text(content).strip()
                    content = (said + "\n" if said else "") + json.dumps(shape, ensure_ascii=False)
                elif isinstance(content, str):
                    content = json.dumps({"response": content}, ensure_ascii=False)
                msg = {**{k: v for k, v in msg.items() if k != "tool_calls"}, "content": content}
            elif role == "tool":
                name = msg.get("name") or names.get(msg.get("tool_call_id", ""), "")
                result = {"tool_response": {"name": name, "content": _text(content)}}
                msg = {"role": "user", "content": json.dumps(result, ensure_ascii=False)}
            else:
                msg = {k: v for k, v in msg.items() if k not in ("tool_calls", "tool_call_id")}
            if out and out[-1]["role"] == msg["role"]:
                out[-1] = {**out[-1], "content": _merged(out[-1].get("content"), msg.get("content"))}
            else:
                out.append(msg)
        if self.system_role:
            return [{"role": "system", "content": system}, *out]
        if out and out[0]["role"] == "user":
            return [{**out[0], "content": _merged(system, out[0].get("content"))}, *out[1:]]
        return [{"role": "user", "content": system}, *out]
