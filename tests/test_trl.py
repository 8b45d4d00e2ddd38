"""The TRL environment (integrations/trl.py, issue 19) in TRL's real GRPOTrainer, on real servers, with tiny models
built here (integrations/tiny_chat.py): the example script's smoke run, a graded reward through the same tool
methods, and each documented way a rollout ends badly (the budget, a refused answer, a server that goes away or
hangs, a full server), each giving the floor or one raised line, never a hang."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from server_harness import running_server

pytest.importorskip("trl", reason="the [trl] extra (in dev) is not installed")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from mechsandbox.integrations import trl as trl_integration
from mechsandbox.integrations.mcp_client import McpError
from mechsandbox.integrations.tiny_chat import tiny_chat_model
from mechsandbox.integrations.trl import (
    MechSandboxEnv,
    ServerUnavailable,
    ToolRefused,
    environment_factory,
    episode_dataset,
)
from mechsandbox.protocol import FLOOR, InfrastructureError
from mechsandbox.tasks import LEVELS, get_family
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 4  # every train episode's step budget on the module's server (dead-neurons' reference: 3 runs + submit)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("trl"), MECHSANDBOX_TRAIN_MAX_STEPS=str(BUDGET)) as s:
        yield s


def open_sessions(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=30).json()["sessions"]["websocket"]


class Recording(MechSandboxEnv):
    """Keeps each rollout's final episode state (read before ``get_reward`` closes the session) and its reward."""

    seen: ClassVar[list[tuple[dict[str, Any], float]]] = []

    def get_reward(self) -> float | None:
        state = self.episode_state
        reward = super().get_reward()
        Recording.seen.append((state, reward))
        return reward


class ReferencePlayed(Recording):
    """Plays the family's reference snippets through ``run_python`` before the model speaks, so the sandbox holds
    ``answer`` and the scripted policy's ``submit_answer(variable="answer")`` is graded on its merits."""

    def reset(self, prompt: Any = None, **row: Any) -> str:
        text = super().reset(prompt, **row)
        for snippet in get_family(row["task_id"]).reference:
            self.run_python(snippet)
        return text


def grpo_step(factory, tool_call, tmp_path, *, max_tool_calls: int = 2, task: str = "dead-neurons") -> dict:
    """One GRPO step (one instance, a group of two rollouts) with the scripted policy; the step's logged metrics."""
    Recording.seen.clear()
    model, tokenizer = tiny_chat_model(tool_call=tool_call)
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                        num_generations=2, max_completion_length=1024, max_tool_calling_iterations=max_tool_calls,
                        max_steps=1, logging_steps=1, save_strategy="no", report_to="none")  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, environment_factory=factory,
                          train_dataset=episode_dataset(task, "easy", [3]))  # fmt: skip
    trainer.train()
    return trainer.state.log_history[0]


def env_reward(logged: dict) -> float:
    """The step's mean environment reward, as TRL logs it (under the environment class's name)."""
    [key] = [k for k in logged if k.startswith("rewards/") and k.endswith("/mean")]
    return logged[key]


def test_the_example_script_runs_grpo_steps_on_a_tiny_model(server, tmp_path) -> None:
    command = [sys.executable, str(ROOT / "examples" / "grpo_mechsandbox.py"), "--tiny", "--url", server.url,
               "--max-steps", "2", "--seeds", "2", "--num-generations", "2", "--batch-size", "2",
               "--max-completion-length", "48", "--output-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # random weights never submit: every rollout ended ungraded, at the floor, and closed its session
    assert "grpo_mechsandbox: 2 steps; mean reward per step: 0.010, 0.010" in done.stdout, done.stdout[-2000:]
    assert open_sessions(server.url) == 0


def test_a_reference_solution_through_the_tool_methods_earns_a_graded_reward(server, tmp_path) -> None:
    factory = environment_factory(server.url).func  # the class: the subclass below takes the same arguments
    assert factory is MechSandboxEnv
    logged = grpo_step(lambda: ReferencePlayed(server.url), ("submit_answer", {"variable": "answer"}), tmp_path,
                       max_tool_calls=1)  # fmt: skip
    assert len(Recording.seen) == 2
    for state, reward in Recording.seen:
        assert state["done"] and not state["truncated"] and state["task_id"] == "dead-neurons"
        assert reward == state["score"] >= 0.95
    assert env_reward(logged) >= 0.95 and logged["tools/failure_frequency"] == 0
    assert open_sessions(server.url) == 0


def test_a_rollout_that_spends_the_budget_gets_the_floor(server, tmp_path) -> None:
    logged = grpo_step(lambda: Recording(server.url), ("run_python", {"code": "print(6 * 7)"}), tmp_path,
                       max_tool_calls=BUDGET + 2)  # fmt: skip
    assert len(Recording.seen) == 2
    for state, reward in Recording.seen:
        assert state["done"] and state["truncated"] and state["step"] == BUDGET and reward == FLOOR, state
    # the two calls after the end were refused, and TRL counted them as failed tool calls
    assert env_reward(logged) == pytest.approx(FLOOR) and logged["tools/failure_frequency"] > 0


def test_a_malformed_answer_is_refused_and_the_rollout_gets_the_floor(server, tmp_path) -> None:
    logged = grpo_step(lambda: Recording(server.url), ("submit_answer", {"answer": "no such answer"}), tmp_path)
    assert len(Recording.seen) == 2
    for state, reward in Recording.seen:
        assert not state["done"] and state["step"] == 2 and reward == FLOOR  # two refused submissions, two steps
    assert env_reward(logged) == pytest.approx(FLOOR) and logged["tools/failure_frequency"] == 1.0
    env = MechSandboxEnv(server.url)
    env.reset(task_id="dead-neurons", level="easy", seed=3)
    with pytest.raises(ToolRefused, match="answer"):
        env.submit_answer(answer="no such answer")
    with pytest.raises(ToolRefused, match="exactly one of answer or variable"):
        env.submit_answer()
    with pytest.raises(ToolRefused, match="larger than"):  # refused by the server's body limit, not "gone"
        env.run_python("x" * 300_000)
    assert "42" in env.run_python("print(42)")  # the episode goes on
    assert env.get_reward() == FLOOR and env.episode_state["step"] == 2  # the refused requests spent no step


def test_the_tools_trl_offers_are_the_episode_tools_with_their_arguments_described(server, tmp_path) -> None:
    model, tokenizer = tiny_chat_model()
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                        num_generations=2, max_steps=1, report_to="none")  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, environment_factory=
                          environment_factory(server.url), train_dataset=episode_dataset("dead-neurons"))  # fmt: skip
    schemas = {s["function"]["name"]: s["function"] for s in map(get_json_schema, trainer.tools)}
    assert set(schemas) == {"run_python", "submit_answer", "describe_task"}
    assert set(schemas["submit_answer"]["parameters"]["properties"]) == {"answer", "variable"}
    assert "64 KiB" in schemas["run_python"]["parameters"]["properties"]["code"]["description"]
    assert trainer.reward_func_names == ["MechSandboxEnv"]


def test_reset_refuses_a_row_the_server_refuses_and_test_split_rows(server) -> None:
    with MechSandboxEnv(server.url) as env:
        with pytest.raises(ToolRefused, match="no-such-family"):
            env.reset(task_id="no-such-family")
        assert open_sessions(server.url) == 0  # the refused row's session was closed by reset itself
    for row in ({"split": "test", "index": 0}, {"run_token": "x"}, {"index": 3}):
        with pytest.raises(ValueError, match="train split only"):
            MechSandboxEnv(server.url).reset(task_id="dead-neurons", **row)
    with pytest.raises(ValueError, match="unknown level 'easiest'"):
        episode_dataset("dead-neurons", "easy,easiest")
    assert episode_dataset("dead-neurons,dead-neurons", "easy", [3, 4])["seed"] == [3, 4]
    assert trl_integration.LEVELS == LEVELS
    with pytest.raises(ToolRefused, match="no episode is running"):
        MechSandboxEnv(server.url).run_python("print(1)")


class StopsTheServer(Recording):
    """Once both rollouts of the group have started their episodes, the server goes away (stopped, as a crash or a
    redeploy would), so the tool calls and the rewards of running episodes meet a dead server."""

    server: ClassVar[Any] = None
    resets: ClassVar[int] = 0

    def reset(self, prompt: Any = None, **row: Any) -> str:
        text = super().reset(prompt, **row)
        StopsTheServer.resets += 1
        if StopsTheServer.resets == 2:
            StopsTheServer.server.stop()
        return text


def test_a_full_a_hung_and_a_gone_server_each_fail_fast_with_one_line(tmp_path) -> None:
    with running_server(tmp_path, MECHSANDBOX_SESSION_CAP="4") as doomed:
        # a full server: a fifth session waits capacity_wait_s, then fails naming the setting
        holders = [MechSandboxEnv(doomed.url) for _ in range(4)]
        for env in holders:
            env.reset(task_id="dead-neurons", seed=1)
        started = time.monotonic()
        with pytest.raises(McpError, match="MECHSANDBOX_SESSION_CAP"):
            MechSandboxEnv(doomed.url, capacity_wait_s=1.0).reset(task_id="dead-neurons", seed=1)
        assert time.monotonic() - started < 15
        assert [env.get_reward() for env in holders] == [FLOOR] * 4 and open_sessions(doomed.url) == 0

        # a hung server (SIGSTOP): the first call waits one timeout, every other call of the process fails at once,
        # and a reset probes it for a few seconds; once it answers again, resets work and what was left open closes
        first, second, third = (MechSandboxEnv(doomed.url) for _ in range(3))
        for env in (first, second, third):
            env.reset(task_id="dead-neurons", seed=1)
            env._rpc.http.timeout = httpx.Timeout(2.0)  # the hung calls only: set-up and recovery keep 120 s
        os.kill(doomed.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(ServerUnavailable, match="did not answer"):
                first.run_python("print(1)")
            assert 1.5 < time.monotonic() - started < 6  # one timeout
            started = time.monotonic()
            with pytest.raises(ServerUnavailable, match="did not answer"):
                second.describe_task()
            for env in (first, second):  # both met the dead server: never graded, so samples to drop, not a reward
                assert env.get_reward() is None and "did not answer" in (env.infrastructure_error or "")
            assert third.get_reward() == FLOOR  # no call after the hang: nothing graded, its close not waited on
            assert time.monotonic() - started < 1  # all at once: no second timeout, no close
            with pytest.raises(ServerUnavailable, match="health"):
                first.reset(task_id="dead-neurons", seed=1)
        finally:
            os.kill(doomed.process.pid, signal.SIGCONT)
        back = MechSandboxEnv(doomed.url)
        back.reset(task_id="dead-neurons", seed=1)
        assert "7" in back.run_python("print(7)") and back.get_reward() == FLOOR
        assert open_sessions(doomed.url) == 0  # the three left open while it hung were closed when it came back


def test_a_server_gone_mid_rollout_gives_samples_the_trainer_drops(tmp_path) -> None:
    """In GRPOTrainer, both episodes of the group start, then the server stops (a crash, a redeploy). Both rollouts
    are samples the trainer drops (reward None: no advantage, no logged reward), never the floor; the next reset
    finds the server still down and stops training with one line."""
    with running_server(tmp_path) as doomed:
        StopsTheServer.server, StopsTheServer.resets = doomed, 0
        started = time.monotonic()
        logged = grpo_step(lambda: StopsTheServer(doomed.url), ("run_python", {"code": "print(1)"}), tmp_path)
        assert time.monotonic() - started < 120
    assert StopsTheServer.resets == 2  # both episodes had started: the failure met the running rollouts
    assert [reward for _, reward in Recording.seen] == [None, None]
    mean = env_reward(logged)
    assert mean is None or math.isnan(mean)  # TRL left both out of its reward statistics (it logs NaN as None)
    with pytest.raises(ServerUnavailable, match="did not answer"):
        MechSandboxEnv(doomed.url)


def test_a_server_that_never_answers_times_out() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="did not answer"):
            MechSandboxEnv(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1.0)
        assert time.monotonic() - started < 10
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def test_a_draining_server_gives_a_rollout_the_trainer_drops(tmp_path) -> None:
    """A server stopping (SIGTERM with MECHSANDBOX_DRAIN_S, one live episode keeping it up) refuses new episodes as
    the infrastructure's ('draining'): reset tries again from a fresh session, then gives the rollout up, and its
    reward is None (dropped), never the floor; the live episode goes on and keeps its real reward."""
    with running_server(tmp_path, MECHSANDBOX_DRAIN_S="60", MECHSANDBOX_DRAIN_NOTICE_S="0") as server:
        live = MechSandboxEnv(server.url)
        live.reset(task_id="dead-neurons", seed=1)
        refused = MechSandboxEnv(server.url)  # built (and its health read) before the drain; retries twice (2 + 4 s)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/health", timeout=10).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        text = refused.reset(task_id="dead-neurons", seed=2)
        assert "could not be started" in text and "infrastructure error (draining)" in text
        with pytest.raises(InfrastructureError, match="draining"):
            refused.run_python("print(1)")  # TRL shows the model this line; nothing reaches the server
        assert refused.get_reward() is None and "draining" in (refused.infrastructure_error or "")
        assert "7" in live.run_python("print(7)") and live.get_reward() == FLOOR
