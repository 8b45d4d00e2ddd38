"""POST /mcp: MCP's JSON-RPC over plain HTTP (no handshake needed), serving the four episode tools of
``server/tools.py`` for an OpenEnv session's environment.

Why our own route in front of OpenEnv's: OpenEnv 0.10's handler answers ``tools/list`` with "Environment does not
support MCP" unless the environment carries a FastMCP client, and reports every failure (unknown tool, a missing
argument, a tool's own refusal) as -32603 with pydantic's multi-line text. Here the errors follow MCP: a malformed
message is a JSON-RPC error (-32700 parse, -32600 invalid request, -32601 unknown method, -32602 unknown tool,
unknown session or params that are not an object), and a tool that refuses (bad arguments, an episode rule) is a
result with ``isError: true`` and one line of text, which the model sees. OpenEnv's session methods
(``openenv/session/create`` / ``close``) still go to its handler, so sessions, the shared session cap, the
per-client quota and the idle reapers are the WebSocket path's.

A ``tools/call`` names its session (``params.session_id``, or the ``Mcp-Session-Id`` header of MCP's streamable HTTP
transport, ``server/mcp_http.py``): a call without one would run on a throwaway environment outside the session cap,
so it is refused. Calls of one session run one at a time on that session's
executor thread (the sandbox blocks), as OpenEnv runs a WebSocket session's steps.

A session belongs to the client that opened it (``clients.py``: its bearer token when several are configured, else
its address): a ``tools/call`` or an ``openenv/session/close`` from any other client is answered exactly as an
unknown id is, so a leaked or guessed id neither runs code in, submits for nor closes another client's episode, and
the answer does not tell whether the id exists (a red team ran, read, submitted and closed another token's session).
OpenEnv's WebSocket routes name sessions too, and ``SessionGuard`` holds them to the same rule: ``/ws?session_id=``
(which attaches to a session) is refused at the handshake unless the client owns it, and an
``openenv/session/close`` sent over ``WS /mcp`` or as a ``/ws`` "mcp" frame names, by the time OpenEnv reads it, a
session that cannot exist unless the client owns the one it named.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import BaseRoute, Route

from ..protocol import INFRA_CODE, INFRA_RPC_CODE, infra_message, one_line
from . import clients
from .tools import EpisodeTools, ToolError, ToolInfraError, ToolResult

log = logging.getLogger("mechsandbox.server")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
SESSION_METHODS = ("openenv/session/create", "openenv/session/close")
MAX_MESSAGE = 500  # characters of an error message (a forwarded one may echo a client's huge value)
ENVELOPE = {"jsonrpc", "id", "method", "params"}
NO_SESSION = ("params.session_id is required: open one with openenv/session/create (or initialize over MCP's "
              "streamable HTTP transport, whose Mcp-Session-Id header names it)")  # fmt: skip
RESULT_FIELDS = ("task_id", "level", "split", "step", "max_steps", "done", "truncated", "score", "counted", "sealed")

Endpoint = Callable[[Request], Awaitable[Any]]


class RpcResponse(Response):
    """JSON with every non-ASCII character escaped: an id or a message holding a lone surrogate (valid in JSON
    text, not in UTF-8) is echoed as an escape instead of failing the encoder (a red team's HTTP 500)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def rpc_result(request_id: Any, result: dict[str, Any]) -> Response:
    return RpcResponse({"jsonrpc": "2.0", "id": request_id, "result": result})


def rpc_error(request_id: Any, code: int, message: str, data: dict[str, Any] | None = None) -> Response:
    text = one_line(message)
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
    error: dict[str, Any] = {"code": code, "message": text}
    if data:
        error["data"] = data
    return RpcResponse({"jsonrpc": "2.0", "id": request_id, "error": error})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def valid_id(value: Any) -> bool:
    """JSON-RPC ids are strings, integers or null (no floats, booleans or structures)."""
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def tool_result(result: ToolResult | None, error: str | None = None) -> dict[str, Any]:
    """An MCP ``CallToolResult``; ``data`` repeats the text for OpenEnv's ``MCPToolClient.call_tool``."""
    if error is not None:
        return {"content": [{"type": "text", "text": error}], "isError": True, "data": error}
    assert result is not None
    state = {k: result.observation.get(k) for k in RESULT_FIELDS}
    return {"content": [{"type": "text", "text": result.text}], "isError": False, "structuredContent": state,
            "data": result.text}  # fmt: skip


def unknown_session(request_id: Any, session_id: str) -> Response:
    """The one answer for an id that is unknown, closed or another client's."""
    return rpc_error(request_id, INVALID_PARAMS, f"unknown or closed session_id {session_id[:12]!r}")


class McpRoute:
    """Our POST /mcp; ``forward`` is OpenEnv's POST /mcp endpoint, set once OpenEnv's routes exist."""

    def __init__(self, server: Any):
        from .mcp_http import StreamableHttp  # here, not at the top: the transport builds its answers with this module

        self.server = server  # SharedCapServer: its session table and executors
        self.forward: Endpoint | None = None
        self.transport = StreamableHttp(self)

    def capture(self, dropped: list[BaseRoute]) -> None:
        """Keep OpenEnv's POST /mcp (shadowed by ours, so ``drop_shadowed_routes`` took it out) to forward to."""
        for route in dropped:
            if isinstance(route, Route) and route.path == "/mcp" and "POST" in (route.methods or ()):
                self.forward = route.endpoint
        if self.forward is None:
            raise RuntimeError("OpenEnv's POST /mcp route was not found: the session methods would have no handler")

    def register(self, app: FastAPI) -> None:
        app.add_middleware(SessionGuard, route=self)  # inside RequestLimits, which names the client
        @app.post(
            "/mcp",
            tags=["MCP"],
            summary="MCP JSON-RPC over HTTP: tools/list, tools/call (the episode tools) and OpenEnv's session methods",
        )
        async def mcp(request: Request) -> Response:
            return await self.transport.post(request)

        self.transport.register(app)

    async def handle(self, request: Request, session: str | None = None) -> Response:
        """One JSON-RPC message; ``session`` is the MCP session the transport's header named (already checked)."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":  # also keeps browsers' cross-origin "simple requests" out
            return rpc_error(None, INVALID_REQUEST, "invalid request: send it as content-type application/json")
        try:
            message = json.loads(await request.body(), parse_constant=_no_constants)
        except (ValueError, RecursionError):
            return rpc_error(None, PARSE_ERROR, "parse error: the body is not valid JSON")
        valid = isinstance(message, dict) and message.get("jsonrpc") == "2.0"
        if not valid or not isinstance(message.get("method"), str):
            rid = message.get("id") if isinstance(message, dict) and valid_id(message.get("id")) else None
            return rpc_error(rid, INVALID_REQUEST, 'invalid request: send one JSON-RPC 2.0 object with a "method"')
        method, rid = message["method"], message.get("id")
        if not valid_id(rid):
            return rpc_error(None, INVALID_REQUEST, "invalid request: the id must be a string, an integer or null")
        if "id" not in message:  # a notification (e.g. notifications/initialized): nothing to answer
            return Response(status_code=202)
        params = message.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            return rpc_error(rid, INVALID_PARAMS, "params must be an object")
        if method in SESSION_METHODS:
            return await self.session_method(request, message, params)
        if method == "initialize":
            return await self.transport.initialize(request, rid, params, session)
        if method == "ping":
            return rpc_result(rid, {})
        if method == "tools/list":
            return rpc_result(rid, {"tools": EpisodeTools.specs()})
        if method == "tools/call":
            return await self.call(rid, params, session)
        known = ", ".join(("initialize", "ping", "tools/list", "tools/call", *SESSION_METHODS))
        return rpc_error(rid, METHOD_NOT_FOUND, f"method not found: {method!r} (this endpoint answers {known})")

    async def session_method(self, request: Request, message: dict[str, Any], params: dict[str, Any]) -> Response:
        """OpenEnv's session methods, checked here first (its handler answers other shapes with pydantic's
        multi-line report, and a structured session_id crashed it), then forwarded; its errors come back in one
        line."""
        rid = message["id"]
        if set(message) - ENVELOPE:
            extra = sorted(set(message) - ENVELOPE)[0]
            return rpc_error(rid, INVALID_REQUEST, f"invalid request: unexpected member {extra!r}")
        if message["method"] == "openenv/session/close":
            sid = params.get("session_id")
            if not isinstance(sid, str) or not 0 < len(sid) <= 128 or not sid.isprintable():
                return rpc_error(rid, INVALID_PARAMS, "params.session_id must be the id openenv/session/create gave")
            if self.owned(sid) is None:
                return unknown_session(rid, sid)
        assert self.forward is not None
        reply = await self.forward(request)  # Starlette keeps the body it read, for OpenEnv to read again
        error = reply.get("error")
        if isinstance(error, dict):
            # OpenEnv's data tells a full server (active_sessions, max_sessions: worth waiting for) from one that
            # could not build the environment: kept, as small scalars only
            data = error.get("data") if isinstance(error.get("data"), dict) else {}
            kept = {k: v for k, v in data.items() if isinstance(v, int | str) and len(f"{k}{v}") < 200}
            return rpc_error(rid, int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "error")), kept)
        # OpenEnv dumps both members; JSON-RPC wants one of result and error
        return RpcResponse({k: v for k, v in reply.items() if k != "error"})

    def owned(self, session_id: str) -> Any:
        """The session's environment when the current request's client opened it, else None (unknown, closed, or
        another client's: the caller answers all three alike)."""
        env = self.server._sessions.get(session_id)
        if env is None or getattr(env, "client", None) != clients.current():
            return None
        return env

    async def call(self, rid: Any, params: dict[str, Any], session: str | None = None) -> Response:
        name, session_id = params.get("name"), params.get("session_id", session)
        if not isinstance(name, str) or name not in EpisodeTools.MODELS:
            tools = ", ".join(EpisodeTools.MODELS)
            return rpc_error(rid, INVALID_PARAMS, f"unknown tool {name!r}; the tools are {tools}")
        if session is not None and session_id != session:
            return rpc_error(rid, INVALID_PARAMS, "params.session_id and the Mcp-Session-Id header differ; send one")
        if not isinstance(session_id, str) or not session_id:
            return rpc_error(rid, INVALID_PARAMS, NO_SESSION)
        env = self.owned(session_id)
        executor = self.server._session_executors.get(session_id)
        if env is None or executor is None:
            return unknown_session(rid, session_id)
        self.server._update_session_activity(session_id)
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(executor, env.tools.call, name, params.get("arguments"))
        except ToolInfraError as exc:  # the server's failure, not a refusal of the call: named, never a tool result
            return rpc_error(rid, INFRA_RPC_CODE, str(exc), {"code": INFRA_CODE, "side": exc.side})
        except ToolError as exc:
            return rpc_result(rid, tool_result(None, str(exc)))
        except Exception as exc:  # any other fault of the server: an infrastructure error, and the server stays up
            log.exception("tools/call %s failed", name)
            text = infra_message("server", f"{type(exc).__name__} in the server; nothing was counted")
            return rpc_error(rid, INFRA_RPC_CODE, f"{name}: {text}", {"code": INFRA_CODE, "side": "server"})
        # a step for OpenEnv's reapers only once a call ran: refused calls must not keep a never-used session alive
        self.server._update_session_activity(session_id, increment_step=name != "describe_task")
        return rpc_result(rid, tool_result(result))


NOT_YOURS = "unknown-or-closed:"  # what a close of a session the client does not own names instead (no id has a colon)


class SessionGuard:
    """ASGI middleware: OpenEnv's WebSocket routes address only the client's own sessions (the module doc says why).

    A WebSocket attaching with ``/ws?session_id=`` to a session another client opened (or none) is closed before the
    handshake (HTTP 403). A close request over a WebSocket (a ``WS /mcp`` message, or a ``/ws`` frame of type "mcp")
    for a session the client does not own has its ``session_id`` replaced by ``NOT_YOURS`` and its first 12
    characters, which OpenEnv answers as an unknown id: the same answer whether the id existed or not."""

    def __init__(self, app: Any, route: McpRoute):
        self.app, self.route = app, route

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or scope.get("path") not in ("/ws", "/mcp"):
            return await self.app(scope, receive, send)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if any(self.route.owned(sid) is None for sid in query.get("session_id", []) if sid):
            await send({"type": "websocket.close", "code": 1008, "reason": "unknown or closed session_id"})
            return None

        async def receive_checked() -> dict:
            message = await receive()
            if message.get("type") == "websocket.receive" and message.get("text"):
                message["text"] = self.checked_frame(message["text"])
            return message

        return await self.app(scope, receive_checked, send)

    def checked_frame(self, text: str) -> str:
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            return text  # OpenEnv answers it as the malformed message it is
        if not isinstance(frame, dict):
            return text
        rpc = frame.get("data") if frame.get("type") == "mcp" else frame
        if not isinstance(rpc, dict) or rpc.get("method") != "openenv/session/close":
            return text
        params = rpc.get("params")
        sid = params.get("session_id") if isinstance(params, dict) else None
        if not isinstance(sid, str) or not sid or self.route.owned(sid) is not None:
            return text
        params["session_id"] = NOT_YOURS + sid[:12]
        return json.dumps(frame)
