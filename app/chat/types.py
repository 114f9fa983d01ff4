"""Argument values converted to the types a function's JSON schema declares. Formats such as
Qwen3-Coder's XML carry every value as text: `3` for an integer parameter becomes 3, `true` for a
boolean True, a JSON object for an object parameter its parsed value; a string stays a string."""

from __future__ import annotations

import json

NON_STRING = {"integer", "number", "boolean", "object", "array", "null"}


def declared_types(schema: dict | None) -> set[str]:
    """The types a (sub)schema allows: `type` as a string or a list, and the types of anyOf / oneOf."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    out = {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out |= declared_types(sub)
    if "enum" in schema and not out:
        out |= {_json_type(v) for v in schema["enum"]}
    return out


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    return {dict: "object", list: "array"}.get(type(value), "string")


def convert(text: str, schema: dict | None):
    """A value given as text, as the schema's type: parsed as JSON when the schema allows a
    non-string type and the text is JSON of an allowed type; otherwise the text itself."""
    allowed = declared_types(schema)
    if not allowed & NON_STRING:
        return text
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return text
    kind = _json_type(value)
    if kind in allowed or (kind == "integer" and "number" in allowed):
        return value
    if kind == "number" and "integer" in allowed and float(value).is_integer():
        return int(value)
    return text


def parameters(tool: dict) -> dict:
    """A function definition's parameter schemas by name ({} when it declares none)."""
    params = tool.get("parameters") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else {}


def convert_arguments(args: dict, tool: dict | None) -> dict:
    """Every text value of `args` converted by the tool's parameter schemas."""
    props = parameters(tool or {})
    return {k: convert(v, props.get(k)) if isinstance(v, str) else v for k, v in args.items()}
