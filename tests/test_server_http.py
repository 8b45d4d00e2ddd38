"""Wire contract over plain HTTP: stateful episodes, episode rules, splits, hostile input, routes."""

from __future__ import annotations

import json
import re

import pytest
from mechsandbox import BENCHMARK_VERSION
from mechsandbox.server.splits import heldout_seed
from mechsandbox.tasks import families, get_family
from server_harness import running_server

SALT = "test-salt-for-the-suite"
OBS_FIELDS = {
    "episode_id", "task_id", "level", "split", "instance_id", "step", "max_steps", "stdout_or_error", "error",
    "output_truncated", "truncated", "score", "namespace_reset", "prompt", "answer_schema", "answer_example",
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("http"), MECHSANDBOX_TEST_SALT=SALT) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with server.http() as client:
        yield client


def reset(http, **params) -> dict:
    response = http.post("/reset", json=params)
    assert response.status_code == 200, response.text
    return response.json()


def step(http, episode_id: str, **action) -> dict:
    response = http.post("/step", json={"action": action, "episode_id": episode_id})
    assert response.status_code == 200, response.text
    return response.json()


def test_empty_reset_gives_the_default_task(http) -> None:
    for body in (None, {}):
        response = http.post("/reset", json=body) if body is not None else http.post("/reset")
        assert response.status_code == 200
        data = response.json()
        obs = data["observation"]
        assert set(obs) >= OBS_FIELDS
        assert obs["task_id"] == "dead-neurons" and obs["split"] == "train" and obs["step"] == 0
        assert obs["prompt"] and obs["answer_schema"]["type"] and obs["max_steps"] > 0
        assert data["done"] is False and data["reward"] is None
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", data["episode_id"])  # 128 bits, urlsafe


def test_every_prompt_ends_with_the_namespace_guide(http) -> None:
    """An agent that never saw MechSandbox learns the namespace from the prompt: every task's prompt ends with
    the common lines (reset_model, imports), a transformer task's with the TransformerLens lines too."""
    mlp = reset(http, task_id="dead-neurons", seed=3)["observation"]["prompt"]
    transformer = reset(http, task_id="induction-circuit", seed=3)["observation"]["prompt"]
    for prompt in (mlp, transformer):
        assert "reset_model()" in prompt and "einops" in prompt and prompt.index("reset_model()") > len(prompt) // 2
    assert "model.OV" in transformer and "model.OV" not in mlp
    for prompt in (mlp, transformer):  # the snippet limit is CPU time of its own, said so (issue 52)
        assert re.search(r"may use [0-9.]+ s of CPU time: only its own computation counts", prompt)


def test_http_episode_is_stateful(http) -> None:
    data = reset(http, task_id="task1", seed=11, task_level="medium", episode_id="client-chosen")
    eid = data["episode_id"]
    assert eid != "client-chosen" and data["observation"]["level"] == "medium"
    first = step(http, eid, python_code="kept = 41\nprint('set')")
    assert first["observation"]["stdout_or_error"] == "set\n" and first["reward"] == 0.01
    second = step(http, eid, python_code="print(kept + 1)")
    assert second["observation"]["stdout_or_error"] == "42\n" and second["observation"]["step"] == 2
    state = http.get("/state", params={"episode_id": eid}).json()
    assert state["step_count"] == 2 and state["done"] is False and state["task_id"] == "dead-neurons"


@pytest.mark.parametrize(
    "attack,pattern",
    [
        (  # issue #14, class 1: a library function's globals copied by name into the snippet's
            "import functools, statistics\ndef f():\n    pass\n"
            "functools.wraps(statistics.mean, updated=('__globals__',))(f)",
            r"unexpected keyword argument 'updated'",
        ),
        (  # class 2: a view at a negative offset of a small array
            "a = np.zeros(2)\nprint(np.ndarray((4,), np.float64, a, -8))",
            r"numpy\.ndarray\(\.\.\.\) is refused: buffer, offset and strides are raw memory",
        ),
        ("print(np.ndarray(shape=(8,), dtype=np.uint8, buffer=b'secret!!'))", r"ndarray\(\.\.\.\) is refused"),
    ],
)
def test_layer_escape_classes_are_refused_in_one_line(http, attack: str, pattern: str) -> None:
    eid = reset(http, task_id="dead-neurons", seed=3)["episode_id"]
    refused = step(http, eid, python_code=attack)["observation"]
    assert refused["error"] and "\n" not in refused["error"].strip() and re.search(pattern, refused["error"]), refused
    after = step(http, eid, python_code="print(open)")["observation"]
    assert "NameError" in after["error"] and not after["namespace_reset"]


def test_graded_submission_ends_the_episode_and_reveals_truth_on_train(http) -> None:
    truth = get_family("dead-neurons").generate(12, "easy").truth
    eid = reset(http, task_id="dead-neurons", seed=12)["episode_id"]
    graded = step(http, eid, solution_target=truth["indices"])
    obs = graded["observation"]
    assert graded["done"] is True and 0.95 <= graded["reward"] <= 0.99 and obs["score"] == graded["reward"]
    assert obs["truth"] == truth and obs["feedback"]
    after = http.post("/step", json={"action": {"python_code": "print(1)"}, "episode_id": eid})
    assert after.status_code == 409 and "episode is over" in after.json()["detail"]


def test_wrong_answer_scores_low_and_no_feedback_before_the_end(http) -> None:
    eid = reset(http, task_id="dead-neurons", seed=13)["episode_id"]
    code = step(http, eid, python_code="print(1)")["observation"]
    assert code["score"] is None and code["truth"] is None and code["feedback"] is None
    graded = step(http, eid, solution_target=[0])
    assert graded["done"] and 0.01 <= graded["reward"] < 0.5


def test_malformed_answer_costs_a_step_and_does_not_end(http) -> None:
    eid = reset(http, task_id="dead-neurons", seed=14)["episode_id"]
    for bad in ([10**6], "three", [[1]]):
        obs = step(http, eid, solution_target=bad)
        assert obs["done"] is False and obs["reward"] == 0.01 and obs["observation"]["error"]
    assert http.get("/state", params={"episode_id": eid}).json()["step_count"] == 3


def test_solution_from_grades_a_sandbox_variable(http) -> None:
    truth = get_family("dead-neurons").generate(15, "easy").truth
    eid = reset(http, task_id="dead-neurons", seed=15)["episode_id"]
    step(http, eid, python_code=f"answer = torch.tensor({truth['indices']})")
    graded = step(http, eid, solution_from="answer")
    assert graded["done"] and graded["reward"] >= 0.95
    eid = reset(http, task_id="dead-neurons", seed=15)["episode_id"]
    missing = step(http, eid, solution_from="nothing_here")
    assert missing["done"] is False and "no variable" in missing["observation"]["error"]


def test_step_budget_ends_at_the_floor(http) -> None:
    data = reset(http, task_id="dead-neurons", seed=16)
    eid, budget = data["episode_id"], data["observation"]["max_steps"]
    for i in range(budget):
        obs = step(http, eid, python_code="print(1)")
        assert obs["done"] is (i == budget - 1)
    assert obs["observation"]["truncated"] is True and obs["reward"] == 0.01 and obs["observation"]["score"] == 0.01
    assert http.post("/step", json={"action": {"python_code": "1"}, "episode_id": eid}).status_code == 409


def test_test_split_hides_seed_and_truth(http) -> None:
    token = http.post("/runs", json={"agent": "test_server_http"}).json()["run_token"]  # a fixed salt needs a run
    data = reset(http, task_id="dead-neurons", split="test", index=3, level="easy", run_token=token)
    obs = data["observation"]
    seed = heldout_seed(SALT.encode(), "dead-neurons", "easy", 3)
    assert obs["split"] == "test" and obs["instance_id"].startswith("test-")
    assert str(seed) not in json.dumps(data) and str(seed) not in obs["instance_id"]
    truth = get_family("dead-neurons").generate(seed, "easy").truth
    graded = step(http, data["episode_id"], solution_target=truth["indices"])
    assert graded["done"] and graded["reward"] == 0.01  # a counted attempt on a fixed salt is sealed (issue 55)
    assert graded["observation"]["score"] is None and "sealed" in graded["observation"]["stdout_or_error"]
    assert graded["observation"]["truth"] is None and graded["observation"]["feedback"] is None
    again = reset(http, task_id="dead-neurons", split="test", index=3, level="easy", run_token=token)["observation"]
    assert again["instance_id"] == obs["instance_id"] and again["prompt"] == obs["prompt"]
    state = http.get("/state", params={"episode_id": data["episode_id"]}).json()
    assert str(seed) not in json.dumps(state)


@pytest.mark.parametrize(
    ("body", "status", "pattern"),
    [
        ({"action": {"python_code": "1", "solution_target": [1]}}, 422, "exactly one"),
        ({"action": {}}, 422, "exactly one"),
        ({"action": {"code": "1"}}, 422, "code"),
        ({"action": "print(1)"}, 422, "action must be an object"),
        ({"action": {"solution_target": [1, 2], "metadata": {}}, "extra": 1}, 200, ""),
    ],
)
def test_action_shapes(http, body: dict, status: int, pattern: str) -> None:
    eid = reset(http, task_id="dead-neurons", seed=17)["episode_id"]
    response = http.post("/step", json={**body, "episode_id": eid})
    assert response.status_code == status, response.text
    if pattern:
        detail = response.json()["detail"]
        assert pattern in detail and "\n" not in detail


def test_nan_and_huge_answers_are_rejected_before_grading(http) -> None:
    eid = reset(http, task_id="dead-neurons", seed=18)["episode_id"]
    raw = '{"action": {"solution_target": [NaN]}, "episode_id": "EID"}'.replace("EID", eid)
    response = http.post("/step", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "finite" in response.json()["detail"]
    assert response.json()["detail"].count("solution_target") == 1, response.json()["detail"]  # named once
    zeros = ",".join(["0"] * 120_000)
    many = '{"action": {"solution_target": [ZEROS]}, "episode_id": "EID"}'.replace("ZEROS", zeros).replace("EID", eid)
    response = http.post("/step", content=many, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "more than" in response.json()["detail"]
    assert http.get("/state", params={"episode_id": eid}).json()["step_count"] == 0


@pytest.mark.parametrize(
    ("path", "content", "status", "pattern"),
    [
        ("/step", b'{"action": {"python_code": "1"}}', 400, "episode_id"),
        ("/step", b'{"action": {"python_code": "1"}, "episode_id": "nope"}', 404, "unknown or expired"),
        ("/step", b"{not json", 400, "not valid JSON"),
        ("/reset", b"[1, 2]", 400, "JSON object"),
        ("/reset", b'{"task_id": "no-such-task"}', 400, "unknown task_id"),
        ("/reset", b'{"level": "extreme"}', 400, "level must be"),
        ("/reset", b'{"seed": -1}', 400, "seed must be"),
        ("/reset", b'{"seed": "7"}', 400, "seed must be"),
        ("/reset", b'{"split": "test", "index": 100000}', 400, "index must be"),
        ("/reset", b'{"split": "test", "seed": 5}', 400, "chosen by index"),
        ("/reset", b'{"colour": "red"}', 400, "unknown reset fields"),
        ("/reset", b"[" * 5000 + b"]" * 5000, 422, "nested deeper"),
        ("/reset", b'{"x": "' + b"a" * 300_000 + b'"}', 413, "larger than"),
        ("/dead-neurons/tasks", b"[" * 5000, 422, "nested deeper"),
    ],
)
def test_hostile_requests_get_one_line_4xx(http, path: str, content: bytes, status: int, pattern: str) -> None:
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert pattern in detail and "\n" not in detail and "Traceback" not in detail


def test_state_needs_a_known_episode(http) -> None:
    assert http.get("/state").status_code == 400
    assert http.get("/state", params={"episode_id": "x" * 22}).status_code == 404


def test_health_reports_isolation(http) -> None:
    health = http.get("/health").json()
    assert health["status"] == "healthy"
    assert health["isolation"]["landlock"] == health["isolation"]["seccomp"] == "active"
    assert health["test_salt"] == "fixed" and health["benchmark_version"] == BENCHMARK_VERSION


def test_tasks_and_metadata_carry_versions(http) -> None:
    tasks = http.get("/tasks").json()
    assert tasks["benchmark_version"] == BENCHMARK_VERSION
    by_id = {t["id"]: t for t in tasks["tasks"]}
    for fam in families():
        card = by_id[fam.id]
        assert card["family_version"] == fam.family_version and card["answer_schema"] and card["max_steps"]
    meta = http.get("/metadata").json()
    assert meta["name"] == "mechsandbox" and meta["version"] == BENCHMARK_VERSION
    assert all(f"{f.id}={f.family_version}" in meta["description"] for f in families())


def test_openenv_routes_answer(http) -> None:
    schema = http.get("/schema").json()
    assert {"python_code", "solution_target", "solution_from"} <= set(schema["action"]["properties"])
    assert "stdout_or_error" in schema["observation"]["properties"]
    mcp = http.post("/mcp", json={})
    assert mcp.status_code == 200 and mcp.json()["jsonrpc"] == "2.0"
    assert http.get("/openapi.json").json()["info"]["version"] == BENCHMARK_VERSION


def test_task_api_never_answers_501(http) -> None:
    splits = http.get("/mechsandbox/splits").json()
    assert [s["name"] for s in splits] == ["train", "test"]
    n = http.post("/mechsandbox/num_tasks", json={"split": "test"}).json()["num_tasks"]
    assert n == 3 * len(families())
    task = http.post("/mechsandbox/task", json={"split": "test", "index": 4}).json()["task"]
    assert task["reset"]["split"] == "test" and task["level"] in ("easy", "medium", "hard")
    tasks = http.post("/mechsandbox/tasks", json={"split": "train"}).json()["tasks"]
    assert len(tasks) == n
    rng = http.post("/mechsandbox/task_range", json={"split": "train", "start": 2, "stop": 5}).json()["tasks"]
    assert [t["index"] for t in rng] == [2, 3, 4]
    assert http.post("/mechsandbox/task", json={"split": "test", "index": 999}).status_code == 400
