"""MCP as the specification says (issue 57): the official MCP Python SDK plays a train episode over the streamable HTTP
transport of ``/mcp`` (server/mcp_http.py) and over stdio through ``mechsandbox mcp --url`` (integrations/
mcp_stdio.py), with no parameter beyond the tools' own; one MCP session is one MechSandbox session (its opener's
only, and under the session cap); the transport's details (events, versions, 405, 202, 404) follow the spec."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mechsandbox.tasks import get_family
from server_harness import running_server

SEED = 11
TRUTH = get_family("dead-neurons").generate(SEED, "easy").truth["indices"]
HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
STREAMABLE = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
LIMIT_S = 240  # a backstop: a hung transport fails the test instead of the run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"MECHSANDBOX_API_TOKENS": "tok-a,tok-b", "MECHSANDBOX_SESSION_CAP": "4", "MECHSANDBOX_CLIENT_SHARE": "0.5"}
    with running_server(tmp_path_factory.mktemp("mcp-standard"), **env) as s:
        yield s


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def run(play: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(play(), LIMIT_S))


def live_sessions(server: Any) -> int:
    """OpenEnv sessions the server holds (MCP sessions are among them), from /health."""
    return httpx.get(f"{server.url}/health", timeout=30).json()["sessions"]["websocket"]


def released(server: Any, before: int) -> bool:
    """The client's exit closed its session: the count is back to ``before`` (within seconds: the close may still be
    on its way when the client's context has exited)."""
    for _ in range(40):
        if live_sessions(server) == before:
            return True
        time.sleep(0.25)
    return False


def text(result: Any) -> str:
    return result.content[0].text


async def play_episode(session: ClientSession) -> dict[str, Any]:
    """A whole train episode through the four tools, as a model would call them; the graded result's state."""
    await session.initialize()
    assert [t.name for t in (await session.list_tools()).tools] == [
        "start_episode", "run_python", "submit_answer", "describe_task"]  # fmt: skip
    started = await session.call_tool("start_episode", {"task_id": "dead-neurons", "seed": SEED})
    assert not started.isError and "Answer schema (JSON)" in text(started)
    ran = await session.call_tool("run_python", {"code": "print(X.shape[1])"})
    assert not ran.isError and text(ran).split()[0].isdigit()
    assert (await session.call_tool("describe_task", {})).structuredContent["step"] == 1
    graded = await session.call_tool("submit_answer", {"answer": TRUTH})
    assert not graded.isError and "truth:" in text(graded)
    return graded.structuredContent


def test_the_sdk_plays_an_episode_over_streamable_http(server) -> None:
    async def play() -> dict[str, Any]:
        async with (
            httpx.AsyncClient(headers=bearer("tok-a"), timeout=120) as http,
            streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, session_id),
            ClientSession(read, write) as session,
        ):
            state = await play_episode(session)
            assert session_id()  # the session the server named in its header
            return state

    before = live_sessions(server)
    state = run(play)
    assert state["done"] and state["score"] == pytest.approx(0.99)
    assert released(server, before)  # the SDK's DELETE on exit


def test_the_sdk_plays_an_episode_over_stdio(server) -> None:
    """``mechsandbox mcp --url`` as a desktop client starts it: a subprocess speaking MCP on its stdin and stdout."""
    env = {**os.environ, "MECHSANDBOX_API_TOKEN": "tok-b"}  # the token from the environment, as a config file sets it
    command = StdioServerParameters(command=sys.executable, args=["-m", "mechsandbox.cli", "mcp", "--url", server.url],
                                    env=env)  # fmt: skip

    async def play() -> dict[str, Any]:
        async with stdio_client(command) as (read, write), ClientSession(read, write) as session:
            return await play_episode(session)

    before = live_sessions(server)
    state = run(play)
    assert state["done"] and state["score"] == pytest.approx(0.99)
    assert released(server, before)  # the relay closed its session when stdin closed


def test_the_relay_opens_a_new_session_when_the_server_reaped_its_own(tmp_path) -> None:
    """A desktop client connects long before its first episode: the server reaps the unused session (after
    ``unreset_timeout_s``) and the relay opens another for the next call, which then works."""
    with running_server(tmp_path, MECHSANDBOX_UNRESET_TIMEOUT_S="1") as quick:
        command = StdioServerParameters(
            command=sys.executable, args=["-m", "mechsandbox.cli", "mcp", "--url", quick.url]
        )

        async def play() -> str:
            async with stdio_client(command) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(80):  # the reaper looks every unreset_timeout_s / 6
                    if live_sessions(quick) == 0:
                        break
                    await asyncio.sleep(0.25)
                assert live_sessions(quick) == 0, "the unused session was not reaped"
                started = await session.call_tool("start_episode", {"task_id": "dead-neurons", "seed": SEED})
                assert not started.isError
                return text(await session.call_tool("run_python", {"code": "print(40 + 2)"}))

        assert run(play).startswith("42")


def test_another_client_cannot_use_the_session(server) -> None:
    """Token B holding A's Mcp-Session-Id gets what an unknown id gets (404), and A's episode is untouched."""

    async def play() -> None:
        async with (
            httpx.AsyncClient(headers=bearer("tok-a"), timeout=120) as http,
            streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, session_id),
            ClientSession(read, write) as session,
            httpx.AsyncClient(base_url=server.url, headers=bearer("tok-b"), timeout=60) as b,
        ):
            await session.initialize()
            await session.call_tool("start_episode", {"task_id": "dead-neurons", "seed": SEED})
            await session.call_tool("run_python", {"code": "secret = 41"})
            stolen = {**STREAMABLE, "mcp-session-id": session_id(), "mcp-protocol-version": "2025-06-18"}
            never = {**stolen, "mcp-session-id": session_id()[:12] + "-never-made"}
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "run_python", "arguments": {"code": "print(secret)"}}}  # fmt: skip
            ran = await b.post("/mcp", json=call, headers=stolen)
            unknown = await b.post("/mcp", json=call, headers=never)
            assert ran.status_code == unknown.status_code == 404
            assert ran.json()["error"]["code"] == unknown.json()["error"]["code"]
            assert "secret" not in ran.text and "41" not in ran.text
            assert (await b.delete("/mcp", headers=stolen)).status_code == 404
            still = await session.call_tool("run_python", {"code": "print(secret + 1)"})
            assert not still.isError and text(still).startswith("42")
            assert still.structuredContent["step"] == 2  # B's call ran nothing in it

    run(play)


def test_the_transport_follows_the_spec(server) -> None:
    """Events for a client that accepts only them, version negotiation, 202 for a notification, 405 for GET,
    400 for a version this server does not speak, and DELETE closing the session (404 after)."""
    with httpx.Client(base_url=server.url, headers=bearer("tok-a"), timeout=60) as http:
        hello = {**HELLO, "params": {**HELLO["params"], "protocolVersion": "2099-01-01"}}
        opened = http.post("/mcp", json=hello, headers={**STREAMABLE, "accept": "text/event-stream"})
        assert opened.status_code == 200 and opened.headers["content-type"].startswith("text/event-stream")
        event, data = opened.text.split("\n")[:2]
        assert event == "event: message" and data.startswith("data: ")
        assert json.loads(data[len("data: ") :])["result"]["protocolVersion"] == "2025-06-18"  # ours, the newest
        sid = opened.headers["mcp-session-id"]
        headers = {**STREAMABLE, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        notice = http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        assert notice.status_code == 202
        listed = http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=headers)
        assert listed.headers["content-type"].startswith("application/json")
        assert len(listed.json()["result"]["tools"]) == 4
        assert http.get("/mcp", headers={"accept": "text/event-stream", "mcp-session-id": sid}).status_code == 405
        odd = http.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "ping"},
                        headers={**headers, "mcp-protocol-version": "1999-01-01"})  # fmt: skip
        assert odd.status_code == 400 and "MCP-Protocol-Version" in odd.json()["error"]["message"]
        assert http.delete("/mcp", headers=headers).status_code == 204
        gone = http.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "ping"}, headers=headers)
        assert gone.status_code == 404


def test_an_mcp_session_counts_against_the_session_cap(tmp_path) -> None:
    """With a cap of one, a second MCP initialize is refused (in JSON-RPC form) while the first session lives, and
    succeeds once the first client has closed it."""
    with running_server(tmp_path, MECHSANDBOX_SESSION_CAP="1") as capped:

        async def play() -> None:
            async with (
                streamable_http_client(f"{capped.url}/mcp") as (read, write, _),
                ClientSession(read, write) as session,
                httpx.AsyncClient(base_url=capped.url, timeout=60) as other,
            ):
                await session.initialize()
                refused = await other.post("/mcp", json=HELLO, headers=STREAMABLE)
                assert "mcp-session-id" not in refused.headers and "cap" in refused.json()["error"]["message"]
                assert refused.json()["error"]["data"]["max_sessions"] == 1
            # the SDK's exit sent DELETE: the slot is free again
            async with httpx.AsyncClient(base_url=capped.url, timeout=60) as other:
                admitted = await other.post("/mcp", json=HELLO, headers=STREAMABLE)
                assert "result" in admitted.json() and admitted.headers["mcp-session-id"]
                await other.delete("/mcp", headers={"mcp-session-id": admitted.headers["mcp-session-id"]})

        run(play)
