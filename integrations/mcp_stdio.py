"""``mechsandbox mcp --url URL``: the episode tools over stdio, for desktop and IDE clients that start an MCP server as
a subprocess (Claude Desktop's ``mcpServers``, coding agents), forwarding every message to the server's ``/mcp``.

Why a relay and not a server of its own: the server already answers MCP (``server/mcp_http.py``), and each stdio
message is one of its JSON-RPC messages, so relaying them unchanged keeps one implementation of the tools, their
schemas, their errors (an infrastructure failure stays a JSON-RPC error with ``protocol.INFRA_RPC_CODE``) and the
protocol-version negotiation. The relay adds only what a stdio process needs: the ``Mcp-Session-Id`` and
``MCP-Protocol-Version`` headers of its one session, the bearer token, and a new session when the server has
reaped the old one (a session idle for ``unreset_timeout_s`` before its first episode, e.g. a desktop app left
open, or ``idle_timeout_s`` later): the request is then sent once more in the new session, whose episode the
agent starts again. It needs httpx only (no torch, no MCP SDK): it starts in a fraction of a second.

Requests are relayed concurrently (a ``ping`` is answered while a ``run_python`` runs); ``initialize`` alone is
awaited before the next message, since everything after it carries the session it opens. When stdin closes the
session is closed (``DELETE /mcp``). Only JSON-RPC goes to stdout; the relay's own notes go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from typing import Any, BinaryIO

import httpx

from ..protocol import INFRA_CODE, INFRA_RPC_CODE, infra_message, one_line

SESSION_HEADER = "mcp-session-id"  # the transport's headers (server/mcp_http.py)
VERSION_HEADER = "mcp-protocol-version"
INTERNAL_ERROR = -32603
TIMEOUT = httpx.Timeout(600.0, connect=15.0)  # a tool call may generate an instance or run a long snippet


def note(text: str) -> None:
    print(f"mechsandbox mcp: {text}", file=sys.stderr, flush=True)


def error(rid: Any, code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": one_line(message)}
    if data:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": body}


def messages_of(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a 2xx answer: its JSON body, or the data of its server-sent events."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = response.text.splitlines()
        return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
    return [response.json()] if response.content else []


class Relay:
    """One MCP session on the server, relayed to one stdio client."""

    def __init__(self, url: str, token: str | None = None, out: BinaryIO | None = None):
        self.endpoint = url.rstrip("/") + "/mcp"
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self.http = httpx.AsyncClient(headers=headers, timeout=TIMEOUT)
        self.out = out or sys.stdout.buffer
        self.session: str | None = None
        self.version: str | None = None
        self.hello: dict[str, Any] | None = None  # the client's initialize, sent again for a new session
        self.reopening = asyncio.Lock()

    def write(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        self.out.flush()

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.session:
            headers[SESSION_HEADER] = self.session
        if self.version:
            headers[VERSION_HEADER] = self.version
        return headers

    async def post(self, message: dict[str, Any]) -> httpx.Response:
        return await self.http.post(self.endpoint, content=json.dumps(message), headers=self.headers())

    async def relay(self, message: Any) -> None:
        """Send one client message and write what answers it (nothing for a notification)."""
        rid = message.get("id") if isinstance(message, dict) else None
        is_request = isinstance(message, dict) and "id" in message and isinstance(message.get("method"), str)
        try:
            if is_request and message["method"] == "initialize":
                return self.write(await self.initialize(message))
            sent_in = self.session
            response = await self.post(message)
            if response.status_code == 404 and sent_in and self.hello is not None:
                async with self.reopening:  # one new session, however many calls found the old one gone
                    reopened = await self.initialize(self.hello, reopen=True) if self.session == sent_in else None
                if reopened is not None and "error" in reopened:
                    return self.write({**reopened, "id": rid}) if is_request else None
                response = await self.post(message)
        except httpx.HTTPError as exc:
            text = infra_message("connection", f"{type(exc).__name__} reaching {self.endpoint}: {exc}")
            return self.write(error(rid, INFRA_RPC_CODE, text, {"code": INFRA_CODE, "side": "connection"}))
        for answer in self.answers(response, rid):
            if is_request or not isinstance(message, dict):  # a notification's answer is none; junk's is its error
                # a transport refusal (a 400, a 404 left) names no id: it answers this request
                self.write({**answer, "id": rid} if answer.get("id") is None else answer)

    def answers(self, response: httpx.Response, rid: Any) -> list[dict[str, Any]]:
        """The JSON-RPC answers in ``response``; an HTTP refusal without one (a wrong token, a proxy's page) as one."""
        try:
            found = [answer for answer in messages_of(response) if isinstance(answer, dict)]
        except ValueError:
            found = []
        if found or response.status_code in (200, 202):
            return found
        text = one_line(response.text)[:300] or response.reason_phrase
        return [error(rid, INTERNAL_ERROR, f"the server answered HTTP {response.status_code}: {text}")]

    async def initialize(self, message: dict[str, Any], reopen: bool = False) -> dict[str, Any]:
        """Open the server-side session (the client's ``initialize``, or the same again after the server reaped the
        session: then the relay also sends the ``initialized`` notice the client sent once) and return the answer."""
        if reopen:
            note("the server closed the session (reaped when idle, or restarted); opening a new one")
        self.session = None
        response = await self.post(message)
        answers = self.answers(response, message.get("id"))
        answer = answers[0] if answers else error(message.get("id"), INTERNAL_ERROR, "no answer to initialize")
        if "result" in answer:
            self.hello = message
            self.session = response.headers.get(SESSION_HEADER)
            self.version = answer["result"].get("protocolVersion")
            if reopen:
                await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    async def close(self) -> None:
        if self.session:
            with contextlib.suppress(httpx.HTTPError):
                await self.http.delete(self.endpoint, headers=self.headers())
        await self.http.aclose()


def read_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes | None], stream: BinaryIO) -> None:
    """Stdin's lines into ``queue`` (a thread: a blocking read works on every kind of stdin), then None."""
    for line in stream:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def serve(url: str, token: str | None = None, stdin: BinaryIO | None = None) -> None:
    relay = Relay(url, token)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    reader = threading.Thread(target=read_lines, args=(asyncio.get_running_loop(), queue, stdin or sys.stdin.buffer),
                              name="stdin", daemon=True)  # fmt: skip
    reader.start()
    pending: set[asyncio.Task[None]] = set()
    try:
        while (line := await queue.get()) is not None:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                relay.write(error(None, -32700, "parse error: a line on stdin is not valid JSON"))
                continue
            if isinstance(message, dict) and message.get("method") == "initialize":
                await relay.relay(message)  # what follows carries the session it opens
                continue
            task = asyncio.create_task(relay.relay(message))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending)
    finally:
        await relay.close()


def main(url: str, token: str | None = None) -> int:
    """Relay until stdin closes; 2 with one line on stderr for a URL that is not http(s)."""
    if not url.startswith(("http://", "https://")):
        note(f"--url must be the server's http:// or https:// address, not {url[:80]!r}")
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(url, token))
    return 0
