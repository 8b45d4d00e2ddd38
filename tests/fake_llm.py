"""A local OpenAI-compatible chat-completions server with scripted replies, for end-to-end tests."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from mechsandbox.evaluation.local_server import free_port


class FakeLLM:
    """``mode``: "solve" (one invalid reply, one snippet, then FINAL_ANSWER from ``answers``) or "fail" (HTTP 500)."""

    def __init__(self, answers: dict[str, str], mode: str = "solve"):
        self.answers, self.mode = answers, mode
        self.calls: list[list[dict[str, Any]]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = FastAPI()
        app.post("/v1/chat/completions")(self.complete)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        messages = body["messages"]
        self.calls.append(messages)
        if self.mode == "fail":
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=500)
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(self.calls)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": self.reply(messages)},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def reply(self, messages: list[dict[str, Any]]) -> str:
        if len(messages) == 1:
            return "ready"
        task = re.search(r"Task `([a-z-]+)`", messages[1]["content"]).group(1)
        assistant_turns = sum(m["role"] == "assistant" for m in messages)
        if assistant_turns == 0:
            return "Let me think about this model first."  # neither code nor an answer: costs a turn
        if assistant_turns == 1:
            return "Looking at the model.\n```python\nprint(model)\n```\nCANDIDATE: [0]"
        return f"I am confident now.\nFINAL_ANSWER: {self.answers[task]}"

    def __enter__(self) -> FakeLLM:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
