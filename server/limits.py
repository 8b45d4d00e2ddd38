"""ASGI middleware for what every request must respect before any route runs: body size, JSON
nesting depth, (optionally) a bearer token and, without tokens, the browser's ``Origin``; it also names the
request's client (``clients.py``).

Why here: a 10 MB body or a 100 000-deep JSON array must be refused before a JSON parser sees it
(``json.loads`` raises RecursionError on deep nesting, which would otherwise surface as a 500 on
OpenEnv's routes). Bodies are read up to the cap and replayed to the app.

Why the ``Origin`` check: on a server without tokens, any web page a visitor opens could post to it (a text/plain
POST needs no CORS preflight) or open its WebSocket (WebSockets are not subject to CORS at all), and so run episodes,
register runs or fill the session cap from the visitor's browser. Browsers name the page's origin on both; a
state-changing request (any method but GET, HEAD, OPTIONS) or a WebSocket whose ``Origin`` is neither the server's
own (the ``Host`` it was reached at) nor one in ``MECHSANDBOX_ALLOWED_ORIGINS`` is refused with 403. A request
without ``Origin`` is not a browser's cross-site one and passes (curl, SDKs, trainers). With tokens a cross-site
page cannot send the ``Authorization`` header without a preflight the server never grants, so the check is off.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from .clients import CURRENT, ClientIdentifier

MAX_DEPTH = 64
# /health for probes; the playground's page and scripts (no data: every action it takes is a /reset or /step that
# carries the bearer token the user types in).
OPEN_ROUTES = ("/health", "/web")
OPEN_PREFIXES = ("/web/static/",)


def is_open(path: str) -> bool:
    """Served without a bearer token."""
    return path in OPEN_ROUTES or path.startswith(OPEN_PREFIXES)


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
DEFAULT_PORTS = {"http": 80, "https": 443}


def _endpoint(netloc: str, scheme: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host[:port]`` (a ``Host`` header or an origin's), the port defaulting to the
    scheme's; None when it is not one."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname, port or DEFAULT_PORTS.get(scheme, 0)


def normal_origin(text: str) -> str:
    return text.strip().lower().rstrip("/")


class OriginCheck:
    """Whether a request's ``Origin`` may change state here (the module docstring says why)."""

    def __init__(self, allowed: tuple[str, ...] = ()):
        self.allowed = frozenset(normal_origin(origin) for origin in allowed)

    def refusal(self, scope: dict[str, Any]) -> str | None:
        """None when the request may go on, else the one-line reason."""
        if scope["type"] == "http" and scope.get("method", "GET") in SAFE_METHODS:
            return None
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"origin")
        if given is None:
            return None
        origin = normal_origin(given.decode("latin-1"))
        if origin in self.allowed:
            return None
        scheme, sep, netloc = origin.partition("://")
        own = _endpoint(headers.get(b"host", b"").decode("latin-1").strip().lower(), scheme)
        if sep and own is not None and _endpoint(netloc, scheme) == own:
            return None
        return (f"cross-site request refused: Origin {origin[:100]!r} is not this server's own "
                "(MECHSANDBOX_ALLOWED_ORIGINS names others)")  # fmt: skip


def nesting_depth(body: bytes) -> int:
    """Deepest ``[``/``{`` nesting outside JSON strings (a byte scan, no parsing)."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class RequestLimits:
    def __init__(self, app: Any, max_body: int, tokens: tuple[str, ...] = (), trusted_proxy: str = "",
                 allowed_origins: tuple[str, ...] = ()):  # fmt: skip
        self.app, self.max_body = app, max_body
        self.clients = ClientIdentifier(tokens, trusted_proxy)
        self.origins = OriginCheck(allowed_origins)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        token_index = self.clients.token_index(scope)
        path = scope.get("path", "")
        if self.clients.tokens and not is_open(path) and token_index is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
                return None
            message = "missing or wrong bearer token (Authorization: Bearer <token>)"
            return await _reply(send, 401, message, scope["path"])
        refusal = None if self.clients.tokens else self.origins.refusal(scope)
        if refusal is not None:
            if scope["type"] == "websocket":  # closed before the handshake is accepted: the server answers 403
                await send({"type": "websocket.close", "code": 1008, "reason": refusal})
                return None
            return await _reply(send, 403, refusal, path)
        marker = CURRENT.set(self.clients.identify(scope, token_index))
        try:
            await self._limited(scope, receive, send)
        finally:
            CURRENT.reset(marker)

    async def _limited(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return await _reply(send, 413, f"request body larger than {self.max_body} bytes", scope["path"])
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await _reply(send, 413, f"request body larger than {self.max_body} bytes", scope["path"])
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if nesting_depth(body) > MAX_DEPTH:
            return await _reply(send, 422, f"JSON nested deeper than {MAX_DEPTH} levels", scope["path"])
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


JSONRPC_PATHS = ("/mcp",)  # refusals there keep their HTTP status but take JSON-RPC's error form (MCP clients)


async def _reply(send: Any, status: int, message: str, path: str = "") -> None:
    if path in JSONRPC_PATHS:
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}).encode()
    else:
        body = json.dumps({"detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
