"""POST /mcp (server/mcp.py, issue 18): a raw JSON-RPC client plays an episode to a graded score on a real server
process, under the same rules as the WebSocket path (budget, one graded submission, train truth only after the
end, the session cap), and every kind of bad message gets MCP's own error form."""

from __future__ import annotations

import json

import httpx
import pytest
from mechsandbox.models import MAX_CODE_BYTES
from mechsandbox.tasks import get_family
from openenv.core.mcp_client import MCPToolClient
from server_harness import running_server

TASK = {"task_id": "dead-neurons", "seed": 5}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("mcp"), MECHSANDBOX_SESSION_CAP="3") as s:
        yield s


class Rpc:
    """A raw JSON-RPC 2.0 client over HTTP POST, as any MCP-speaking harness would be."""

    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, timeout=120)
        self.next_id = 0

    def send(self, method: str, params: dict | None = None, **extra) -> dict:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, **extra}
        if params is not None:
            body["params"] = params
        response = self.http.post("/mcp", json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        assert reply["jsonrpc"] == "2.0" and reply["id"] == self.next_id
        return reply

    def session(self) -> str:
        return self.send("openenv/session/create", {})["result"]["session_id"]

    def close(self, session_id: str) -> None:
        self.send("openenv/session/close", {"session_id": session_id})

    def tool(self, session_id: str, name: str, **arguments) -> dict:
        reply = self.send("tools/call", {"name": name, "arguments": arguments, "session_id": session_id})
        assert "result" in reply, reply
        return reply["result"]


@pytest.fixture
def rpc(server):
    client = Rpc(server.url)
    yield client
    client.http.close()


def text(result: dict) -> str:
    return result["content"][0]["text"]


def test_tools_are_listed_without_a_session(rpc) -> None:
    tools = rpc.send("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["start_episode", "run_python", "submit_answer", "describe_task"]
    assert all(t["inputSchema"]["type"] == "object" and t["description"] for t in tools)
    init = rpc.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})["result"]
    assert init["serverInfo"]["name"] == "mechsandbox" and "tools" in init["capabilities"]


def test_an_episode_is_played_to_a_graded_score(rpc) -> None:
    truth = get_family("dead-neurons").generate(5, "easy").truth
    sid = rpc.session()
    try:
        started = rpc.tool(sid, "start_episode", **TASK)
        assert not started["isError"] and "Answer schema (JSON)" in text(started)
        budget = started["structuredContent"]["max_steps"]
        ran = rpc.tool(sid, "run_python", code="print(X.shape[1])")
        assert not ran["isError"] and text(ran).split()[0].isdigit()
        assert ran["structuredContent"]["step"] == 1 and ran["structuredContent"]["max_steps"] == budget
        graded = rpc.tool(sid, "submit_answer", answer=truth["indices"])
        assert not graded["isError"] and graded["structuredContent"]["done"]
        assert graded["structuredContent"]["score"] == pytest.approx(0.99)
        assert "truth:" in text(graded)  # train: the truth after the end
        again = rpc.tool(sid, "submit_answer", answer=truth["indices"])
        assert again["isError"] and "episode is over" in text(again)  # one graded submission
    finally:
        rpc.close(sid)


def test_the_budget_and_the_test_split_hold(rpc) -> None:
    sid = rpc.session()
    try:
        budget = rpc.tool(sid, "start_episode", **TASK)["structuredContent"]["max_steps"]
        for _ in range(budget):
            last = rpc.tool(sid, "run_python", code="print(1)")
        assert last["structuredContent"]["done"] and last["structuredContent"]["truncated"]
        assert rpc.tool(sid, "run_python", code="print(1)")["isError"]
        started = rpc.tool(sid, "start_episode", task_id="dead-neurons", split="test", index=0)
        assert "isError" in started and not started["isError"]
        graded = rpc.tool(sid, "submit_answer", answer=[0])
        assert graded["structuredContent"]["done"] and "truth" not in text(graded)
    finally:
        rpc.close(sid)


def test_openenvs_own_mcp_client_calls_the_tools(server) -> None:
    import asyncio

    async def play() -> str:
        async with MCPToolClient(base_url=server.url) as client:  # production mode: HTTP /mcp plus its session
            names = [t.name for t in await client.list_tools()]
            assert "run_python" in names
            await client.call_tool("start_episode", **TASK)
            return await client.call_tool("run_python", code="print(40 + 2)")

    assert asyncio.run(play()).startswith("42")


def rpc_body(method: str, params: object = None, **extra: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params, **extra}).encode()


def call_body(name: str, **params: object) -> bytes:
    return rpc_body("tools/call", {"name": name, "arguments": {"code": "1"}, **params})


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b"{not json", -32700, "parse error"),
        (b"[1, 2]", -32600, "invalid request"),
        (rpc_body("tools/list", {}, jsonrpc="1.0"), -32600, "invalid request"),
        (rpc_body("resources/list", {}), -32601, "method not found"),
        (rpc_body("tools/call", [1]), -32602, "object"),
        (call_body("reset"), -32602, "unknown tool 'reset'"),
        (call_body("run_python"), -32602, "session_id"),
        (call_body("run_python", session_id="nope"), -32602, "unknown"),
        (b'{"jsonrpc": "2.0", "id": NaN, "method": "ping"}', -32700, "parse error"),  # (a red team's HTTP 500s)
        (rpc_body("ping", {}, id=1.5), -32600, "the id must be"),
        (rpc_body("openenv/session/close", {"session_id": [1]}), -32602, "session_id"),
        (rpc_body("openenv/session/close", {"session_id": "a\nb"}), -32602, "session_id"),
        (rpc_body("openenv/session/create", {}, extra=1), -32600, "unexpected member 'extra'"),
        (rpc_body("openenv/session/close", {"session_id": "x" * 100}), -32602, "unknown or closed session_id"),
    ],
)
def test_bad_messages_are_jsonrpc_errors(server, body, code, message) -> None:
    response = httpx.post(f"{server.url}/mcp", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == code and message in error["message"] and "\n" not in error["message"]


def test_odd_but_valid_messages_get_json_answers(server) -> None:
    """A lone surrogate in the id is echoed as an escape (it failed the UTF-8 encoder before); a body that is not
    declared as JSON is refused (a browser's cross-origin simple request cannot declare it)."""
    ping = httpx.post(f"{server.url}/mcp", content=b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}',
                      headers={"content-type": "application/json"})  # fmt: skip
    assert ping.status_code == 200 and ping.json()["result"] == {} and ping.json()["id"] == "\ud800"
    plain = httpx.post(f"{server.url}/mcp", content=rpc_body("tools/list", {}), headers={"content-type": "text/plain"})
    assert plain.json()["error"]["code"] == -32600 and "application/json" in plain.json()["error"]["message"]
    assert httpx.post(f"{server.url}/mcp", json={"jsonrpc": "2.0", "method": "ping"}).status_code == 202  # a notice


def test_the_request_limits_answer_in_jsonrpc_form(server) -> None:
    """The body-size and nesting limits (server/limits.py) refuse before the route runs: on /mcp they keep their
    HTTP status and answer as JSON-RPC errors."""
    huge = call_body("run_python", session_id="x").replace(b'"1"', json.dumps("#" * 300_000).encode())
    deep = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": ' + b"[" * 80 + b"]" * 80 + b"}}"
    for body, status, message in ((huge, 413, "larger than"), (deep, 422, "nested deeper")):
        response = httpx.post(f"{server.url}/mcp", content=body, headers={"content-type": "application/json"})
        assert response.status_code == status
        error = response.json()["error"]
        assert error["code"] == -32600 and message in error["message"] and response.json()["jsonrpc"] == "2.0"


def test_bad_arguments_are_tool_errors_that_spend_nothing(rpc) -> None:
    sid = rpc.session()
    try:
        rpc.tool(sid, "start_episode", **TASK)
        for name, arguments, message in (
            ("run_python", {}, "code: Field required"),
            ("run_python", {"code": 7}, "valid string"),
            ("run_python", {"code": "#" * (MAX_CODE_BYTES + 10)}, f"larger than {MAX_CODE_BYTES} bytes"),
            ("submit_answer", {"answer": [1], "variable": "x"}, "exactly one of answer or variable"),
            ("start_episode", {"level": "impossible"}, "level"),
        ):
            result = rpc.tool(sid, name, **arguments)
            assert result["isError"] and message in text(result) and "\n" not in text(result), (name, text(result))
        assert rpc.tool(sid, "describe_task")["structuredContent"]["step"] == 0
    finally:
        rpc.close(sid)


def test_the_session_cap_holds(rpc) -> None:
    sessions = []
    try:
        for _ in range(3):
            sessions.append(rpc.session())
        refused = rpc.send("openenv/session/create", {})
        assert "error" in refused and "cap" in refused["error"]["message"]
        # OpenEnv's data is kept: it tells a full server (worth waiting for) from a failed environment build
        assert refused["error"]["code"] == -32000 and refused["error"]["data"]["max_sessions"] == 3
    finally:
        for sid in sessions:
            rpc.close(sid)
