"""ASGI middleware over OpenEnv's WebSocket: it gives an infrastructure failure its own code, and it tells a connection
its client closed from one that dropped.

Why the code: OpenEnv's ``/ws`` handler answers every exception a reset or step raises with ``code: EXECUTION_ERROR``
and the exception's text, the code an agent's own mistake gets, so a client could not tell "the server lost my
episode" from "my action was wrong" without reading prose. Our environment raises infrastructure failures with a
message that names their side (``protocol.infra_message``); this middleware rewrites such an error frame's code to
``INFRASTRUCTURE_ERROR`` and adds ``side``, which the typed client turns into ``InfrastructureError``. Every other frame
passes untouched; a frame is parsed only when its text holds the prefix, so steps pay a substring test.

Why the close: an episode whose connection drops waits for a resume (``Service.park``), but one whose client said
goodbye (OpenEnv's clients send ``{"type": "close"}`` before they close) ends at once and frees its worker. OpenEnv
tears both down the same way, in the connection's own task, so the middleware records in a context variable of that
task whether the client said goodbye; ``SharedCapServer`` reads it when the session is destroyed. A session destroyed
outside any connection's task (a reaper, an MCP session closed) is not a drop either.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from ..protocol import INFRA_CODE, INFRA_PREFIX, infra_side

MARK = f'"message":"{INFRA_PREFIX} ('
# In a WebSocket connection's task: "open" while it lasts, "closed" once its client sent OpenEnv's close message.
CONNECTION: ContextVar[str | None] = ContextVar("mechsandbox_ws_connection", default=None)


def connection_dropped() -> bool:
    """Whether the code running now tears down a WebSocket connection that ended without its client's goodbye."""
    return CONNECTION.get() == "open"


def says_goodbye(text: str) -> bool:
    """Whether a client's frame is OpenEnv's close message (short; parsed only when it looks like one)."""
    if len(text) > 64 or "close" not in text:
        return False
    try:
        frame = json.loads(text)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") == "close"


def tagged(text: str) -> str:
    """The frame ``text`` with an infrastructure error's code and side, or ``text`` itself."""
    if MARK not in text.replace('": "', '":"'):
        return text
    try:
        frame = json.loads(text)
    except ValueError:
        return text
    data = frame.get("data") if isinstance(frame, dict) and frame.get("type") == "error" else None
    side = infra_side(data.get("message")) if isinstance(data, dict) else None
    if side is None or data.get("code") != "EXECUTION_ERROR":
        return text
    data.update(code=INFRA_CODE, side=side)
    return json.dumps(frame)


class WebSocketFrames:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        CONNECTION.set("open")

        async def receive_noted() -> dict:
            message = await receive()
            if message.get("type") == "websocket.receive" and says_goodbye(message.get("text") or ""):
                CONNECTION.set("closed")
            return message

        async def send_tagged(message: dict) -> None:
            if message.get("type") == "websocket.send" and isinstance(message.get("text"), str):
                message = {**message, "text": tagged(message["text"])}
            await send(message)

        return await self.app(scope, receive_noted, send_tagged)
