"""Who may connect: `--allow-from` networks, checked before anything else reads the request, and
the client's address behind a proxy (`X-Forwarded-For`, believed only from `--trusted-proxies`).

The client address is the direct peer, unless that peer is a trusted proxy: then X-Forwarded-For
is read from the right, past every trusted proxy, and the first address that is not one is the
client (a client can write anything into the header, so only what trusted hops appended counts).

The server's own smoke request and watchdog check come from loopback with a random per-process
token (SELF_HEADER): they pass an allowlist that leaves loopback out.
"""

from __future__ import annotations

import hmac
import ipaddress

from app.server.errors import ApiError, send_error

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
SELF_HEADER = "x-specdeck-self"


def _ip(text: str):
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


def _within(addr, networks: list[Network]) -> bool:
    if addr is None:
        return False
    if getattr(addr, "ipv4_mapped", None) is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == n.version and addr in n for n in networks)


def client_address(peer: str | None, forwarded_for: str | None, trusted: list[Network]) -> str | None:
    """The client's address for allowlists and logs (see the module's docstring)."""
    if peer is None or not _within(_ip(peer), trusted) or not forwarded_for:
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _within(_ip(hop), trusted):
            return hop
    return hops[0] if hops else peer


class SourceAllowlist:
    """Pure ASGI middleware: requests whose client address is outside `allow` get 403 at once (the
    body is never read). Sets scope["state"]["client_address"] for the access log, and
    scope["state"]["self"] for the server's own requests (the key gate lets them through)."""

    def __init__(self, app, allow: list[Network], trusted: list[Network], self_token: str = "") -> None:
        self.app, self.allow, self.trusted, self.self_token = app, allow, trusted, self_token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        peer = (scope.get("client") or (None,))[0]
        forwarded = headers.get(b"x-forwarded-for")
        client = client_address(peer, forwarded.decode("latin-1") if forwarded else None, self.trusted)
        state = scope.setdefault("state", {})
        state["client_address"] = client
        state["self"] = self._itself(headers, peer)
        if self.allow and not _within(_ip(client or ""), self.allow) and not state["self"]:
            return await send_error(send, scope.get("path", ""), ApiError(
                403, f"requests from {client} are not allowed here", "permission_error", code="forbidden_source"))
        return await self.app(scope, receive, send)

    def _itself(self, headers: dict, peer: str | None) -> bool:
        """The server's own start-up smoke request and watchdog health check (loopback, with the
        random token only this process knows)."""
        given = headers.get(SELF_HEADER.encode())
        addr = _ip(peer or "")
        return bool(self.self_token) and given is not None and hmac.compare_digest(given, self.self_token.encode()) \
            and addr is not None and addr.is_loopback
