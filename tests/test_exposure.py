"""Exposing the server: HTTPS from --tls-cert/--tls-key (the `openai` client through it, streamed
and not), --allow-from (403 before anything else, in each API's envelope), X-Forwarded-For believed
only from --trusted-proxies (a spoofed header from any other peer is ignored), and bad input as
one clear line. Real `specdeck serve` processes on the tiny models."""

from __future__ import annotations

import os
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import run_cli
from openai import OpenAI
from support.live import Serve, free_port

from app.server.access import client_address
from app.server.settings import ServeSettings


def nets(*cidrs: str):
    return ServeSettings(trusted_proxies=list(cidrs)).networks("trusted_proxies")


def test_client_address_believes_only_trusted_hops():
    proxies = nets("127.0.0.1", "10.0.0.0/8")
    assert client_address("192.0.2.7", "203.0.113.9", proxies) == "192.0.2.7"  # untrusted peer: header ignored
    assert client_address("127.0.0.1", None, proxies) == "127.0.0.1"
    assert client_address("127.0.0.1", "203.0.113.9", proxies) == "203.0.113.9"
    # a client wrote its own X-Forwarded-For; the proxies appended the real hops to it
    assert client_address("127.0.0.1", "1.2.3.4, 203.0.113.9, 10.0.0.5", proxies) == "203.0.113.9"
    assert client_address("127.0.0.1", "10.0.0.7, 10.0.0.5", proxies) == "10.0.0.7"  # all trusted: the first
    assert client_address("::ffff:127.0.0.1", "203.0.113.9", proxies) == "203.0.113.9"  # IPv4-mapped peer
    assert ServeSettings(allow_from=["10.0.0.0/8,192.168.1.0/24", "::1"]).networks("allow_from")[2].version == 6


def _get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=30, **kw)


def test_allow_from_and_forwarded_for(tiny):
    base = ["--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512"]
    port_a, port_b = free_port(), free_port()
    behind = Serve(*base, "--port", str(port_a), "--allow-from", "10.0.0.0/8,192.0.2.0/24", "--trusted-proxies", "127.0.0.1")
    direct = Serve(*base, "--port", str(port_b), "--allow-from", "10.0.0.0/8")
    try:
        for s in (behind, direct):  # the start-up smoke passed (its own loopback check is let through)
            assert s.wait_line("models loaded"), s.output
        a, b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        r = _get(f"{a}/health")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_source" and "127.0.0.1" in r.json()["error"]["message"]
        r = httpx.post(f"{a}/v1/messages", json={"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 403 and r.json()["type"] == "error"  # Anthropic's envelope
        r = httpx.post(f"{a}/api/generate", content=b"{broken")  # refused before the body is read
        assert r.status_code == 403 and "error" in r.json()
        # behind a trusted proxy (loopback here): the client is the last untrusted hop
        assert _get(f"{a}/health", headers={"X-Forwarded-For": "10.1.2.3"}).status_code == 200
        assert _get(f"{a}/health", headers={"X-Forwarded-For": "192.0.2.50"}).status_code == 200
        assert _get(f"{a}/health", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 403
        assert _get(f"{a}/health", headers={"X-Forwarded-For": "10.1.2.3, 198.51.100.1"}).status_code == 403
        r = httpx.post(f"{a}/v1/completions", json={"prompt": "a b", "max_tokens": 3, "ignore_eos": True},
                       headers={"X-Forwarded-For": "10.9.9.9"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # the same header from a peer that is not a trusted proxy is ignored
        assert _get(f"{b}/health", headers={"X-Forwarded-For": "10.1.2.3"}).status_code == 403
        assert _get(f"{b}/v1/models").status_code == 403
    finally:
        assert behind.stop() == 0 and direct.stop() == 0


def test_https_with_the_openai_client(tiny, certificate):
    cert, key = certificate
    port = free_port()
    s = Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "512", "--port", str(port),
              "--tls-cert", str(cert), "--tls-key", str(key), "--allow-from", "127.0.0.0/8",
              env={"SPECDECK_API_KEY": "k3y", "NOTIFY_SOCKET": ""})
    try:
        assert s.wait_line("models loaded"), s.output
        assert "https://127.0.0.1" in s.output
        client = OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0,
                        http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(cert))))
        r = client.completions.create(model="tiny", prompt="a b c", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5
        chunks = list(client.completions.create(model="tiny", prompt="a b c", max_tokens=5, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets nothing usable
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).raise_for_status()
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused by a verifying client
            httpx.get(f"https://127.0.0.1:{port}/health", timeout=5)
    finally:
        assert s.stop() == 0, s.output


def test_bad_exposure_input_is_one_clear_line(tiny, certificate, tmp_path):
    cert, key = certificate
    other_key = tmp_path / "other.pem"
    subprocess.run(["openssl", "genrsa", "-out", str(other_key), "2048"], check=True, capture_output=True)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    base = ["serve", "--target", str(tiny.target), "--port", str(free_port())]
    cases = [
        (["--allow-from", "10.0.0.0/33"], "bad --allow-from '10.0.0.0/33'"),
        (["--allow-from", "10.0.0.0/8,nowhere"], "bad --allow-from 'nowhere'"),
        (["--trusted-proxies", "1.2.3"], "bad --trusted-proxies '1.2.3'"),
        (["--tls-cert", str(cert)], "--tls-cert and --tls-key go together"),
        (["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(key)], "missing.pem: no such file"),
        (["--tls-cert", str(garbage), "--tls-key", str(key)], "cannot use"),
        (["--tls-cert", str(cert), "--tls-key", str(other_key)], "cannot use"),
    ]
    for flags, words in cases:
        r = run_cli(*base, *flags)
        assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, (flags, r.stderr)
    assert not (Path(os.environ["SPECDECK_HOME"]) / "state" / "revisions").exists()  # refused before a revision
