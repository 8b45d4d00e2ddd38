"""Floor 1 for bench/e2e.py: a minimal plain-FastAPI server speaking the same wire shapes (echo only)."""

from __future__ import annotations

import json

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

app = FastAPI()
OBS = {"observation": {"stdout_or_error": "1\n"}, "reward": 0.01, "done": False}


@app.post("/reset")
async def reset() -> dict:
    return {**OBS, "episode_id": "echo"}


@app.post("/step")
async def step() -> dict:
    return OBS


@app.get("/health")
async def health() -> dict:
    return {"status": "healthy"}


@app.websocket("/ws")
async def ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            message = json.loads(await websocket.receive_text())
            await websocket.send_text(json.dumps({"type": "observation", "data": OBS, "echo": message["type"]}))
    except WebSocketDisconnect:
        pass
