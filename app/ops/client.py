"""A client of a running server's HTTP API (specdeck's, or llama-server's where the routes are
shared): requests that count every unexpected answer as an error, and waiting for readiness."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx

from app.errors import SpecdeckError

RETRIES_429 = 5


class Client:
    """The server's API with the key, counting every unexpected answer as an error (a 429 is retried
    after its Retry-After, as the SDKs do, and counted apart)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 900.0, headers: dict | None = None,
                 verify: bool = True) -> None:
        self.url = url.rstrip("/")
        headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **(headers or {})}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify)
        self.errors: list[str] = []
        self.refused = 0  # 429s waited out
        self.lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def _fail(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)

    def get(self, path: str, ok: tuple[int, ...] = (200,)) -> dict:
        try:
            r = self.http.get(path)
        except httpx.HTTPError as e:
            self._fail(f"GET {path}: {e}")
            raise SpecdeckError(f"cannot reach {self.url}{path}: {e}") from None
        if r.status_code not in ok:
            self._fail(f"GET {path}: HTTP {r.status_code}")
            raise SpecdeckError(f"GET {path} answered HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def _refused(self, r: httpx.Response, attempt: int) -> bool:
        """A 429 (the queue or the KV pool full) is waited out as the SDKs do: Retry-After, a few times."""
        if r.status_code != 429 or attempt >= RETRIES_429:
            return False
        with self.lock:
            self.refused += 1
        time.sleep(float(r.headers.get("retry-after") or 1))
        return True

    def post(self, path: str, body: dict) -> dict:
        for attempt in range(RETRIES_429 + 1):
            try:
                r = self.http.post(path, json=body)
            except httpx.HTTPError as e:
                self._fail(f"POST {path}: {e}")
                raise SpecdeckError(f"POST {path} failed: {e}") from None
            if not self._refused(r, attempt):
                break
        if r.status_code != 200:
            self._fail(f"POST {path}: HTTP {r.status_code}")
            raise SpecdeckError(f"POST {path} answered HTTP {r.status_code}: {r.text[:200]}")
        r.content.decode("utf-8")  # strict: invalid UTF-8 raises
        return r.json()

    def stream(self, path: str, body: dict) -> Iterator[tuple[float, dict]]:
        """(seconds since the request was sent, event) for each server-sent event."""
        t0 = time.perf_counter()
        try:
            for attempt in range(RETRIES_429 + 1):
                with self.http.stream("POST", path, json={**body, "stream": True}) as r:
                    if r.status_code != 200:
                        r.read()
                        if self._refused(r, attempt):
                            continue
                        self._fail(f"POST {path} (stream): HTTP {r.status_code}")
                        raise SpecdeckError(f"POST {path} (stream) answered HTTP {r.status_code}: {r.text[:200]}")
                    buffer = b""
                    for chunk in r.iter_bytes():
                        buffer += chunk
                        while b"\n\n" in buffer:
                            event, buffer = buffer.split(b"\n\n", 1)
                            for line in event.decode("utf-8").splitlines():  # strict UTF-8
                                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                                    yield time.perf_counter() - t0, json.loads(line[6:])
                    return
        except httpx.HTTPError as e:
            self._fail(f"POST {path} (stream): {e}")
            raise SpecdeckError(f"POST {path} (stream) failed: {e}") from None


def completion(client: Client, prompt: str, n: int, speculative: bool = True, **more) -> dict:
    """llama-server's /completion, greedy, exactly `n` tokens unless `ignore_eos` is turned off;
    drafting only from the request's own text (`cross_request` off): validate sends the same
    prompts again and again, and a draft copied from the last run of the very prompt measured
    would make every speed figure a copy's."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True, "return_tokens": True,
            "speculative": {"enabled": speculative, "cross_request": False}, **more}
    return client.post("/completion", body)


def wait_ready(client: Client, timeout: float, unreachable: float = 5.0, process: subprocess.Popen | None = None) -> float:
    """Seconds until /health answers 200: a server still loading (503) is waited for up to `timeout`,
    one that does not answer at all for `unreachable` seconds (specdeck binds before it loads). With
    the server's `process` (a server started here, which may bind late), silence is waited out up to
    `timeout` too, and the process ending is said at once."""
    t0 = time.monotonic()
    while True:
        if process is not None and process.poll() is not None:
            raise SpecdeckError(f"the server at {client.url} exited with {process.returncode}")
        try:
            r = client.http.get("/health", timeout=10)
            if r.status_code == 200:
                return time.monotonic() - t0
            if r.status_code != 503:
                raise SpecdeckError(f"GET /health answered HTTP {r.status_code}: {r.text[:200]}")
        except httpx.HTTPError as e:
            if process is None and time.monotonic() - t0 > unreachable:
                raise SpecdeckError(f"cannot reach {client.url}: {e}") from None
        if time.monotonic() - t0 > timeout:
            raise SpecdeckError(f"{client.url} is not ready after {timeout:.0f} s")
        time.sleep(0.5)


def wait_until_ready(url: str, process: subprocess.Popen, timeout: float = 300.0) -> float:
    """`wait_ready` for a server process started here (specdeck or llama-server) at `url`."""
    client = Client(url, timeout=10)
    try:
        return wait_ready(client, timeout, process=process)
    finally:
        client.close()
