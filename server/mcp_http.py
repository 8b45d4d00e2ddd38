"""MCP's streamable HTTP transport on ``/mcp`` (specification revision 2025-06-18), in front of ``server/mcp.py``.

Why: the official MCP SDKs (and every harness built on them: desktop apps, IDE agents, fastmcp) speak this
transport, not the bare JSON-RPC POST of ``McpRoute``. Their ``initialize`` expects an ``Mcp-Session-Id`` header
back and then sends it on every request instead of any ``session_id`` parameter. Here one MCP session is one
MechSandbox session: ``initialize`` opens it through the very path ``openenv/session/create`` takes (the session
cap, the per-client quota, the client binding, the reapers), the header then names it for ``tools/call``, and
``DELETE /mcp`` closes it as ``openenv/session/close`` does.

Which requests are this transport's: the specification obliges a streamable HTTP client to list
``text/event-stream`` in the ``Accept`` of its POSTs, and to send the session header once it has one. An
``initialize`` without either (curl, OpenEnv's ``MCPToolClient``, ``integrations/mcp_client.py``) is answered as
before, without a session, so the plain JSON-RPC POST keeps its meaning (sessions by ``openenv/session/create``
and ``params.session_id``).

Answers are ``application/json`` unless the client's ``Accept`` lists only ``text/event-stream``: then the one
response comes as a server-sent event. The server never sends requests of its own, so ``GET /mcp`` (a stream for
them) answers 405, as the specification allows. A session header that is unknown, closed (reaped after
``unreset_timeout_s`` or ``idle_timeout_s``) or another client's is answered 404 alike (the specification's
signal to open a new session), so an id that leaked is of no use to another client.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .. import BENCHMARK_VERSION
from .mcp import INVALID_REQUEST, RpcResponse, rpc_error, rpc_result

if TYPE_CHECKING:
    from .mcp import McpRoute

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")  # the revisions whose messages this route answers, newest first
JSON_TYPES = {"application/json", "application/*", "*/*"}
EVENTS = "text/event-stream"
INSTRUCTIONS = (
    "A mechanistic-interpretability task on a small PyTorch model with a planted mechanism. Call start_episode to get "
    "the task, probe the model with run_python (each call spends a step), then submit_answer once; describe_task "
    "shows the task and the steps left, for free."
)


def negotiate(requested: Any) -> str:
    """The client's revision when this server speaks it, else the newest it does (the client then decides)."""
    return requested if isinstance(requested, str) and requested in VERSIONS else VERSIONS[0]


def accepted(request: Request) -> set[str]:
    """The media types the request's ``Accept`` lists (parameters dropped; ``q=0``, a refusal, left out)."""
    types = set()
    for item in request.headers.get("accept", "").split(","):
        kind, *params = (part.strip().lower() for part in item.split(";"))
        if kind and not any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params):
            types.add(kind)
    return types


def is_streamable(request: Request) -> bool:
    """The client speaks the streamable HTTP transport (the module docstring says how that is told)."""
    return EVENTS in accepted(request)


def wants_events(request: Request) -> bool:
    """Answer with a server-sent event: the client accepts that and not JSON."""
    types = accepted(request)
    return EVENTS in types and not types & JSON_TYPES


def as_event(response: Response) -> Response:
    """One JSON-RPC answer as one ``message`` event (``RpcResponse``'s JSON is one ASCII line, so one data line)."""
    headers = {"cache-control": "no-cache"}
    if SESSION_HEADER in response.headers:
        headers[SESSION_HEADER] = response.headers[SESSION_HEADER]
    return Response(b"event: message\ndata: " + response.body + b"\n\n", status_code=response.status_code,
                    media_type=EVENTS, headers=headers)  # fmt: skip


def with_status(response: Response, status: int) -> Response:
    response.status_code = status
    return response


class StreamableHttp:
    """The transport around ``McpRoute``: the session header, version negotiation, events, ``DELETE`` and ``GET``."""

    def __init__(self, route: McpRoute):
        self.route = route

    def register(self, app: FastAPI) -> None:
        closes = "Close the MCP session that the Mcp-Session-Id header names (streamable HTTP)"
        app.add_api_route("/mcp", self.delete, methods=["DELETE"], tags=["MCP"], summary=closes)
        no_stream = "405: the server sends no requests of its own, so it offers no event stream"
        app.add_api_route("/mcp", self.get, methods=["GET"], tags=["MCP"], summary=no_stream)

    async def post(self, request: Request) -> Response:
        session = request.headers.get(SESSION_HEADER)
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in VERSIONS:
            message = f"unsupported MCP-Protocol-Version {version[:20]!r}; this server speaks {', '.join(VERSIONS)}"
            return with_status(rpc_error(None, INVALID_REQUEST, message), 400)
        if session is not None and self.route.owned(session) is None:
            return self.gone(session)
        reply = await self.route.handle(request, session)
        if isinstance(reply, RpcResponse) and wants_events(request):
            return as_event(reply)
        return reply

    def gone(self, session: str) -> Response:
        """The one answer to a session header that is unknown, closed or another client's."""
        message = f"unknown or closed Mcp-Session-Id {session[:12]!r}: send initialize again for a new session"
        return with_status(rpc_error(None, INVALID_REQUEST, message), 404)

    async def initialize(self, request: Request, rid: Any, params: dict[str, Any], session: str | None) -> Response:
        """``initialize``: a streamable HTTP client's opens its MechSandbox session; a plain POST's opens none."""
        result = {
            "protocolVersion": negotiate(params.get("protocolVersion")),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mechsandbox", "version": BENCHMARK_VERSION},
            "instructions": INSTRUCTIONS,
        }
        if session is not None:
            return rpc_error(rid, INVALID_REQUEST, "this MCP session is initialized already; initialize without the "
                             "Mcp-Session-Id header opens another")  # fmt: skip
        if not is_streamable(request):
            return rpc_result(rid, result)
        opened, reply = await self.session_call(request, rid, "openenv/session/create", {})
        if opened is None:  # refused (the session cap, the client's quota, an environment that failed to build)
            return reply
        response = rpc_result(rid, result)
        response.headers[SESSION_HEADER] = opened["session_id"]
        return response

    async def delete(self, request: Request) -> Response:
        session = request.headers.get(SESSION_HEADER)
        if not session:
            return JSONResponse({"detail": "DELETE /mcp closes an MCP session: send its Mcp-Session-Id header"}, 400)
        if self.route.owned(session) is None:
            return self.gone(session)
        closed, reply = await self.session_call(request, "close", "openenv/session/close", {"session_id": session})
        return Response(status_code=204) if closed is not None else with_status(reply, 409)

    async def get(self) -> Response:
        return JSONResponse({"detail": "no event stream here: this server sends no requests of its own; POST /mcp"},
                            status_code=405, headers={"allow": "POST, DELETE"})  # fmt: skip

    async def session_call(
        self, request: Request, rid: Any, method: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, Response]:
        """OpenEnv's session ``method`` through ``McpRoute.session_method``, as if the client had posted it (so an MCP
        session is made and closed exactly as ``openenv/session/create`` / ``close`` make and close one): its
        result (None when refused) and its JSON-RPC answer."""
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        body = json.dumps(message).encode()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        reply = await self.route.session_method(Request(request.scope, receive), message, params)
        result = json.loads(reply.body).get("result")
        return (result if isinstance(result, dict) else None), reply
