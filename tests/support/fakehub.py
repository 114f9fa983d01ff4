"""A local HTTP server that answers the Hugging Face hub's file endpoints, for download tests.

It speaks the part of the protocol huggingface-hub uses to fetch one file:
  HEAD /{owner}/{repo}/resolve/{revision}/{file}  -> X-Repo-Commit, X-Linked-Etag, X-Linked-Size
  GET  same path, honouring `Range: bytes=N-` and `bytes=N-M` -> 200 or 206 with the bytes
and the hub's error shapes (X-Error-Code: GatedRepo / RepoNotFound / EntryNotFound, 5xx).
Faults are injected per file: drop the connection after N bytes, serve other bytes than the
advertised digest, advertise another size, answer with an HTTP error.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    content: bytes
    advertised_sha: str | None = None  # default: sha256(content)
    advertised_size: int | None = None  # default: len(content)
    served: bytes | None = None  # default: content
    drop_after: int | None = None  # close the connection after this many body bytes, once
    status: int | None = None  # answer every request with this HTTP status
    status_after_drop: int | None = None  # once the connection was dropped, answer with this status

    def sha(self) -> str:
        return self.advertised_sha or hashlib.sha256(self.content).hexdigest()


@dataclass
class FakeHub:
    files: dict[tuple[str, str], HubFile] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, range)
    body_bytes: int = 0  # response body bytes sent, all requests together

    def add(self, repo: str, filename: str, content: bytes, **faults) -> HubFile:
        f = HubFile(content, **faults)
        self.files[(repo, filename)] = f
        return f

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _route(self) -> tuple[str, str] | None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return None
                return f"{parts[0]}/{parts[1]}", "/".join(parts[4:])

            def _error(self, status: int, code: str | None, message: str) -> None:
                body = message.encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Error-Message", message)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self) -> None:
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                route = self._route()
                if route is None:
                    return self._error(404, None, "not found")
                repo, filename = route
                if repo in hub.gated and self.headers.get("Authorization") is None:
                    return self._error(401, "GatedRepo", f"Access to model {repo} is restricted.")
                if not any(r == repo for r, _ in hub.files):
                    return self._error(404, "RepoNotFound", "Repository not found")
                f = hub.files.get((repo, filename))
                if f is None:
                    return self._error(404, "EntryNotFound", "Entry not found")
                if f.status:
                    return self._error(f.status, None, "server error")
                data = f.served if f.served is not None else f.content
                start, stop = 0, len(data)
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    first, _, last = rng[6:].partition("-")
                    start = int(first)
                    stop = min(len(data), int(last) + 1) if last else len(data)
                body = data[start:stop] if self.command != "HEAD" else b""  # content may be a 16 GB mmap
                partial = bool(rng) and (start > 0 or stop < len(data))
                self.send_response(206 if partial else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{f.sha()}"')
                self.send_header("X-Linked-Etag", f'"{f.sha()}"')
                self.send_header("X-Linked-Size", str(f.advertised_size or len(f.content)))
                self.send_header("Accept-Ranges", "bytes")
                if partial:
                    self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
                self.send_header("Content-Length", str(stop - start))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if f.drop_after is not None and f.drop_after < len(body):
                    cut, f.drop_after = f.drop_after, None
                    f.status = f.status_after_drop
                    self.wfile.write(body[:cut])
                    hub.body_bytes += cut
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)
                hub.body_bytes += len(body)

            do_GET = _handle
            do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
