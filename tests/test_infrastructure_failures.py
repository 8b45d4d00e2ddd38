"""An episode is lost only when the agent loses it (issue 52; docs/CONTRACT.md, "When the infrastructure fails").

Each test produces a real failure of the infrastructure, not a mock of one: a reset slower than the never-reset
reaper's timeout on a machine kept busy by CPU hogs, a WebSocket cut in the middle of a step by a proxy, a draining
server, a port nobody listens on, a server stopped under a counted attempt and started again on the same database.
Each checks the outcome the contract names: the episode goes on (resumed, not reaped), or the failure is an
``INFRASTRUCTURE_ERROR`` with its side (never a score, never a code an agent's mistake gets), or a counted attempt the
server lost before any step is voided and may be played again while one lost after a step is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import cpu_hogs, wait_until
from mechsandbox.client import MechSandboxEnv
from mechsandbox.protocol import INFRA_CODE, INFRA_RPC_CODE, InfrastructureError
from mechsandbox.server.app import create_app
from mechsandbox.server.service import Service
from mechsandbox.server.settings import ServerSettings
from server_harness import free_port, running_server

TASK = "dead-neurons"  # the cheapest family to generate
SLOW = ("committee-circuit", "hard")  # the slowest generation (about 1 s idle, several beside CPU hogs)


def test_a_first_reset_slower_than_the_never_reset_timeout_is_not_reaped(tmp_path) -> None:
    """The reaper of never-reset sessions counted from the session's creation, so a first reset still generating its
    instance past ``unreset_timeout_s`` was reaped under it and the episode's next step failed ("call reset before
    step"). Here the timeout is 1 s and the reset generates the slowest family's instance beside two CPU hogs."""
    with running_server(tmp_path, MECHSANDBOX_UNRESET_TIMEOUT_S="1") as server, cpu_hogs(2):
        with MechSandboxEnv(base_url=server.url, message_timeout_s=120).sync() as env:
            task, level = SLOW
            first = env.reset(task_id=task, level=level, seed=7_000_123).observation
            assert first.step == 0 and first.prompt
            out = env.run("print(6 * 7)").observation
            assert out.step == 1 and "42" in out.stdout_or_error, out.stdout_or_error
        assert "reaped a session never reset" not in server.log()


class CuttableProxy:
    """A TCP proxy in front of the server whose ``cut()`` drops every connection through it at once, as a network
    that fails does (no close handshake); new connections through it work again right after."""

    def __init__(self, upstream_port: int):
        self.upstream_port, self.port = upstream_port, free_port()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


# about 1 s of CPU (four 1500 x 1500 matrix products per 0.5 s here): long enough to cut the connection under it
SLOW_SNIPPET = "t = torch.randn(1500, 1500)\nfor _ in range(8):\n    t = torch.tanh(t @ t / 1500)\nprint('done', x)"


def test_a_websocket_cut_mid_step_resumes_the_same_episode(tmp_path) -> None:
    """The connection drops while a snippet runs: the typed client reconnects and resumes the same episode (its
    namespace, its step count), learns that the step was taken, and does not run it twice; it never lands in a fresh
    session where the episode does not exist."""

    async def play(port: int) -> None:
        proxy = CuttableProxy(port)
        await proxy.start()
        env = MechSandboxEnv(base_url=f"http://127.0.0.1:{proxy.port}", message_timeout_s=120)
        try:
            reset = (await env.reset(task_id=TASK, seed=11)).observation
            assert reset.resume_token
            first = (await env.run("x = 41\nprint(x)")).observation
            assert first.step == 1
            step = asyncio.ensure_future(env.run(SLOW_SNIPPET))
            await asyncio.sleep(0.3)  # the snippet is running in the server
            assert not step.done()
            proxy.cut()
            result = (await step).observation
            assert result.step == 2, result  # taken once, not sent again
            assert "done" in result.stdout_or_error and "41" in result.stdout_or_error
            after = (await env.run("print(x + 1)")).observation
            assert after.step == 3 and "42" in after.stdout_or_error  # the same namespace, the budget it had
        finally:
            await env.close()
            await proxy.close()

    with running_server(tmp_path) as server:
        asyncio.run(play(server.port))


def test_only_the_opening_client_resumes_an_episode_and_a_resume_takes_nothing_else(tmp_path) -> None:
    with running_server(tmp_path, MECHSANDBOX_API_TOKENS="tok-a,tok-b") as server:
        a = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-a"}, timeout=60)
        b = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-b"}, timeout=60)
        opened = a.post("/reset", json={"task_id": TASK, "seed": 5}).json()
        token, episode_id = opened["observation"]["resume_token"], opened["episode_id"]
        step = a.post("/step", json={"episode_id": episode_id, "action": {"python_code": "print(3)"}}).json()
        assert step["observation"]["step"] == 1
        mine = a.post("/reset", json={"resume": token})
        assert mine.status_code == 200, mine.text
        body = mine.json()
        assert body["episode_id"] == episode_id and body["observation"]["step"] == 1
        assert body["observation"]["resumed"] is True and "3" in body["observation"]["stdout_or_error"]
        theirs = b.post("/reset", json={"resume": token})
        assert theirs.status_code == 404 and "no episode to resume" in theirs.json()["detail"]
        mixed = a.post("/reset", json={"resume": token, "task_id": TASK})
        assert mixed.status_code == 400 and "only resume" in mixed.json()["detail"]
        guessed = a.post("/reset", json={"resume": "A" * 32})
        assert guessed.status_code == 404 and guessed.json()["detail"] == theirs.json()["detail"]


def test_a_draining_server_refuses_with_an_infrastructure_error_on_http_and_the_websocket(tmp_path) -> None:
    env = {"MECHSANDBOX_DRAIN_S": "60", "MECHSANDBOX_DRAIN_NOTICE_S": "0"}
    with running_server(tmp_path, **env) as server, server.http() as http:
        live = http.post("/reset", json={"task_id": TASK, "seed": 1}).json()  # keeps the server draining
        server.process.terminate()  # SIGTERM: drain
        wait_until(lambda: http.get("/ready").status_code == 404, timeout_s=30)
        refused = http.post("/reset", json={"task_id": TASK, "seed": 2})
        assert refused.status_code == 503
        body = refused.json()
        assert body["code"] == INFRA_CODE and body["side"] == "draining", body
        assert body["detail"].startswith("infrastructure error (draining):")
        with pytest.raises(InfrastructureError) as caught, MechSandboxEnv(base_url=server.url).sync() as ws:
            ws.reset(task_id=TASK, seed=3)
        assert caught.value.side == "draining" and caught.value.started is False
        action = {"python_code": "print(1)"}
        still = http.post("/step", json={"episode_id": live["episode_id"], "action": action})
        assert still.status_code == 200  # the live episode goes on while the server drains


def test_a_server_nobody_answers_is_a_connection_failure_not_a_runtime_error() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InfrastructureError) as caught, MechSandboxEnv(base_url=nowhere).sync() as env:
        env.reset(task_id=TASK)
    assert caught.value.side == "connection" and caught.value.started is False


# --- counted attempts the server lost ---------------------------------------------------------------------------

SALT = "infrastructure-test-salt-0123456789abcdef"


def serve(data_dir: str) -> TestClient:
    client = TestClient(create_app(Service(ServerSettings(test_salt=SALT, data_dir=data_dir, run_quota=0))))
    client.__enter__()
    return client


def stop(client: TestClient) -> None:
    client.__exit__(None, None, None)  # the app's shutdown: Service.stop closes every live episode as the server's


def counted_reset(http: TestClient, run: dict[str, Any], index: int) -> dict[str, Any]:
    response = http.post("/reset", json={"task_id": TASK, "split": "test", "index": index,
                                         "run_token": run["run_token"]})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def test_an_attempt_the_server_lost_before_any_step_is_voided_and_played_again(tmp_path) -> None:
    data = str(tmp_path / "results")
    http = serve(data)
    run = http.post("/runs", json={"agent": "restart-tester"}).json()
    before = counted_reset(http, run, 0)
    assert before["observation"]["counted"] is True
    stepped = counted_reset(http, run, 1)
    http.post("/step", json={"episode_id": stepped["episode_id"], "action": {"python_code": "print(X.shape)"}})
    stop(http)  # the server stops under both attempts

    http = serve(data)  # the same database and salt: a restarted server
    try:
        again = counted_reset(http, run, 0)
        assert again["observation"]["counted"] is True  # voided: the run plays it again, counted
        replay = counted_reset(http, run, 1)
        assert replay["observation"]["counted"] is False  # lost after a step: never a second try
        entry = http.get(f"/runs/{run['run_id']}").json()
        assert entry["coverage"]["voided"] == 1 and entry["coverage"]["lost"] == 1, entry["coverage"]
    finally:
        stop(http)


def test_infrastructure_frames_carry_their_code_and_side_on_the_websocket(tmp_path) -> None:
    """A WebSocket reset a draining server refuses: the frame's code is INFRASTRUCTURE_ERROR with the side, while an
    agent's own mistake keeps EXECUTION_ERROR."""
    service = Service(ServerSettings(data_dir=str(tmp_path)))
    with TestClient(create_app(service)) as http, http.websocket_connect("/ws") as ws:
        ws.send_text(json.dumps({"type": "step", "data": {"python_code": "print(1)"}}))
        mistake = json.loads(ws.receive_text())["data"]
        assert mistake["code"] == "EXECUTION_ERROR" and "call reset" in mistake["message"]
        service.drain(notice_s=0)
        ws.send_text(json.dumps({"type": "reset", "data": {"task_id": TASK, "seed": 1}}))
        refused = json.loads(ws.receive_text())["data"]
        assert refused["code"] == INFRA_CODE and refused["side"] == "draining", refused


def test_mcp_names_an_infrastructure_failure_as_a_json_rpc_error_with_its_side(tmp_path) -> None:
    """Over POST /mcp a refusal of the call is a tool result with ``isError`` (the agent reads it); a failure of the
    server is a JSON-RPC error with ``INFRA_RPC_CODE`` and the side, so no tool-calling harness scores it."""
    service = Service(ServerSettings(data_dir=str(tmp_path)))
    with TestClient(create_app(service)) as http:

        def rpc(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
            return http.post("/mcp", json={"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).json()

        session = rpc("openenv/session/create", {})["result"]["session_id"]
        call = {"session_id": session, "name": "run_python", "arguments": {"code": "print(1)"}}
        mistake = rpc("tools/call", call)
        assert mistake["result"]["isError"] is True and "start_episode" in mistake["result"]["content"][0]["text"]
        service.drain(notice_s=0)
        start = {"session_id": session, "name": "start_episode", "arguments": {"task_id": TASK, "seed": 1}}
        refused = rpc("tools/call", start)["error"]
        assert refused["code"] == INFRA_RPC_CODE, refused
        assert refused["data"] == {"code": INFRA_CODE, "side": "draining"}
        assert "infrastructure error (draining)" in refused["message"]


@pytest.mark.parametrize("server_fault", [True, False], ids=["killed-by-the-server", "lost-by-the-snippet"])
def test_a_worker_lost_mid_step_charges_the_step_only_when_the_snippet_lost_it(tmp_path, server_fault: bool) -> None:
    """A worker killed under a running snippet: by the server for its own reasons (what the memory watchdog does to a
    worker within its guarantee), the step is not counted; by the snippet's doing, it is. Either way the episode goes
    on in a fresh worker (namespace reset) with the budget it had, never a fresh one."""
    import threading
    import time

    service = Service(ServerSettings(data_dir=str(tmp_path)))
    with TestClient(create_app(service)) as http:
        opened = http.post("/reset", json={"task_id": TASK, "seed": 21}).json()
        episode_id, budget = opened["episode_id"], opened["observation"]["max_steps"]

        def step(code: str) -> dict[str, Any]:
            response = http.post("/step", json={"episode_id": episode_id, "action": {"python_code": code}})
            assert response.status_code == 200, response.text
            return response.json()["observation"]

        assert step("x = 5\nprint(x)")["step"] == 1
        episode = service.http[episode_id]
        replies: list[dict[str, Any]] = []
        running = threading.Thread(target=lambda: replies.append(step(SLOW_SNIPPET)))
        running.start()
        time.sleep(0.5)  # the snippet runs in the worker
        worker = episode.sandbox.worker
        assert worker is not None
        worker.kill("memory budget exceeded; namespace reset", server_fault=server_fault)
        running.join(timeout=60)
        lost = replies[0]
        assert lost["namespace_reset"] is True or "namespace reset" in lost["stdout_or_error"]
        assert lost["step"] == (1 if server_fault else 2), lost
        assert ("not counted" in lost["stdout_or_error"]) is server_fault
        after = step("print('x' in dir())")
        assert after["step"] == lost["step"] + 1 and after["max_steps"] == budget  # no fresh budget


def test_an_http_episode_answers_only_the_client_that_opened_it(tmp_path) -> None:
    """As an MCP session and a resume, an HTTP episode is its opener's: another API token's /step and /state on its id
    read exactly as an unknown id (issue 54's rule, held on every route that names an episode)."""
    with running_server(tmp_path, MECHSANDBOX_API_TOKENS="tok-a,tok-b") as server:
        a = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-a"}, timeout=60)
        b = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-b"}, timeout=60)
        episode_id = a.post("/reset", json={"task_id": TASK, "seed": 9}).json()["episode_id"]
        action = {"episode_id": episode_id, "action": {"python_code": "print(1)"}}
        theirs = b.post("/step", json=action)
        unknown = b.post("/step", json={**action, "episode_id": "A" * 22})
        assert theirs.status_code == unknown.status_code == 404 and theirs.json() == unknown.json()
        assert b.get("/state", params={"episode_id": episode_id}).status_code == 404
        assert a.post("/step", json=action).json()["observation"]["step"] == 1  # the opener's steps were never spent


def test_the_run_viewer_names_episodes_lost_to_the_infrastructure(tmp_path) -> None:
    """A run folder with an episode the infrastructure lost: its page says so at the top, the episode's outcome is
    "infrastructure" (with the side's message, a filter option of its own), never "unsolved" with no score."""
    from mechsandbox.evaluation.report import summarise
    from mechsandbox.evaluation.rundir import RunDir
    from mechsandbox.web.pages import run_page

    lost = {"side": "connection", "message": "infrastructure error (connection): the server went away", "started": True}
    rows = [
        {"task_id": TASK, "level": "easy", "split": "train", "instance_id": "train-a", "score": 0.99, "steps": 3},
        {"task_id": TASK, "level": "easy", "split": "train", "instance_id": "train-b", "score": None, "steps": 1,
         "infra_error": lost},
    ]
    folder = tmp_path / "run"
    (folder / "trajectories").mkdir(parents=True)
    for k, row in enumerate(rows):
        (folder / "trajectories" / f"{k:04d}.json").write_text(json.dumps({**row, "turns": []}))
    summary = summarise(rows, {"split": "train", "agent": "scripted"})
    page = run_page(RunDir(folder, summary, rows))
    assert "1 infrastructure error (connection 1)" in page and "graded episodes" in page
    assert 'data-outcome="infrastructure"' in page and "the server went away" in page
    assert '<option value="infrastructure">' in page


def test_a_replay_of_a_claimed_counted_attempt_is_the_infrastructures_loss_not_a_score(tmp_path) -> None:
    """A harness resets each instance of its run once; a reset that answers ``counted: false`` means the run's attempt
    was claimed by an earlier reset whose reply was lost with its server (a replica killed outright cannot void it).
    The episode is then recorded as the infrastructure's (never a floor score in a mean) and never tried again."""
    from mechsandbox.agents import play_episode
    from mechsandbox.agents.base import may_retry
    from mechsandbox.agents.scripted import ScriptedAgent

    with running_server(tmp_path, MECHSANDBOX_TEST_SALT=SALT) as server, server.http() as http:
        run = http.post("/runs", json={"agent": "replayed"}).json()
        reset = {"task_id": TASK, "level": "easy", "split": "test", "index": 3, "run_token": run["run_token"]}
        claimed = http.post("/reset", json=reset).json()  # the claim whose reply "was lost"
        assert claimed["observation"]["counted"] is True
        with MechSandboxEnv(base_url=server.url).sync() as env:
            record = play_episode(ScriptedAgent(), env, reset)
    assert record.infra_error is not None and record.infra_error["side"] == "connection" and record.score is None
    assert not record.graded and not may_retry(record)
