"""GBNF pieces the formats build their grammars from. JSON values come from llama-cpp-python's port
of llama.cpp's schema converter (`SchemaConverter`), several schemas in one grammar, their rules
shared; what it has no rule for (a literal, text up to a delimiter) is written here."""

from __future__ import annotations

import json
import re

from llama_cpp.llama_grammar import SchemaConverter

from app.errors import SpecdeckError


def literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def until(*delimiters: str) -> str:
    """Any text that contains none of `delimiters` (GBNF has no negative look-ahead: each prefix of a
    delimiter may appear only followed by a character that continues no delimiter there). Delimiters
    may share a start ("\n</parameter>", "\n</function>"): the prefixes form a trie."""
    follow: dict[str, set[str]] = {}  # each proper prefix of a delimiter -> the characters that continue one
    for d in delimiters:
        for i in range(len(d)):
            follow.setdefault(d[:i], set()).add(d[i])
    alts = []
    for prefix, chars in follow.items():
        cls = "[^" + "".join(_class_char(c) for c in sorted(chars)) + "]"
        alts.append(f"{literal(prefix)} {cls}" if prefix else cls)
    return "(" + " | ".join(alts) + ")*"


def _class_char(ch: str) -> str:
    return {"\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, ch)


class Grammar:
    """One grammar built from named rules and JSON schemas (rules of the schemas are shared)."""

    def __init__(self) -> None:
        self._conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._n = 0

    def schema(self, schema: dict | None, hint: str = "value") -> str:
        """The rule for a JSON value valid against `schema` (any JSON value for an empty one)."""
        self._n += 1
        name = f"{re.sub(r'[^a-zA-Z0-9-]+', '-', hint)}-{self._n}"
        try:
            resolved = self._conv.resolve_refs(schema if isinstance(schema, dict) else {}, "tool")
            return self._conv.visit(resolved, name)
        except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions for what it does not support
            raise SpecdeckError(f"cannot turn this JSON schema into a grammar: {e}") from None

    def rule(self, name: str, body: str) -> str:
        return self._conv._add_rule(name, body)  # the converter's own naming (deduplicated)

    def text(self, root: str) -> str:
        self._conv._rules["root"] = root
        return self._conv.format_grammar()
