"""ASGI middleware that gives an infrastructure failure its own code on the WebSocket.

Why: OpenEnv's ``/ws`` handler answers every exception a reset or step raises with ``code: EXECUTION_ERROR`` and the
exception's text, the code an agent's own mistake gets, so a client could not tell "the server lost my episode" from
"my action was wrong" without reading prose. Our environment raises infrastructure failures with a message that names
their side (``protocol.infra_message``); this middleware rewrites such an error frame's code to
``INFRASTRUCTURE_ERROR`` and adds ``side``, which the typed client turns into ``InfrastructureError``. Every other frame
passes untouched; a frame is parsed only when its text holds the prefix, so steps pay a substring test.
"""

from __future__ import annotations

import json
from typing import Any

from ..protocol import INFRA_CODE, INFRA_PREFIX, infra_side

MARK = f'"message":"{INFRA_PREFIX} ('


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


class InfraErrorFrames:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)

        async def send_tagged(message: dict) -> None:
            if message.get("type") == "websocket.send" and isinstance(message.get("text"), str):
                message = {**message, "text": tagged(message["text"])}
            await send(message)

        return await self.app(scope, receive, send_tagged)
