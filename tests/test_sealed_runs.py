"""Sealed runs (issue 55): many runs are no oracle either.

An earlier audit registered one run per look and bisected a test instance's answer with each run's counted reward.
Here a counted attempt on a fixed-salt server shows the floor, every route shows an unfinished run's coverage only,
and a finished run publishes dithered aggregates (``results.leaderboard.publish``). One in-process server with four
bearer tokens: ``tokA`` and ``tokB`` grouped into the submitter ``team``, ``tokC`` an attacker, ``tokD`` a contestant.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mechsandbox.protocol import FLOOR, clamp
from mechsandbox.results.leaderboard import QUANTA, publish, quantum_for
from mechsandbox.results.store import Attempt, RunInfo
from mechsandbox.server.app import create_app
from mechsandbox.server.service import Service
from mechsandbox.server.settings import ServerSettings
from mechsandbox.server.splits import heldout_ref
from mechsandbox.tasks import LEVELS, families, generate, grade

SALT = "sealed-runs-salt-0123456789"
TASK = "dead-neurons"
QUOTA = 3
STANDARD = 2


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[Service]:
    settings = ServerSettings(test_salt=SALT, data_dir=str(tmp_path_factory.mktemp("results")), run_quota=QUOTA,
                              api_tokens=("tokA", "tokB", "tokC", "tokD"), submitters="team=tokA,tokB",
                              standard_set=STANDARD)  # fmt: skip
    service = Service(settings)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def http(service: Service) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def register(http: TestClient, token: str, agent: str = "agent") -> dict[str, Any]:
    response = http.post("/runs", json={"agent": agent}, headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


def play(http: TestClient, token: str, run: dict[str, Any], index: int, answer: Any) -> dict[str, Any]:
    """One counted attempt: every observation and route a client can read about it, until its run finishes."""
    body = {"task_id": TASK, "split": "test", "level": "easy", "index": index, "run_token": run["run_token"]}
    reset = http.post("/reset", json=body, headers=auth(token)).json()
    step = http.post("/step", json={"episode_id": reset["episode_id"], "action": {"solution_target": answer}},
                     headers=auth(token)).json()  # fmt: skip
    state = http.get("/state", params={"episode_id": reset["episode_id"]}, headers=auth(token)).json()
    return {"reset": reset, "step": step, "state": state}


def finish(http: TestClient, token: str, run: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"/runs/{run['run_id']}/finish", json={"run_token": run["run_token"]}, headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


def instance(index: int) -> Any:
    return generate(TASK, heldout_ref(SALT.encode(), TASK, "easy", index).seed, "easy")


def score_of(index: int, answer: Any) -> float:
    made = instance(index)
    return clamp(grade(TASK, answer, made.truth, made).score)


def scrub(value: Any, run: dict[str, Any]) -> Any:
    """What differs between two runs by construction (ids, tokens, times, agent names), blanked for comparison."""
    if isinstance(value, dict):
        skipped = ("episode_id", "resume_token", "created_at", "run_id", "page", "agent", "rank")
        return {k: scrub(v, run) for k, v in value.items() if k not in skipped}
    if isinstance(value, list):
        return [scrub(v, run) for v in value]
    if isinstance(value, str):
        return value.replace(run["run_id"], "RUN")
    return value


def entry_of(http: TestClient, token: str, run_id: str) -> dict[str, Any]:
    return http.get(f"/runs/{run_id}", headers=auth(token)).json()


def test_true_and_wrong_answers_read_the_same_on_every_route_until_finished(http: TestClient) -> None:
    truth = sorted(instance(0).truth["indices"])
    right, wrong = register(http, "tokD", "same"), register(http, "tokD", "same")
    seen = []
    for run, answer in ((right, truth), (wrong, [max(truth) + 1])):
        routes = play(http, "tokD", run, 0, answer)
        routes["entry"] = entry_of(http, "tokD", run["run_id"])
        routes["board"] = next(r for r in http.get("/leaderboard", headers=auth("tokD")).json()["runs"]
                               if r["run_id"] == run["run_id"])  # fmt: skip
        routes["web"] = http.get(f"/web/runs/db/{run['run_id']}", headers=auth("tokD")).text
        seen.append(scrub(routes, run))
    assert seen[0] == seen[1]
    assert seen[0]["step"]["reward"] == FLOOR and seen[0]["step"]["observation"]["score"] is None
    assert seen[0]["step"]["done"] is True and "sealed" in seen[0]["step"]["observation"]["stdout_or_error"]
    assert seen[0]["entry"]["overall"] is None and seen[0]["entry"]["status"] == "sealed"
    assert "sealed" in seen[0]["web"]


def test_an_attacker_cannot_isolate_an_answer_within_the_daily_cap(http: TestClient) -> None:
    """One client registers runs until the quota stops it, plays one candidate answer to one instance per run,
    finishes each and reads everything; every candidate stays consistent with everything it read."""
    truth = sorted(instance(1).truth["indices"])
    guesses = [truth, [max(truth) + 1], truth[:-1] or [max(truth) + 2]]
    scores = [score_of(1, g) for g in guesses]
    assert scores[0] == 0.99 and min(scores) < 0.5  # the candidates differ a lot in truth
    cells = len(families()) * len(LEVELS) * STANDARD
    observations = []
    for guess in guesses:
        run = register(http, "tokC")
        routes = play(http, "tokC", run, 1, guess)
        assert routes["step"]["reward"] == FLOOR and routes["state"]["score"] is None
        observations.append(finish(http, "tokC", run))
    refused = http.post("/runs", json={"agent": "one more look"}, headers=auth("tokC"))
    assert refused.status_code == 429  # the daily cap, whatever the address (loopback included)
    for published in observations:
        shown = {"overall": published["overall"], "family": published["families"][TASK]["mean"],
                 "level": published["levels"]["easy"]["mean"]}  # fmt: skip
        sizes = {"overall": cells, "family": len(LEVELS) * STANDARD, "level": len(families()) * STANDARD}
        for kind, n in sizes.items():
            quantum = quantum_for(kind, n)
            assert published["precision"][kind] == quantum and (1 - 2 * FLOOR) / n <= quantum / 4
            for candidate in scores:  # every candidate lies as near every published value as the precision allows
                mean = (candidate + FLOOR * (n - 1)) / n
                assert abs(shown[kind] - mean) < quantum * 1.25


def test_grouped_tokens_are_one_submitter_with_one_quota(http: TestClient) -> None:
    truth = sorted(instance(0).truth["indices"])
    first, second = register(http, "tokA", "team-1"), register(http, "tokB", "team-2")
    assert first["submitter"] == second["submitter"] == "team"
    a, b = play(http, "tokA", first, 0, truth), play(http, "tokB", second, 0, [max(truth) + 1])
    assert scrub(a, first) == scrub(b, second)  # grouped or not, the true and the wrong answer read the same
    finish(http, "tokA", first)
    register(http, "tokA", "team-3")
    assert http.post("/runs", json={"agent": "team-4"}, headers=auth("tokB")).status_code == 429
    board = http.get("/leaderboard", headers=auth("tokC")).json()["runs"]
    team = [r for r in board if r["submitter"] == "team"]
    assert len(team) == 3 and {r["submitter_finished_runs"] for r in team} == {1}
    assert {r["status"] for r in team} == {"finished", "sealed"}
    assert all(r["submitter"] != "team" for r in board if r["agent"].startswith("same"))


def test_a_finished_run_is_immutable_and_withdrawal_only_marks_it(http: TestClient) -> None:
    run = register(http, "tokD", "withdrawn")
    first = finish(http, "tokD", run)
    assert finish(http, "tokD", run) == first
    assert http.post(f"/runs/{run['run_id']}/finish", json={"run_token": "mst_forged"},
                     headers=auth("tokD")).status_code == 403  # fmt: skip
    withdrawn = http.post(f"/runs/{run['run_id']}/withdraw", json={"run_token": run["run_token"]},
                          headers=auth("tokD")).json()  # fmt: skip
    assert withdrawn["status"] == "withdrawn" and withdrawn["overall"] == first["overall"]
    assert withdrawn["rank"] is None
    assert any(r["run_id"] == run["run_id"] for r in http.get("/leaderboard", headers=auth("tokD")).json()["runs"])


def test_one_answer_moves_a_published_aggregate_by_at_most_its_precision() -> None:
    """Two runs alike but for one answer (0.01 against 0.99): under any dither each published cell differs by at
    most one quantum, and at most one quantum from its exact mean."""
    run = RunInfo("run-x", "a", "", "", "fp", "0.1.0", 20, 1.0)
    standard = {f.id: f.family_version for f in families()}
    rng = random.Random(55)
    rows = [Attempt(i, "run-x", t, v, lv, k, f"{t}/{lv}/{k}", "graded", rng.uniform(0.01, 0.99), 3, 1.0, 0.0, 1.0)
            for i, (t, v, lv, k) in enumerate((t, v, lv, k) for t, v in standard.items() for lv in LEVELS
                                              for k in range(20))]  # fmt: skip
    changed = list(rows)
    low, high = rows[0], rows[0]
    changed[0] = Attempt(*[*(getattr(low, f) for f in ("id", "run_id", "task_id", "family_version", "level",
                                                     "instance_index", "instance_id", "status")), 0.99,
                           3, 1.0, 0.0, 1.0])  # fmt: skip
    rows[0] = Attempt(*[*(getattr(high, f) for f in ("id", "run_id", "task_id", "family_version", "level",
                                                    "instance_index", "instance_id", "status")), 0.01,
                        3, 1.0, 0.0, 1.0])  # fmt: skip
    for _ in range(50):
        draws: dict[str, float] = {}

        def dither(cell: str, draws: dict[str, float] = draws) -> float:  # the same dither for both runs
            return draws.setdefault(cell, rng.random())

        one, two = publish(run, rows, standard, LEVELS, dither), publish(run, changed, standard, LEVELS, dither)
        assert abs(one["overall"]["mean"] - two["overall"]["mean"]) <= QUANTA["overall"] + 1e-9
        for task in standard:
            assert abs(one["families"][task]["mean"] - two["families"][task]["mean"]) <= QUANTA["family"] + 1e-9
        for level in LEVELS:
            assert abs(one["levels"][level]["mean"] - two["levels"][level]["mean"]) <= QUANTA["level"] + 1e-9
    exact = sum(a.score for a in rows) / len(rows)
    assert abs(publish(run, rows, standard, LEVELS, lambda _: 0.999)["overall"]["mean"] - exact) < QUANTA["overall"]


def test_practice_instances_are_disjoint_from_the_standard_set(service: Service) -> None:
    """A run-less test reset on a fixed salt (practice) plays its own instances: never a standard-set one."""
    from mechsandbox.server.splits import practice_ref

    salt = SALT.encode()
    counted = {(r.seed, r.instance_id) for f in families() for lv in LEVELS for k in range(20)
               for r in [heldout_ref(salt, f.id, lv, k)]}  # fmt: skip
    practice = [practice_ref(salt, f.id, lv, k) for f in families() for lv in LEVELS for k in range(100)]
    assert not {r.seed for r in practice} & {seed for seed, _ in counted}
    assert not {r.instance_id for r in practice} & {name for _, name in counted}
    assert all(r.instance_id.startswith("practice-") for r in practice)
    for index in range(STANDARD):
        ref = service.resolve({"task_id": TASK, "split": "test", "level": "easy", "index": index})
        assert ref == practice_ref(salt, TASK, "easy", index)
        assert service.resolve({"task_id": TASK, "split": "test", "level": "easy", "index": index,
                                "run_token": "mst_x"}) == heldout_ref(salt, TASK, "easy", index)  # fmt: skip


def test_a_configured_eval_folder_of_a_test_run_shows_no_answer(tmp_path) -> None:
    """A real ``mechsandbox eval --split test`` folder (its own random-salt server: the episodes hold their answers
    and instance ids), configured in MECHSANDBOX_RUN_DIRS: no page of the viewer shows an answer or an instance id."""
    import json
    import re
    import subprocess
    import sys

    out = tmp_path / "runs" / "test-run"
    command = [sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--tasks", TASK, "--level",
               "easy", "--split", "test", "--episodes", "2", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    turns = [turn for path in (out / "trajectories").iterdir() for turn in json.loads(path.read_text())["turns"]]
    # What the episodes learnt and submitted: every line an output printed, and the instance ids.
    secrets_ = {line.strip() for turn in turns for line in (turn.get("output") or "").splitlines()
                if len(line.strip()) > 12} | {r["instance_id"] for r in rows if r.get("instance_id")}  # fmt: skip
    assert rows and turns and any("graded" in s for s in secrets_), "the folder holds what the viewer must not show"
    service = Service(ServerSettings(data_dir=str(tmp_path / "db"), run_dirs=(str(tmp_path / "runs"),)))
    try:
        with TestClient(create_app(service)) as http:
            index = http.get("/web/runs").text
            assert "test-run" in index
            page = http.get("/web/runs/dir/test-run")
            assert page.status_code == 200 and "test answers" in page.text
            for text in (index, page.text):
                assert not [s for s in secrets_ if s in text]
                assert "solution_target" not in text and not re.search(r"test-[0-9a-f]{20}", text)
    finally:
        service.stop()


def test_mcp_says_sealed_where_a_score_would_be(tmp_path) -> None:
    """Over POST /mcp a sealed counted attempt's graded submission reads ``sealed: true`` with no score in its
    structured result (the text says so too), so a tool-calling harness shows "sealed", not the floor as a score."""
    settings = ServerSettings(test_salt=SALT, data_dir=str(tmp_path), run_quota=0, standard_set=STANDARD)
    service = Service(settings)
    try:
        with TestClient(create_app(service)) as http:
            run = http.post("/runs", json={"agent": "mcp"}).json()

            def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
                return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

            sid = rpc("openenv/session/create", {})["result"]["session_id"]
            start = {"task_id": TASK, "split": "test", "level": "easy", "index": 0, "run_token": run["run_token"]}
            rpc("tools/call", {"session_id": sid, "name": "start_episode", "arguments": start})
            answer = {"answer": instance(0).truth["indices"]}
            done = rpc("tools/call", {"session_id": sid, "name": "submit_answer", "arguments": answer})["result"]
            shown = done["structuredContent"]
            assert shown["done"] and shown["sealed"] is True and shown["score"] is None and shown["counted"] is True
            assert "sealed" in done["content"][0]["text"]
    finally:
        service.stop()
