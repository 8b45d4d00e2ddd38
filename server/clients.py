"""Who is asking: the client a request comes from, for the per-client session quota.

Why: one client could fill the session cap for everyone (63 ``openenv/session/create`` calls, or 64
resets in under two seconds), so no client may hold more than ``client_share`` of the cap. A client
is the bearer token when several are configured (each token is handed to one party), otherwise the
address the request came from, taken from ``X-Forwarded-For`` only when the direct peer is the
configured ``trusted_proxy`` (anyone else could write that header). A direct loopback peer is exempt:
tests, benchmarks and a local trainer open many sessions from one host, and a remote client cannot
appear as loopback without a proxy, which then names the real address.

The ASGI middleware (``limits.RequestLimits``) identifies each request and sets ``CURRENT`` for its
duration; the routes, OpenEnv's session creation and ``Service`` read it there.
"""

from __future__ import annotations

import contextvars
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Client:
    """A quota key (never the token itself) and whether the quota applies to it."""

    key: str
    exempt: bool = False


LOCAL = Client("local", exempt=True)
CURRENT: contextvars.ContextVar[Client] = contextvars.ContextVar("mechsandbox_client", default=LOCAL)


def current() -> Client:
    return CURRENT.get()


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


class ClientIdentifier:
    """Maps an ASGI scope to a ``Client`` (and tells whether its bearer token is accepted)."""

    def __init__(self, tokens: tuple[str, ...], trusted_proxy: str = ""):
        self.tokens = tuple(t.encode() for t in tokens)
        self.proxy = ipaddress.ip_network(trusted_proxy, strict=False) if trusted_proxy else None

    def token_index(self, scope: dict[str, Any]) -> int | None:
        """The index of the request's bearer token among the accepted ones, or None."""
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        if not header.startswith(b"Bearer "):
            return None
        given = header[7:].strip()
        found = None
        for index, token in enumerate(self.tokens):  # compare with every token: no early exit to time
            if hmac.compare_digest(given, token) and found is None:
                found = index
        return found

    def identify(self, scope: dict[str, Any], token_index: int | None) -> Client:
        if len(self.tokens) > 1 and token_index is not None:
            return Client(f"token#{token_index}")
        peer_text = (scope.get("client") or ("", 0))[0] or ""
        peer = _address(peer_text)
        if self.proxy is not None and peer is not None and peer in self.proxy:
            forwarded = dict(scope.get("headers") or []).get(b"x-forwarded-for", b"").decode("latin-1")
            hops = [hop for hop in forwarded.split(",") if hop.strip()]
            origin = _address(hops[-1]) if hops else None  # the proxy appends the address it saw last
            return Client(f"addr:{origin if origin is not None else peer}")
        if peer is None:
            return Client(f"addr:{peer_text or 'unknown'}")
        return Client(f"addr:{peer}", exempt=peer.is_loopback)
