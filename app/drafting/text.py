"""Drafts copied from text, no model: prompt lookup (n-grams of the request's own history, llama.cpp's
`ngram-*` modes) and the suffix index over recent requests. Their drafters are
app/engine/drafters/lookup.py and suffix.py; they take no memory the plan counts but the index's
(`--suffix-tokens`, about 125 bytes a token, host memory)."""

from __future__ import annotations

from app.drafting.kind import DrafterKind

LOOKUP = DrafterKind("lookup", "n-grams of the request's own prompt and answer", "nothing")
SUFFIX = DrafterKind("suffix", "the suffix index over recent requests", "nothing")
