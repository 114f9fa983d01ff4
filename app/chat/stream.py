"""An answer's text turned into typed deltas as it streams: reasoning text, answer text, and each
tool call (start, argument text, end) once it is whole. Each step re-reads the answer so far with the
format (`ChatSpec`) and sends what is new; text that may still turn out to be markup is held back,
so the deltas of a stream add up to exactly the parsed whole answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.chat.format import Call, Scan
from app.chat.spec import ChatSpec


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str  # JSON text of the arguments (here: all of it, once the call is whole)


@dataclass(frozen=True)
class CallEnd:
    index: int
    call: Call


Delta = TextDelta | ReasoningDelta | CallStart | CallArguments | CallEnd


@dataclass
class Parsed:
    """A whole answer: its reasoning, its content and its tool calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def _distinct(calls: list[Call]) -> list[Call]:
    """The calls without repeats of an earlier one (a small model at temperature 0 may write the same
    call again and again: one is meant)."""
    out: list[Call] = []
    for c in calls:
        if c not in out:
            out.append(c)
    return out


class ChatStream:
    """`push` each piece of text as it comes, `finish` at the end. `tools`: the function definitions
    offered (calls are parsed only with tools); `started`: the prompt opened the reasoning block."""

    def __init__(self, spec: ChatSpec, tools: list[dict] | None = None, started: bool = False) -> None:
        self.spec = spec
        self.tools = {t["name"]: t for t in tools or []}
        self.started = started
        self.text = ""
        self.repeating = False  # the answer wrote a call it had already made: a loop, to be cut short
        self._reasoning = ""
        self._content = ""
        self._calls = 0

    def parse(self, text: str, final: bool) -> Parsed:
        reasoning, rest, thought = "", text, False
        if self.spec.reasoning is not None:
            reasoning, rest = self.spec.reasoning.split(text, self.started, final)
            thought = self.started or bool(reasoning) or rest != text
            if not thought:
                rest = self.spec.reasoning.without_stray_closing(rest, final)
        parse_calls = bool(self.tools) and self.spec.tools is not None
        scan = self.spec.tools.scan(rest, self.tools, final) if parse_calls else Scan(rest)
        content = scan.content.lstrip() if thought else scan.content
        if parse_calls and (not final or scan.calls):
            content = content.rstrip()  # the space before a call (or, streaming, before what may be one)
        calls = _distinct(scan.calls)
        self.repeating = self.repeating or len(calls) < len(scan.calls)
        return Parsed(reasoning, content, calls)

    def push(self, text: str) -> list[Delta]:
        self.text += text
        return self._deltas(self.parse(self.text, final=False)) if text else []

    def finish(self) -> tuple[list[Delta], Parsed]:
        whole = self.parse(self.text, final=True)
        return self._deltas(whole), whole

    def _deltas(self, p: Parsed) -> list[Delta]:
        out: list[Delta] = []
        if len(p.reasoning) > len(self._reasoning) and p.reasoning.startswith(self._reasoning):
            out.append(ReasoningDelta(p.reasoning[len(self._reasoning):]))
            self._reasoning = p.reasoning
        if len(p.content) > len(self._content) and p.content.startswith(self._content):
            out.append(TextDelta(p.content[len(self._content):]))
            self._content = p.content
        for i, call in enumerate(p.calls[self._calls:], start=self._calls):
            out += [CallStart(i, call.name), CallArguments(i, call.arguments_json), CallEnd(i, call)]
        self._calls = max(self._calls, len(p.calls))
        return out
