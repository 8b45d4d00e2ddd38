"""The tool-calling surface (server/tools.py, issue 18): four schema'd tools over a real environment, a real
sandbox and the real episode rules (budget, one graded submission, train-only truth), and a one-line refusal for
every kind of bad call."""

from __future__ import annotations

import pytest
from mechsandbox.models import MAX_CODE_BYTES
from mechsandbox.server.mechsandbox_environment import MechSandboxEnvironment
from mechsandbox.server.service import Service
from mechsandbox.server.settings import ServerSettings
from mechsandbox.server.tools import EpisodeTools, ToolError

TASK = {"task_id": "dead-neurons", "seed": 5}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    settings = ServerSettings(test_salt="tools-test", public_salt=True, practice=True,
                              data_dir=str(tmp_path_factory.mktemp("results")))
    svc = Service(settings).start()
    yield svc
    svc.stop()


@pytest.fixture
def tools(service):
    env = MechSandboxEnvironment(service)
    yield EpisodeTools(env)
    env.close()


def test_the_four_tools_are_listed_with_object_schemas() -> None:
    specs = {spec["name"]: spec for spec in EpisodeTools.specs()}
    assert list(specs) == ["start_episode", "run_python", "submit_answer", "describe_task"]
    for spec in specs.values():
        schema = spec["inputSchema"]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert len(spec["description"]) > 40 and "\n" not in spec["description"]
    start = specs["start_episode"]["inputSchema"]["properties"]
    assert {"task_id", "level", "split", "seed", "index", "run_token"} <= set(start)
    assert "episode_id" not in start and "task_level" not in start
    assert specs["run_python"]["inputSchema"]["required"] == ["code"]
    assert set(specs["submit_answer"]["inputSchema"]["properties"]) == {"answer", "variable"}


def test_a_train_episode_is_played_to_a_graded_score(tools) -> None:
    started = tools.call("start_episode", TASK)
    assert "Answer schema (JSON)" in started.text and "step budget" in started.text
    assert started.observation["task_id"] == "dead-neurons" and not started.done
    ran = tools.call("run_python", {"code": "print(6 * 7)"})
    assert ran.text.startswith("42") and ran.text.rstrip().endswith(f"[step 1 of {started.observation['max_steps']}]")
    truth = tools.env.episode.truth
    described = tools.call("describe_task", {})
    assert "[step 1 of" in described.text and described.observation["step"] == 1  # free: no step spent
    graded = tools.call("submit_answer", {"answer": truth["indices"]})
    assert graded.done and graded.observation["score"] == pytest.approx(0.99)
    assert "graded: score 0.990" in graded.text and "truth:" in graded.text  # train: revealed after the end
    assert "[episode over: the answer was graded; score 0.990]" in graded.text
    with pytest.raises(ToolError, match="episode is over"):
        tools.call("submit_answer", {"answer": truth["indices"]})  # one graded submission
    assert "episode over" in tools.call("describe_task", {}).text


def test_a_sandbox_variable_can_be_submitted(tools) -> None:
    tools.call("start_episode", TASK)
    truth = tools.env.episode.truth["indices"]
    tools.call("run_python", {"code": f"answer = {truth!r}"})
    graded = tools.call("submit_answer", {"variable": "answer"})
    assert graded.observation["score"] == pytest.approx(0.99)


def test_the_step_budget_ends_the_episode_at_the_floor(tools) -> None:
    budget = tools.call("start_episode", TASK).observation["max_steps"]
    for _ in range(budget):
        result = tools.call("run_python", {"code": "print(1)"})
    assert result.done and result.observation["truncated"]
    assert "[episode over: the step budget ran out; score 0.010]" in result.text
    assert "truth:" in result.text and "truth:" in tools.call("describe_task", {}).text  # train: after any end
    with pytest.raises(ToolError, match="episode is over; call start_episode"):
        tools.call("run_python", {"code": "print(1)"})


def test_a_test_episode_shows_no_truth(tools) -> None:
    tools.call("start_episode", {"task_id": "dead-neurons", "split": "test", "index": 0})
    graded = tools.call("submit_answer", {"answer": [0]})
    assert graded.done and "truth:" not in graded.text and graded.observation.get("truth") is None


def test_an_invalid_answer_is_refused_without_a_grade_and_costs_a_step(tools) -> None:
    tools.call("start_episode", TASK)
    result = tools.call("submit_answer", {"answer": "not a list"})
    assert not result.done and "invalid answer" in result.text and result.observation["step"] == 1


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("reset", {}, "unknown tool 'reset'"),
        ("run_python", {}, "run_python: code: Field required"),
        ("run_python", {"code": 5}, "run_python: code: Input should be a valid string"),
        ("run_python", {"code": "print(1)", "timeout": 3}, "timeout: Extra inputs are not permitted"),
        ("run_python", {"code": "#" * (MAX_CODE_BYTES + 1)}, f"larger than {MAX_CODE_BYTES} bytes"),
        ("run_python", ["print(1)"], "the arguments must be a JSON object"),
        ("submit_answer", {}, "exactly one of answer or variable"),
        ("submit_answer", {"answer": [1], "variable": "x"}, "exactly one of answer or variable"),
        ("describe_task", {"verbose": True}, "verbose: Extra inputs are not permitted"),
        ("start_episode", {"episode_id": "x"}, "unexpected argument 'episode_id'"),
        ("start_episode", {"seed": "5"}, "seed: Input should be a valid integer"),
        ("start_episode", {"split": "test", "seed": 1}, "not seed"),
        ("start_episode", {"task_id": "no-such-family"}, "start_episode: "),
        ("submit_answer", {"answer": [float("nan")]}, "submit_answer: solution_target: numbers"),
    ],
)
def test_bad_calls_are_one_line_refusals(tools, name, arguments, message) -> None:
    tools.call("start_episode", TASK)
    step = tools.env.episode.step_count
    with pytest.raises(ToolError) as caught:
        tools.call(name, arguments)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert tools.env.episode.step_count == step  # a refused call spends nothing


def test_tools_before_an_episode_say_so(tools) -> None:
    for name, arguments in (("run_python", {"code": "print(1)"}), ("describe_task", {}),
                            ("submit_answer", {"answer": [1]})):  # fmt: skip
        with pytest.raises(ToolError, match="call start_episode first"):
            tools.call(name, arguments)
