"""A stand-in for llama-server in the bench tests: /health, and /completion answering `n_predict`
tokens with `timings` whose accepted drafts count the requests this process answered before (as
an n-gram pool kept across requests would grow). Takes llama-server's flags, uses only --port."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERED = [0]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int(body["n_predict"])
        accepted = min(ANSWERED[0], n - 1)
        ANSWERED[0] += 1
        self._send({"content": "x" * n, "timings": {"predicted_n": n, "predicted_ms": 10.0 * n,
                                                    "draft_n": accepted, "draft_n_accepted": accepted}})


def main() -> None:
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
