"""The grammar of a tool call in the model's own format. Forced (`tool_choice` required, a named
function, Anthropic's `any` / `tool`): the answer must be calls, after the reasoning if the format
has one. Lazy (`auto`): free text until the format's opening appears, then valid calls (and free
text again after them, where the format allows text around its calls), as llama.cpp's lazy grammars
do (the trigger is a pattern llama.cpp's grammar sampler searches); where calls are the whole answer
(Llama 3, the generic JSON), only an opening that starts the answer."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.chat.gbnf import Grammar, literal, until
from app.chat.spec import ChatSpec
from app.errors import SpecdeckError


@dataclass(frozen=True)
class CallGrammar:
    gbnf: str
    triggers: tuple[str, ...] = ()  # empty: applies from the first token; else lazy, from the first match


# Lazy: after its calls an answer may go on in free text (not starting with markup, which stays a
# call). A model that wants to say something after a call is not made to write call after call.
AFTER_CALLS = '[ \\t\\n]* ([^< \\t\\n] [^\\x00]*)?'


def call_grammar(spec: ChatSpec, tools: list[dict], forced: bool, parallel: bool = True,
                 started: bool = False) -> CallGrammar:
    """`started`: the prompt opened the reasoning block, so the answer begins inside it."""
    fmt = spec.tools
    if fmt is None or not fmt.opening:
        raise SpecdeckError("tool calls in this template's format are not parsed, so they cannot be forced")
    g = Grammar()
    calls = fmt.calls_rule(g, tools, parallel)
    r = spec.reasoning
    if not forced:
        lead = "^[\\s\\S]*?" + re.escape(r.closing) if started and r is not None else "^"
        gap = "[\\s\\S]*?"
        if fmt.whole_answer:  # the call opens the answer (after the reasoning, if any)
            gap = "\\s*"
            if r is not None and not started:
                lead = "^(?:\\s*" + re.escape(r.opening) + "[\\s\\S]*?" + re.escape(r.closing) + ")?"
        opening = "|".join(fmt.trigger(o, tools, parallel) for o in (fmt.opening, *fmt.openings))
        root = calls if fmt.whole_answer else f"{calls} {g.rule('after-calls', AFTER_CALLS)}"
        return CallGrammar(g.text(root), (lead + gap + "(" + opening + ")[\\s\\S]*$",))
    if r is None:
        return CallGrammar(g.text(f"{calls}"))
    thought = f"{g.rule('thought', until(r.closing))} {literal(r.closing)}"
    head = thought if started else f"({literal(r.opening)} {thought})?"
    # a few blank characters between the reasoning and the call, no more: with no bound a weak model
    # forced to call can fill its whole answer with them (as llama.cpp's grammars bound whitespace)
    return CallGrammar(g.text(f'{head} [ \\t\\n]{{0,4}} {calls}'))
