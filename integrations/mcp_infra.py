"""Which errors from POST /mcp are infrastructure failures, for the Inspect task and the TRL environment.

Why a module of its own: both integrations must tell the server's (or the connection's) failure from a refusal of
the agent's call the same way, or one of them would score a lost episode at the floor. The server names such a
failure on /mcp with the JSON-RPC code ``protocol.INFRA_RPC_CODE`` and ``data = {"code": INFRASTRUCTURE_ERROR, "side":
...}``, and its message starts ``infrastructure error (<side>): ``; a server that cannot be reached at all (or
stopped answering) is the connection's side (docs/CONTRACT.md, "Harnesses and infrastructure errors").
"""

from __future__ import annotations

import re

from ..protocol import INFRA_CODE, INFRA_PREFIX, INFRA_RPC_CODE, InfrastructureError, infra_side
from .mcp_client import McpError, ServerUnavailable


def named_side(text: str) -> str | None:
    """The side an infrastructure message names anywhere in ``text`` (an error prefixed by the method's name)."""
    at = text.find(INFRA_PREFIX + " (")
    return None if at < 0 else infra_side(text[at:])


def refused_by_infrastructure(tool: str, text: str) -> str | None:
    """The side, when a tool's error result (``isError``) is the server's failure rather than a refusal of the call:
    its text is ``<tool>: infrastructure error (<side>): ...``. A snippet's own output that mentions one (the notice
    of a worker the server lost, after which the episode goes on) is a result, never an error, and is not read."""
    prefix = f"{tool}: "
    return infra_side(text[len(prefix) :]) if text.startswith(prefix) else None


def infrastructure_error(exc: McpError, started: bool) -> InfrastructureError | None:
    """``exc`` as an ``InfrastructureError`` when it is one (None: a refusal of the call, the agent's to handle).
    ``started``: whether the episode's first observation had been returned (then a test episode is not replayed)."""
    if isinstance(exc, ServerUnavailable):
        return InfrastructureError("connection", str(exc), started=started)
    data = exc.data if isinstance(exc.data, dict) else {}
    side = named_side(str(exc))
    if exc.code == INFRA_RPC_CODE or data.get("code") == INFRA_CODE or side is not None:
        side = str(data.get("side") or side or "server")
        message = re.sub(r" \(code -?\d+\)$", "", str(exc))  # McpError's own suffix
        at = message.find(INFRA_PREFIX + " (")
        return InfrastructureError(side, message[at:] if at >= 0 else message, started=started)
    return None
