"""Sessions over WebSocket (typed and generic OpenEnv clients), concurrency, the shared cap, reaping,
worker cleanup and health recovery, against a real server process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from mechsandbox.client import MechSandboxEnv
from mechsandbox.protocol import InfrastructureError
from mechsandbox.tasks import get_family
from openenv.core.generic_client import GenericEnvClient
from server_harness import children, running_server
from websockets.sync.client import connect


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # an episode whose connection drops waits 2 s for a resume here (120 s by default), then frees its worker
    env = {"MECHSANDBOX_WALL_SECONDS": "3", "MECHSANDBOX_RESUME_GRACE_S": "2"}
    with running_server(tmp_path_factory.mktemp("ws"), **env) as s:
        yield s


def workers(server) -> list[int]:
    return children(server.zygote_pid())


def settle(server, expected: int, timeout: float = 15.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        count = len(workers(server))
        if count == expected:
            return count
        time.sleep(0.1)
    return len(workers(server))


def test_typed_client_plays_an_episode(server) -> None:
    truth = get_family("fourier-frequencies").generate(4, "easy").truth
    with MechSandboxEnv(base_url=server.url).sync() as env:
        result = env.reset(task_id="fourier-frequencies", seed=4, level="easy")
        assert result.observation.prompt and result.observation.max_steps > 0 and not result.done
        ran = env.run("print(model.embed.weight.shape[0])")
        assert ran.reward == 0.01 and ran.observation.stdout_or_error.strip().isdigit()
        state = env.state()
        assert state.step_count == 1 and state.task_id == "fourier-frequencies"
        graded = env.submit(truth["frequencies"])
        assert graded.done and graded.reward >= 0.95 and graded.observation.truth == truth


def test_async_typed_client(server) -> None:
    async def play() -> tuple[str, bool]:
        async with MechSandboxEnv(base_url=server.url) as env:
            await env.reset(task_id="dead-neurons", seed=2)
            ran = await env.run("print(X.shape[1])")
            graded = await env.submit_from("X")  # not an answer shape: an error that costs a step
            return ran.observation.stdout_or_error, graded.done

    out, done = asyncio.run(play())
    assert out.strip().isdigit() and done is False


def test_generic_client_plays_an_episode(server) -> None:
    with GenericEnvClient(base_url=server.url).sync() as env:
        result = env.reset(task_id="copy-head", seed=2, level="easy")
        assert result.observation["task_id"] == "copy-head"
        ran = env.step({"python_code": "print(model.cfg.n_heads)"})
        assert ran.observation["stdout_or_error"] == "12\n" and ran.reward == 0.01
        bad = env.step({"solution_target": [[99, 99]]})
        assert bad.done is False and bad.observation["error"]
        with pytest.raises(RuntimeError, match=r"exactly one|Invalid message"):
            env.step({"python_code": "1", "solution_from": "x"})


def test_reset_within_a_connection_starts_a_fresh_episode(server) -> None:
    with MechSandboxEnv(base_url=server.url).sync() as env:
        env.reset(task_id="dead-neurons", seed=1)
        env.run("kept = 1")
        env.reset(task_id="dead-neurons", seed=1)
        assert "NameError" in env.run("print(kept)").observation.error


def test_a_websocket_reset_keeps_the_clients_episode_id(server) -> None:
    """OpenEnv's reset(episode_id=...) names the episode (its runtime validation reads it back from state); a bad
    one is refused in one line and the episode before it lives on."""
    with GenericEnvClient(base_url=server.url).sync() as env:
        first = env.reset(task_id="dead-neurons", seed=1, episode_id="plan-7")
        assert first.observation["episode_id"] == "plan-7" and env.state()["episode_id"] == "plan-7"
        env.step({"python_code": "kept = 1"})
        for bad in ("x" * 129, "tab\there", 7):
            with pytest.raises(RuntimeError, match="episode_id must be a string of 1 to 128 printable"):
                env.reset(task_id="dead-neurons", seed=2, episode_id=bad)
        assert env.step({"python_code": "print(kept)"}).observation["stdout_or_error"] == "1\n"
        assert env.state()["episode_id"] == "plan-7"
        env.reset(task_id="dead-neurons", seed=2)
        assert env.state()["episode_id"] not in ("plan-7", None)  # no label: the server's own id


CASES = [(fam, seed) for seed in range(8) for fam in ("dead-neurons", "multiplication-neuron", "fourier-frequencies",
                                                      "additive-bypass")]  # fmt: skip


def _play(server, task_id: str, seed: int, correct: bool) -> tuple[float, float]:
    fam = get_family(task_id)
    inst = fam.generate(seed, "easy")
    true_answer = inst.truth.get("indices", inst.truth.get("frequencies"))
    answer = true_answer if correct else [0]
    token = f"{task_id}-{seed}-{os.urandom(4).hex()}"
    with MechSandboxEnv(base_url=server.url).sync() as env:
        env.reset(task_id=task_id, seed=seed, level="easy")
        env.run(f"token = {token!r}")
        time.sleep(0.05)
        seen = env.run("print(token)").observation.stdout_or_error.strip()
        assert seen == token
        graded = env.submit(answer)
    expected = fam.grade(answer, inst.truth).score
    return graded.reward, expected


def test_32_concurrent_sessions_never_cross(server) -> None:
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [pool.submit(_play, server, t, s, i % 2 == 0) for i, (t, s) in enumerate(CASES)]
        results = [f.result(timeout=180) for f in futures]
    assert len(results) == 32
    for got, expected in results:
        assert got == pytest.approx(expected)
    assert any(got >= 0.95 for got, _ in results) and any(got < 0.5 for got, _ in results)


def test_two_hundred_sessions_leave_no_workers(server) -> None:
    baseline = settle(server, 2)
    for i in range(200):
        with MechSandboxEnv(base_url=server.url).sync() as env:
            env.reset(task_id="dead-neurons", seed=i % 5)
    assert settle(server, baseline) == baseline


def test_disconnect_mid_snippet_leaks_nothing(server) -> None:
    baseline = settle(server, 2)
    with connect(server.url.replace("http", "ws") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "dead-neurons", "seed": 1}}))
        assert json.loads(ws.recv())["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"python_code": "while True:\n    pass"}}))
        time.sleep(0.3)
    # the dropped episode is parked for its resume grace (2 s), its snippet stopped at its CPU limit (3 s), then freed
    assert settle(server, baseline, timeout=30) == baseline


def test_health_goes_unhealthy_when_the_zygote_dies_and_recovers(server) -> None:
    zygote = server.zygote_pid()
    statuses = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            while not stop.is_set():
                statuses.append(client.get("/health").status_code)
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    os.kill(zygote, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline and not (503 in statuses and statuses[-1] == 200):
        time.sleep(0.1)
    stop.set()
    poller.join()
    assert 503 in statuses and statuses[-1] == 200
    assert server.zygote_pid() != zygote
    with MechSandboxEnv(base_url=server.url).sync() as env:
        env.reset(task_id="dead-neurons", seed=1)
        assert env.run("print(7)").observation.stdout_or_error == "7\n"


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    with running_server(
        tmp_path_factory.mktemp("cap"), MECHSANDBOX_SESSION_CAP="3", MECHSANDBOX_IDLE_TIMEOUT_S="2"
    ) as s:
        yield s


def test_one_cap_for_websocket_and_http(small_server) -> None:
    with small_server.http() as http:
        first = http.post("/reset", json={"seed": 1}).json()["episode_id"]
        http.post("/reset", json={"seed": 2})
        with MechSandboxEnv(base_url=small_server.url).sync() as env:
            env.reset(seed=3)
            over = http.post("/reset", json={"seed": 4})
            assert over.status_code == 429 and "session cap" in over.json()["detail"]
            with (
                pytest.raises(InfrastructureError, match="capacity") as full,  # the server's state, not the client's
                MechSandboxEnv(base_url=small_server.url).sync() as second,
            ):
                second.reset(seed=5)
            assert full.value.side == "capacity" and full.value.started is False
            truth = get_family("dead-neurons").generate(1, "easy").truth["indices"]
            done = http.post("/step", json={"action": {"solution_target": truth}, "episode_id": first}).json()
            assert done["done"]
            assert http.post("/reset", json={"seed": 6}).status_code == 200  # a finished episode frees its slot


def test_idle_http_episodes_are_reaped_with_their_workers(small_server) -> None:
    with small_server.http() as http:
        time.sleep(3.0)  # let earlier episodes expire
        assert settle(small_server, 2) == 2  # the warm pool alone
        eid = http.post("/reset", json={"seed": 7}).json()["episode_id"]
        assert settle(small_server, 3) == 3  # plus the episode's worker
        time.sleep(4.0)
        response = http.post("/step", json={"action": {"python_code": "1"}, "episode_id": eid})
        assert response.status_code == 404 and "expired" in response.json()["detail"]
        assert settle(small_server, 2) == 2
        assert http.get("/health").json()["sessions"]["http"] == 0


def test_idle_websocket_sessions_are_reaped(small_server) -> None:
    with MechSandboxEnv(base_url=small_server.url, message_timeout_s=30).sync() as env:
        env.reset(seed=8)
        time.sleep(11.0)  # OpenEnv's reaper checks every max(timeout / 4, 5 s)
        with pytest.raises(RuntimeError):
            env.run("print(1)")
    assert settle(small_server, 2) == 2
