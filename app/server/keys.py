"""API keys: several named keys in one file (one per client), reloaded on SIGHUP, each with
optional per-minute limits; and the ASGI gate that checks them.

The key file, one key per line (`#` starts a comment):

    # name      key                              limits (optional)
    alice       sk-alice-4b1c0e9f2d7a            requests_per_minute=60 generated_tokens_per_minute=20000
    ci-bot      sk-ci-7e2d55aa10c3

A file holding one bare key (the older format) is that key, named `default`. SPECDECK_API_KEY is
one more key, named `env`. Names are what the access log and the metrics show; a key itself is
never logged or printed, not even in an error about its own line.

Rotation: add the new key, `kill -HUP` the server (or `systemctl reload specdeck`), move the
client, remove the old key, HUP again. The new set replaces the old in one assignment, so a
request is checked against the old set or the new, never a mix; a file that does not parse leaves
the old set serving and says why in one line.

Limits are sliding windows of 60 s per key name: a request is refused with 429 and `Retry-After`
while the key made `requests_per_minute` requests in the last minute, or while the tokens it was
generated in the last minute reach `generated_tokens_per_minute` (the request that crosses the
limit finishes; the next waits).
"""

from __future__ import annotations

import collections
import hmac
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import SpecdeckError
from app.server.audit import current_usage
from app.server.errors import ApiError, send_error

log = logging.getLogger("specdeck.server")

WINDOW = 60.0  # seconds: limits are per minute
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
LIMITS = ("requests_per_minute", "generated_tokens_per_minute")
SELF_NAME = "specdeck"  # the server's own smoke request and watchdog check
OPEN_PATHS = ("/health", "/health/live", "/health/ready", "/", "/ui", "/ui/monitor")  # answered without a key (balancers and probes; `/` says only that it runs,
# or is the chat page, which asks for a key before it calls the API)
OPEN_PREFIXES = ("/ui/static/",)  # the page's own files


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str = field(repr=False)
    requests_per_minute: int | None = None
    generated_tokens_per_minute: int | None = None


@dataclass(frozen=True)
class KeyRing:
    keys: tuple[ApiKey, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.keys)

    def match(self, token: str) -> ApiKey | None:
        """The key `token` is, compared in constant time against every key."""
        found = None
        for key in self.keys:
            if hmac.compare_digest(token.encode(), key.secret.encode()):
                found = key
        return found

    def names(self) -> list[str]:
        return [k.name for k in self.keys]

    def any_secret(self) -> str | None:
        """A key for this machine's own clients of the server (validate, the dashboard)."""
        return self.keys[0].secret if self.keys else None


def parse_keys(text: str, where: str) -> list[ApiKey]:
    """The keys in a key file's text; a malformed line is one SpecdeckError naming `where:line`."""
    lines = [(n, line.split("#", 1)[0].split()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, words) for n, words in lines if words]
    if len(lines) == 1 and len(lines[0][1]) == 1:  # one bare key: the older one-key file
        n, (secret,) = lines[0]
        return [_key(where, n, "default", secret, [])]
    keys = [_key(where, n, words[0], words[1] if len(words) > 1 else "", words[2:]) for n, words in lines]
    _no_repeats(where, lines, keys)
    return keys


def _key(where: str, n: int, name: str, secret: str, options: list[str]) -> ApiKey:
    def bad(why: str) -> SpecdeckError:
        return SpecdeckError(f"{where}:{n}: {why}", hint="each line is `name key [requests_per_minute=N] "
                                                         "[generated_tokens_per_minute=N]`")
    if not secret:
        raise bad("expected a name and a key, found one word (not shown: it may be a key)")
    if not NAME.fullmatch(name):
        raise bad("the name must be letters, digits and . _ @ - (at most 64), starting with a letter or digit")
    limits = {}
    for option in options:
        option_name, _, value = option.partition("=")
        if option_name not in LIMITS:
            raise bad(f"key {name!r}: unknown option {option_name!r} (known: {', '.join(LIMITS)})")
        if not value.isdigit() or int(value) < 1:
            raise bad(f"key {name!r}: {option_name} must be a whole number of at least 1")
        limits[option_name] = int(value)
    return ApiKey(name, secret, **limits)


def _no_repeats(where: str, lines: list, keys: list[ApiKey]) -> None:
    seen_names: dict[str, int] = {}
    seen_secrets: dict[str, str] = {}
    for (n, _), key in zip(lines, keys):
        if key.name in seen_names:
            raise SpecdeckError(f"{where}:{n}: the name {key.name!r} is also on line {seen_names[key.name]}",
                                hint="give each client its own name")
        if key.secret in seen_secrets:
            raise SpecdeckError(f"{where}:{n}: key {key.name!r} is the same key as {seen_secrets[key.secret]!r}",
                                hint="give each client its own key")
        seen_names[key.name], seen_secrets[key.secret] = n, key.name


def read_keys(path: Path | None, env_key: str | None = None) -> KeyRing:
    """The key file's keys, plus SPECDECK_API_KEY (named `env`) when set."""
    keys: list[ApiKey] = []
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SpecdeckError(f"cannot read API key file {path}: {getattr(e, 'strerror', None) or e}") from None
        keys = parse_keys(text, str(path))
        if not keys:
            raise SpecdeckError(f"API key file {path} holds no key", hint="one line per client: `name key`")
    if env_key:
        if any(k.secret == env_key for k in keys):
            raise SpecdeckError("SPECDECK_API_KEY is also a key in the key file", hint="keep each key in one place")
        keys.append(ApiKey("env" if "env" not in {k.name for k in keys} else "env-key", env_key))
    return KeyRing(tuple(keys))


class KeyStore:
    """The keys being served: replaced whole by `reload()` (SIGHUP)."""

    def __init__(self, path: Path | None, env_key: str | None) -> None:
        self.path, self.env_key = path, env_key
        self.ring = read_keys(path, env_key)

    def reload(self) -> str:
        """Read the key file again; a file that does not parse keeps the keys being served."""
        if self.path is None:
            line = "no --api-key-file to reload (SPECDECK_API_KEY is read at start only)"
            log.warning("specdeck: %s", line)
            return line
        try:
            ring = read_keys(self.path, self.env_key)
        except SpecdeckError as e:
            line = f"keys not reloaded, still serving {len(self.ring.keys)}: {e.message}"
            log.error("specdeck: %s", line)
            return line
        self.ring = ring
        line = f"keys reloaded from {self.path}: {', '.join(ring.names()) or 'none'}"
        log.warning("specdeck: %s", line)
        return line


class Windows:
    """Per key name, the times of its requests and of its generated tokens in the last minute."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.tokens: dict[str, collections.deque[tuple[float, int]]] = collections.defaultdict(collections.deque)

    def admit(self, key: ApiKey, now: float | None = None) -> float | None:
        """None if `key` may make a request now (counted), else the seconds until it may."""
        if key.requests_per_minute is None and key.generated_tokens_per_minute is None:
            return None  # nothing to count for a key without limits
        now = time.monotonic() if now is None else now
        with self.lock:
            requests, tokens = self.requests[key.name], self.tokens[key.name]
            while requests and requests[0] <= now - WINDOW:
                requests.popleft()
            while tokens and tokens[0][0] <= now - WINDOW:
                tokens.popleft()
            waits = []
            if key.requests_per_minute is not None and len(requests) >= key.requests_per_minute:
                waits.append(requests[len(requests) - key.requests_per_minute] + WINDOW - now)
            if key.generated_tokens_per_minute is not None:
                used = sum(n for _, n in tokens)
                for t, n in tokens:  # the wait until enough of them leave the window
                    if used < key.generated_tokens_per_minute:
                        break
                    used -= n
                    waits.append(t + WINDOW - now)
            if waits:
                return max(max(waits), 0.001)
            requests.append(now)
            return None

    def charge(self, name: str, generated: int, now: float | None = None) -> None:
        if generated > 0:
            with self.lock:
                self.tokens[name].append((time.monotonic() if now is None else now, generated))


def bearer(headers: dict) -> str:
    """The key a request carries: `Authorization: Bearer` (OpenAI, Ollama) or `x-api-key` (Anthropic)."""
    given = headers.get(b"authorization", b"").decode("latin-1")
    if given.lower().startswith("bearer "):
        return given[7:].strip()
    return headers.get(b"x-api-key", b"").decode("latin-1").strip()


class KeyGate:
    """Pure ASGI middleware: 401 without a valid key, 429 with Retry-After past the key's limits.
    Puts the key's name in scope["state"]["key_name"] for the access log."""

    def __init__(self, app, store: KeyStore, windows: Windows) -> None:
        self.app, self.store, self.windows = app, store, windows

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        headers = dict(scope.get("headers") or [])
        if state.get("self"):  # set by SourceAllowlist: the server's own request, from loopback
            state["key_name"] = SELF_NAME
            return await self.app(scope, receive, send)
        ring = self.store.ring  # one read: a reload mid-request does not change this request's answer
        path = scope.get("path") or ""
        if not ring or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        key = ring.match(bearer(headers))
        if key is None:
            return await send_error(send, scope.get("path", ""), ApiError(401, "invalid or missing API key", "authentication_error",
                                                      code="invalid_api_key"))
        state["key_name"] = key.name
        wait = self.windows.admit(key)
        if wait is not None:
            state["limited"] = True
            seconds = max(1, math.ceil(wait))
            return await send_error(send, scope.get("path", ""), ApiError(
                429, f"key {key.name!r} is over its limit; retry in {seconds} s", "rate_limit_error",
                code="rate_limit_exceeded", headers={"Retry-After": str(seconds)}))
        usage = current_usage.get()
        if usage is not None:
            usage.key = key.name
            if key.generated_tokens_per_minute is not None:
                usage.on_generated = lambda n, name=key.name: self.windows.charge(name, n)
        return await self.app(scope, receive, send)
