"""The start-up smoke request: the server answers /health and generates, through its own HTTP API."""

from __future__ import annotations

from app.errors import SpecdeckError
from app.ops.client import Client

SMOKE_PROMPT = [0, 1, 2]  # ids every vocabulary has


def smoke_request(url: str, api_key: str | None, headers: dict | None = None, timeout: float = 300.0,
                  model: str | None = None) -> str:
    """The start-up smoke: /health answers 200 and a short completion comes back (the text itself is
    judged by `validate`'s smoke check: a random-weight test model writes arbitrary bytes).
    Returns a short result; raises SpecdeckError saying what failed."""
    client = Client(url, api_key, timeout, headers, verify=False)  # the server itself, on loopback: its own certificate
    try:
        client.get("/health")
        # token ids, not text: any vocabulary can take them (a text may tokenize to nothing), and the
        # end of text is ignored so that a model that would stop at once still shows it generates
        r = client.post("/v1/completions", {"prompt": SMOKE_PROMPT, "max_tokens": 8, "temperature": 0.0,
                                            "ignore_eos": True, **({"model": model} if model else {})})
        text = (r.get("choices") or [{}])[0].get("text")
        n = (r.get("usage") or {}).get("completion_tokens", 0)
        if text is None or n < 1:
            raise SpecdeckError("the smoke request generated nothing")
        return f"{n} tokens"
    finally:
        client.close()
