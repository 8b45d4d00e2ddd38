"""The Inspect task (integrations/inspect_task.py, issue 18) on a real server: an offline eval scores one sample per
instance with the server's grades, the registered task runs from the ``inspect eval`` CLI and its log opens in
``inspect view``, and the budget and bad tool calls reach the model as Inspect tool errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from server_harness import free_port, running_server

inspect_ai = pytest.importorskip("inspect_ai", reason="the [inspect] extra (in dev) is not installed")

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.log import read_eval_log  # noqa: E402
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ModelOutput, ModelUsage, get_model  # noqa: E402
from inspect_ai.tool import ToolCall  # noqa: E402
from mechsandbox.integrations.inspect_task import mechsandbox  # noqa: E402
from mechsandbox.models import MAX_CODE_BYTES  # noqa: E402
from mechsandbox.tasks import get_family  # noqa: E402

INSPECT = str(Path(sys.executable).with_name("inspect"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("inspect")) as s:
        yield s


def open_sessions(server) -> int:
    """Sessions the server holds (the samples' OpenEnv sessions): every sample closes its own."""
    return httpx.get(f"{server.url}/health", timeout=30).json()["sessions"]["websocket"]


def test_an_offline_eval_scores_one_sample_per_instance(server, tmp_path) -> None:
    task = mechsandbox(tasks="dead-neurons,additive-bypass", instances=2, first=3, url=server.url)
    [log] = inspect_eval(task, model="mechsandbox-reference/scripted", log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    saved = read_eval_log(log.location)
    ids = sorted(str(s.id) for s in saved.samples)
    assert ids == [f"{t}/easy/train/{n}" for t in ("additive-bypass", "dead-neurons") for n in (3, 4)]
    for sample in saved.samples:
        score = sample.scores["episode_score"]
        assert score.value >= 0.95 and score.explanation == "graded", (sample.id, score)
        assert 0 < score.metadata["step"] <= score.metadata["max_steps"]
        assert json.loads(score.answer) == {"variable": "answer"}
        tools = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
        assert tools and all(m.error is None for m in tools)
        assert sample.metadata["family"] == sample.id.split("/")[0]
    assert open_sessions(server) == 0


def test_the_cli_runs_the_registered_task_and_its_log_opens_in_inspect_view(server, tmp_path) -> None:
    env = {**os.environ, "MECHSANDBOX_URL": server.url}
    args = ["-T", "tasks=dead-neurons", "-T", "split=test", "--model", "mechsandbox-reference/scripted"]
    run = subprocess.run([INSPECT, "eval", "mechsandbox/mechsandbox", *args, "--log-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [path] = list(tmp_path.glob("*.eval"))
    [sample] = read_eval_log(str(path)).samples
    assert sample.id == "dead-neurons/easy/test/0" and sample.scores["episode_score"].value >= 0.95
    assert not any("truth:" in m.text for m in sample.messages)  # a test episode never shows its truth

    port = free_port()
    view = subprocess.Popen([INSPECT, "view", "--log-dir", str(tmp_path), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        listing = None
        deadline = time.time() + 60
        while time.time() < deadline and listing is None:
            try:
                listing = httpx.get(f"http://127.0.0.1:{port}/api/log-files", timeout=5).json()
            except httpx.HTTPError:
                time.sleep(0.3)
        assert listing is not None, "inspect view did not answer"
        [entry] = listing["files"]
        assert entry["name"].endswith(path.name)
        shown = httpx.get(f"http://127.0.0.1:{port}/api/logs/{quote(entry['name'], safe='')}", timeout=30)
        assert shown.status_code == 200 and shown.json()["results"]["scores"][0]["name"] == "episode_score"
    finally:
        view.terminate()
        view.wait(timeout=20)


def _scripted(turns: list) -> object:
    """A mockllm script: each turn one tool call ``(name, arguments)`` or a list of them in one message (explicit
    usage: mockllm would otherwise count tokens with an encoding it downloads)."""

    def output(turn: list[tuple[str, dict]]) -> ModelOutput:
        calls = [ToolCall(id=f"call-{i}", function=name, arguments=args) for i, (name, args) in enumerate(turn)]
        message = ChatMessageAssistant(content="", tool_calls=calls, model="mockllm/model")
        out = ModelOutput.from_message(message)
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return out

    return iter([output(turn if isinstance(turn, list) else [turn]) for turn in turns])


def test_refused_answers_let_the_agent_go_on_and_a_second_submission_is_refused(server, tmp_path) -> None:
    truth = get_family("dead-neurons").generate(0, "easy").truth["indices"]
    turns = [
        ("submit_answer", {"answer": "not a list"}),  # fits no schema: refused, one step spent, not graded
        ("submit_answer", {"variable": "nope"}),  # no such sandbox variable
        [("submit_answer", {"answer": truth}), ("submit_answer", {"answer": truth})],  # graded, then after the end
    ]
    model = get_model("mockllm/model", custom_outputs=_scripted(turns))
    [log] = inspect_eval(mechsandbox(tasks="dead-neurons", url=server.url), model=model, log_dir=str(tmp_path),
                         display="none")  # fmt: skip
    [sample] = log.samples
    tools = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
    assert [m.error is None for m in tools] == [False, False, True, False], [m.error for m in tools]
    # one line of reason; a refused answer adds the step it cost, as every run_python result does
    assert tools[0].error.message.startswith("invalid answer (not graded, counts as a step): index must be")
    assert tools[0].error.message.splitlines()[1:] == ["[step 1 of 10]"]
    assert "no variable named 'nope'" in tools[1].error.message.splitlines()[0]
    assert "episode is over" in tools[3].error.message and "\n" not in tools[3].error.message
    score = sample.scores["episode_score"]
    assert (score.value, score.explanation, score.metadata["step"]) == (0.99, "graded", 3)
    assert json.loads(score.answer) == {"answer": truth}
    assert open_sessions(server) == 0


def test_bad_calls_are_tool_errors_and_the_budget_ends_the_episode(server, tmp_path) -> None:
    bad: list = [
        ("run_python", {"code": 5}),  # wrong type
        ("run_python", {"code": "#" * (MAX_CODE_BYTES + 1)}),  # oversized
        ("run_python", {}),  # missing argument
        ("submit_answer", {}),  # neither answer nor variable
        ("no_such_tool", {}),  # unknown tool
    ]
    budget = 10  # dead-neurons' step budget
    runs = [("run_python", {"code": "print(1)"})] * budget
    model = get_model("mockllm/model", custom_outputs=_scripted(bad + runs + [("submit_answer", {"answer": [0]})]))
    [log] = inspect_eval(mechsandbox(tasks="dead-neurons", url=server.url), model=model, log_dir=str(tmp_path),
                         display="none")  # fmt: skip
    assert log.status == "success", log.error
    [sample] = log.samples
    tools = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
    errors = [m.error for m in tools[: len(bad)]]
    assert all(e is not None for e in errors), errors
    # Inspect checks the arguments against the tool's JSON schema itself (its own error form, type "parsing"); what
    # the schema allows but the server refuses comes back as the server's one line
    assert [e.type for e in errors] == ["parsing", "unknown", "parsing", "unknown", "parsing"], errors
    assert errors[1].message == f"run_python: code is larger than {MAX_CODE_BYTES} bytes"
    assert errors[3].message == "submit_answer: give exactly one of answer or variable"
    assert "no_such_tool" in errors[4].message
    assert all(m.error is None for m in tools[len(bad) :])
    assert len(tools) == len(bad) + budget  # the agent's loop stopped when the budget ended the episode
    score = sample.scores["episode_score"]
    assert score.explanation == "the step budget ran out" and score.value == pytest.approx(0.01)
    assert score.metadata["step"] == budget  # the refused calls spent nothing
    assert open_sessions(server) == 0


def _outputs_that_kill(server, before: list, after: list):
    """The mockllm turns ``before``, then the server is killed (SIGKILL: a crash, an OOM kill), then ``after``."""
    yield from _scripted(before)
    server.process.kill()
    server.process.wait(timeout=30)
    yield from _scripted(after)


def test_a_server_lost_mid_sample_is_the_samples_infrastructure_error_never_a_score(tmp_path) -> None:
    """The server dies after the sample's first snippet: the next tool call raises InfrastructureError (connection),
    which Inspect records as the sample's error (no score, so in no metric) and retries with --retry-on-error; the
    retry cannot start its episode either (nobody listens) and fails the same way, before its first observation."""
    with running_server(tmp_path) as doomed:
        turns = _outputs_that_kill(doomed, [("run_python", {"code": "print(6 * 7)"})],
                                   [("run_python", {"code": "print(1)"})])  # fmt: skip
        model = get_model("mockllm/model", custom_outputs=turns)
        [log] = inspect_eval(mechsandbox(tasks="dead-neurons", url=doomed.url), model=model, log_dir=str(tmp_path),
                             display="none", retry_on_error=1)  # fmt: skip
    assert log.status == "error"
    [sample] = read_eval_log(log.location).samples
    assert not sample.scores  # never scored: not the floor, nothing for a metric to average
    assert sample.error is not None and "InfrastructureError" in sample.error.traceback
    assert "infrastructure error (connection)" in sample.error.message
    assert [e.message for e in sample.error_retries or []] and all(
        "infrastructure error (connection)" in e.message for e in sample.error_retries or []
    )  # the first attempt's error, retried by Inspect


def test_mcp_errors_that_name_the_infrastructure_map_to_it() -> None:
    """The wire form of docs/CONTRACT.md (a JSON-RPC error with INFRA_RPC_CODE and data naming the side; a tool
    error from a server that refused the call for its own reason) against refusals that are the agent's."""
    from mechsandbox.integrations.mcp_client import McpError, ServerUnavailable
    from mechsandbox.integrations.mcp_infra import infrastructure_error, refused_by_infrastructure
    from mechsandbox.protocol import INFRA_CODE, INFRA_RPC_CODE, InfrastructureError, infra_message

    text = infra_message("generation", "the instance took too long")
    named = infrastructure_error(McpError(f"tools/call: {text} (code {INFRA_RPC_CODE})", INFRA_RPC_CODE,
                                          {"code": INFRA_CODE, "side": "generation"}), started=False)  # fmt: skip
    assert isinstance(named, InfrastructureError) and named.side == "generation" and not named.started
    assert str(named).startswith("infrastructure error (generation): the instance took too long")
    gone = infrastructure_error(ServerUnavailable("tools/call: the server did not answer"), started=True)
    assert gone is not None and gone.side == "connection" and gone.started
    assert infrastructure_error(McpError("tools/call: unknown session (code -32602)", -32602), started=True) is None
    assert refused_by_infrastructure("start_episode", f"start_episode: {text}") == "generation"
    assert refused_by_infrastructure("run_python", f"1\n{text}") is None  # a result's notice, not a refusal
    assert refused_by_infrastructure("run_python", "run_python: code is larger than 65536 bytes") is None


def test_a_draining_server_refuses_the_sample_as_an_infrastructure_error(tmp_path) -> None:
    """A server stopping (SIGTERM with MECHSANDBOX_DRAIN_S, one live episode keeping it up) refuses a new episode as
    the infrastructure's: the sample's start fails before its first observation with the side 'draining', and
    the sample has an error and no score, not the floor."""
    from mechsandbox.integrations.mcp_client import SyncRpc

    with running_server(tmp_path, MECHSANDBOX_DRAIN_S="60", MECHSANDBOX_DRAIN_NOTICE_S="0") as server:
        live = SyncRpc(server.url, 60)
        session = live("openenv/session/create", {})["session_id"]
        live("tools/call", {"name": "start_episode", "arguments": {"task_id": "dead-neurons", "seed": 1},
                            "session_id": session})  # fmt: skip
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/health", timeout=10).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        [log] = inspect_eval(mechsandbox(tasks="dead-neurons", url=server.url), model="mechsandbox-reference/scripted",
                             log_dir=str(tmp_path), display="none")  # fmt: skip
        live("openenv/session/close", {"session_id": session})
        live.close()
    [sample] = read_eval_log(log.location).samples
    assert log.status == "error" and not sample.scores
    assert sample.error is not None and "infrastructure error (draining)" in sample.error.message
    assert "protocol.InfrastructureError" in sample.error.traceback  # the named exception, not a refusal's McpError
