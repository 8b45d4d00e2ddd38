"""Server life cycle: SIGTERM drains and exits 0 with every worker gone; SIGKILL leaves no orphans;
a worker crash loses only the namespace while the episode's state (steps, budget, done) is kept."""

from __future__ import annotations

import os
import signal
import time

import httpx
from mechsandbox.client import MechSandboxEnv
from server_harness import children, is_gone, running_server


def _tree(server) -> list[int]:
    zygote = server.zygote_pid()
    return [zygote, *children(zygote)]


def test_sigterm_exits_zero_and_kills_every_worker(tmp_path) -> None:
    with running_server(tmp_path) as server:
        with server.http() as http:
            eid = http.post("/reset", json={"seed": 1}).json()["episode_id"]
            assert (
                http.post("/step", json={"action": {"python_code": "print(1)"}, "episode_id": eid}).status_code == 200
            )
        pids = _tree(server)
        assert len(pids) >= 3
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=20) == 0
        assert time.monotonic() - started < 10
        deadline = time.time() + 10
        while time.time() < deadline and not all(is_gone(p) for p in pids):
            time.sleep(0.1)
        assert all(is_gone(p) for p in pids)
        try:
            httpx.post(f"{server.url}/reset", json={}, timeout=2)
            raise AssertionError("the server still accepts sessions after SIGTERM")
        except httpx.HTTPError:
            pass


def test_sigkilled_server_leaves_no_orphans(tmp_path) -> None:
    with running_server(tmp_path) as server:
        with MechSandboxEnv(base_url=server.url).sync() as env:
            env.reset(task_id="dead-neurons", seed=1)
            pids = _tree(server)
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
        deadline = time.time() + 10
        while time.time() < deadline and not all(is_gone(p) for p in pids):
            time.sleep(0.1)
        assert all(is_gone(p) for p in pids)


def test_worker_crash_keeps_the_episode_state(tmp_path) -> None:
    with running_server(tmp_path, MECHSANDBOX_WALL_SECONDS="2") as server, server.http() as http:
        reset = http.post("/reset", json={"task_id": "dead-neurons", "seed": 3}).json()
        eid, budget = reset["episode_id"], reset["observation"]["max_steps"]
        http.post("/step", json={"action": {"python_code": "kept = 1"}, "episode_id": eid})
        swallow = (
            "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
        )
        lost = http.post("/step", json={"action": {"python_code": swallow}, "episode_id": eid}).json()
        obs = lost["observation"]
        assert obs["namespace_reset"] is True and "namespace reset" in obs["error"] and obs["step"] == 2
        after = http.post("/step", json={"action": {"python_code": "print(kept)"}, "episode_id": eid}).json()
        assert "NameError" in after["observation"]["error"] and after["observation"]["step"] == 3
        state = http.get("/state", params={"episode_id": eid}).json()
        assert state["step_count"] == 3 and state["max_steps"] == budget and state["done"] is False
