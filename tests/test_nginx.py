"""deploy/nginx/ on a real nginx (Debian's, fetched by scripts/nginx.sh) on loopback, in front of real
`specdeck serve` processes on the tiny models:

- specdeck.conf: HTTPS with a self-signed certificate, the `openai` client through it streamed and
  not, the key passed through; each streamed event passed on as it comes (a stand-in backend holds
  the rest of its stream until the client has seen the first event);
- specdeck-upstream.conf: two instances, requests spread over both, one client kept on one instance
  (its second request hits the prompt cache), and after one instance is killed mid-run every
  following request succeeds through the other.

The shipped files are used as they are but for their ports and certificate paths, each replaced
exactly where the file has it (a change to those lines fails the test rather than going unseen).
"""

from __future__ import annotations

import http.server
import os
import re
import ssl
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from support.live import ROOT, Serve, free_port, wait_for

RECIPES = ROOT / "deploy" / "nginx"
KEYS = {"alice": "sk-alice-5f1e0c2b", "bob": "sk-bob-9a3d7e41"}


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "nginx.sh")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"no nginx (scripts/nginx.sh): {r.stderr.strip() or r.stdout.strip()}"
    return r.stdout.strip().splitlines()[-1]


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the recipe should hold {old!r} once"
    return text.replace(old, new)


def site(name: str, port: int, cert: Path, key: Path, upstreams: list[int]) -> str:
    """The shipped recipe with this test's listen address, certificate and upstream ports."""
    text = (RECIPES / name).read_text()
    text = replace_once(text, "listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
    text = replace_once(text, "/etc/ssl/specdeck/fullchain.pem", str(cert))
    text = replace_once(text, "/etc/ssl/specdeck/privkey.pem", str(key))
    shipped = re.findall(r"server 127\.0\.0\.1:(80\d\d)", text)
    assert len(shipped) == len(upstreams), shipped
    for old, new in zip(shipped, upstreams):
        text = replace_once(text, f"server 127.0.0.1:{old}", f"server 127.0.0.1:{new}")
    return text


class Nginx:
    """nginx in the foreground with the recipe included in a minimal http {} of its own."""

    def __init__(self, binary: str, site_text: str, root: Path, port: int) -> None:
        self.root, self.port = root, port
        root.mkdir(parents=True, exist_ok=True)
        (root / "site.conf").write_text(site_text)
        temp = " ".join(f"{k}_temp_path {root / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (root / "nginx.conf").write_text(
            ("user root;\n" if os.geteuid() == 0 else "")  # workers read the test's files under /tmp/pytest-of-root
            + f"worker_processes 1;\ndaemon off;\npid {root / 'nginx.pid'};\nerror_log {root / 'error.log'} notice;\n"
              f"events {{ worker_connections 256; }}\n"
              f"http {{\n  access_log {root / 'access.log'};\n  {temp}\n  include {root / 'site.conf'};\n}}\n")
        args = [binary, "-p", str(root), "-c", str(root / "nginx.conf")]
        check = subprocess.run([*args, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"nginx -t refused the recipe:\n{check.stderr}"
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(self._listening, 10), self.errors()

    def _listening(self) -> bool:
        try:
            httpx.get(f"https://127.0.0.1:{self.port}/", verify=False, timeout=1)
            return True
        except httpx.HTTPError:
            return self.p.poll() is not None

    def errors(self) -> str:
        path = self.root / "error.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def client(port: int, cert: Path, key: str = "none", **headers) -> OpenAI:
    return OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60,
                  default_headers=headers or None,
                  http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(cert))))


def tiny_serve(tiny, port: int, *more: str, env: dict | None = None) -> Serve:
    return Serve("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "1024", "--port", str(port),
                 "--trusted-proxies", "127.0.0.1", *more, env={"NOTIFY_SOCKET": "", **(env or {})})


def test_https_in_front_with_the_openai_client(tiny, certificate, nginx_binary, tmp_path):
    cert, key = certificate
    backend, front = free_port(), free_port()
    s = tiny_serve(tiny, backend, env={"SPECDECK_API_KEY": KEYS["alice"]})
    proxy = None
    try:
        assert s.wait_line("models loaded"), s.output
        proxy = Nginx(nginx_binary, site("specdeck.conf", front, cert, key, [backend]), tmp_path / "nginx", front)
        api = client(front, cert, KEYS["alice"])
        whole = api.completions.create(model="tiny", prompt="a b c", max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
        assert whole.usage.completion_tokens == 6
        streamed = list(api.completions.create(model="tiny", prompt="a b c", max_tokens=6, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text
        # the key went through nginx untouched: a wrong one is specdeck's own 401
        with pytest.raises(Exception) as e:
            client(front, cert, "sk-wrong").completions.create(model="tiny", prompt="a", max_tokens=1)
        assert getattr(e.value, "status_code", None) == 401, e.value
        health = httpx.get(f"https://127.0.0.1:{front}/health", verify=ssl.create_default_context(cafile=str(cert))).json()
        assert health["status"] == "ok" and health["ready"] is True and health["slots_free"] >= 1
    finally:
        if proxy is not None:
            proxy.stop()
        assert s.stop() == 0, s.output


class HeldStream:
    """A stand-in backend whose event stream sends one event, then holds the rest until the client
    has seen that one (or 10 s pass): through a buffering proxy the first event never arrives alone."""

    def __init__(self) -> None:
        self.seen, self.released = threading.Event(), None
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"data: first\n\n")
                self.wfile.flush()
                outer.released = outer.seen.wait(10)
                self.wfile.write(b"data: second\n\n")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def read_through(self, url: str, cert: Path) -> list[str]:
        events = []
        with httpx.stream("POST", url, json={}, verify=ssl.create_default_context(cafile=str(cert)), timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    self.seen.set()
        self.server.shutdown()
        return events


def test_the_proxy_passes_each_event_as_it_comes(certificate, nginx_binary, tmp_path):
    cert, key = certificate
    backend, front = HeldStream(), free_port()
    proxy = Nginx(nginx_binary, site("specdeck.conf", front, cert, key, [backend.port]), tmp_path / "nginx", front)
    try:
        assert backend.read_through(f"https://127.0.0.1:{front}/v1/completions", cert) == ["first", "second"]
        assert backend.released is True, "the first event reached the client only with the rest: nginx buffered it"
    finally:
        proxy.stop()


def completions_served(port: int) -> int:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {KEYS['alice']}"}).text
    m = re.search(r'specdeck_requests_total\{model="[^"]+",route="/v1/completions",status="200"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def test_two_instances_behind_nginx(tiny, certificate, nginx_binary, tmp_path):
    cert, key = certificate
    keys = tmp_path / "keys"
    keys.write_text("".join(f"{name} {secret}\n" for name, secret in KEYS.items()))
    ports, front = [free_port(), free_port()], free_port()
    instances = [tiny_serve(tiny, p, "--api-key-file", str(keys), "--parallel", "1") for p in ports]
    proxy = None
    try:
        for s in instances:
            assert s.wait_line("models loaded"), s.output
        proxy = Nginx(nginx_binary, site("specdeck-upstream.conf", front, cert, key, ports), tmp_path / "nginx", front)

        def where(fn) -> list[int]:
            """How many completions each instance served while `fn` ran."""
            before = [completions_served(p) for p in ports]
            fn()
            return [completions_served(p) - b for p, b in zip(ports, before)]

        # spread: sixteen sessions land on both instances
        def sessions():
            for i in range(16):
                client(front, cert, KEYS["alice"], **{"X-Session-Id": f"session-{i}"}).completions.create(
                    model="tiny", prompt=f"session {i}", max_tokens=1)
        spread = where(sessions)
        assert sum(spread) == 16 and min(spread) >= 1, spread

        # affinity: one session's requests reach one instance, and its second request hits the cache
        prompt = " ".join(f"word{i}" for i in range(120))
        sticky = client(front, cert, KEYS["alice"], **{"X-Session-Id": "agent-7"})
        got = []
        moved = where(lambda: got.extend(sticky.completions.create(model="tiny", prompt=prompt, max_tokens=2)
                                         for _ in range(2)))
        assert sorted(moved) == [0, 2], moved
        assert got[0].usage.prompt_tokens_details.cached_tokens < 10, got[0].usage  # new to its instance
        assert got[1].usage.prompt_tokens_details.cached_tokens >= got[1].usage.prompt_tokens - 4, got[1].usage
        # no session header: the API key keeps a client on one instance
        for name in KEYS:
            moved = where(lambda n=name: [client(front, cert, KEYS[n]).completions.create(
                model="tiny", prompt="a", max_tokens=1) for _ in range(3)])
            assert sorted(moved) == [0, 3], (name, moved)

        # one instance killed mid-run: every request after it succeeds through the other
        results, stop = [], threading.Event()

        def load(worker: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                c = client(front, cert, KEYS["alice"], **{"X-Session-Id": f"load-{worker}-{n}"})
                try:
                    r = c.completions.create(model="tiny", prompt=f"load {worker} {n}", max_tokens=4,
                                             extra_body={"ignore_eos": True})
                    results.append((time.monotonic(), r.usage.completion_tokens == 4))
                except Exception as e:  # noqa: BLE001 - counted as a failure
                    results.append((time.monotonic(), repr(e)))
        workers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(2)]
        for w in workers:
            w.start()
        assert wait_for(lambda: len(results) >= 6, 60), results
        instances[0].p.kill()
        killed = time.monotonic()
        assert wait_for(lambda: sum(1 for t, _ in results if t > killed + 0.5) >= 12, 120), results
        stop.set()
        for w in workers:
            w.join(60)
        after = [ok for t, ok in results if t > killed + 0.5]  # past the requests in flight at the kill
        assert after and all(ok is True for ok in after), [ok for ok in after if ok is not True]
        assert all(ok is True for _, ok in results), [ok for _, ok in results if ok is not True]  # in flight too
    finally:
        if proxy is not None:
            proxy.stop()
        for s in instances:
            s.stop()
