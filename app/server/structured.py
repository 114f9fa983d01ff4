"""Structured output: OpenAI's `response_format`, Ollama's `format` and Anthropic's output_config,
turned into GBNF for llama.cpp's grammar sampler (tool calls: app/chat, in each model's own format). The JSON-schema conversion is llama-cpp-python's
(`json_schema_to_gbnf`, a port of llama.cpp's converter); nothing here parses JSON by hand."""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from app.errors import SpecdeckError


def json_grammar(schema: dict | None) -> str:
    """Any JSON object (no schema), or JSON valid against `schema`."""
    if schema is None:
        return JSON_GBNF
    if not isinstance(schema, dict):
        raise SpecdeckError("the JSON schema must be an object")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions for what it does not support
        raise SpecdeckError(f"cannot turn this JSON schema into a grammar: {e}") from None


def response_format_grammar(kind: str, schema: dict | None) -> str | None:
    """OpenAI's response_format: text (none), json_object, json_schema."""
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(schema)
    if kind == "json_schema":
        if schema is None:
            raise SpecdeckError("response_format json_schema needs json_schema.schema")
        return json_grammar(schema)
    raise SpecdeckError(f"unknown response_format type {kind!r}")
