"""Errors, and the shape each API answers them in. A route raises `ApiError`; the app's handlers
(and the middlewares that answer before a route runs: the API key, the body limit) turn it into
the envelope of the API the path belongs to: OpenAI's, Anthropic's or Ollama's."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

CLIENT_GONE = 499  # nginx's status for a client that closed the request before the answer
OVERLOADED = "overloaded"  # the code of a 429 the server's load caused (not a key's limit): 529 on Anthropic's API


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None, code: str | None = None, extra: dict | None = None) -> None:
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.headers, self.code, self.extra = headers or {}, code, extra or {}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 529: "overloaded_error"}


def api_of(path: str) -> str:
    """Which API a path belongs to: "anthropic", "ollama" or "openai" (also llama.cpp's own routes)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


def shaped(path: str, e: ApiError) -> dict:
    """The body of `e` in the envelope of the API `path` belongs to."""
    api = api_of(path)
    if api == "anthropic":
        kind = ANTHROPIC_TYPES.get(status_of(path, e), "api_error" if e.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": e.message}}
    if api == "ollama":
        return {"error": e.message}
    body = error_body(e.message, e.type, e.param, e.code)
    body["error"].update(e.extra)
    return body


def status_of(path: str, e: ApiError) -> int:
    """The status `e` is answered with on `path`: a server too busy for the request is 429 elsewhere,
    529 ("overloaded", which Anthropic's clients retry) on Anthropic's API."""
    if e.status == 429 and e.code == OVERLOADED and api_of(path) == "anthropic":
        return 529
    return e.status


def error_response(path: str, e: ApiError) -> JSONResponse:
    return JSONResponse(shaped(path, e), status_of(path, e), headers=e.headers)


def error_bytes(path: str, e: ApiError) -> bytes:
    return json.dumps(shaped(path, e)).encode()


async def send_error(send, path: str, e: ApiError) -> None:
    """Answer `e` from a pure ASGI middleware (before any route runs)."""
    body = error_bytes(path, e)
    extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in e.headers.items()]
    await send({"type": "http.response.start", "status": e.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


def validation_error(e) -> ApiError:
    """pydantic's first complaint about a body as a 400 naming the field (or where the JSON broke)."""
    errors = e.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # loc is ("body", character offset)
        where, why = first.get("loc", ("?",))[-1], first.get("ctx", {}).get("error", first.get("msg"))
        return ApiError(400, f"the body is not valid JSON (character {where}: {why})")
    param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
    return ApiError(400, f"{param or 'body'}: {first.get('msg')}", param=param)
