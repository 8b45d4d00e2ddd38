"""Runs on the test split (issue 15): the reward is no oracle within a run, runs count separately, run-less test
play follows the salt, every refusal is a one-line 4xx, a failing database loses nothing, and the leaderboard
equals a recomputation from the raw rows.

One in-process server (``create_app`` over a real ``Service``: sandbox pool, SQLite results database in a temporary
folder) with a fixed salt, driven over HTTP with FastAPI's TestClient. Restarts and PostgreSQL are in
``test_results_database.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mechsandbox.protocol import FLOOR
from mechsandbox.results import wilson_interval
from mechsandbox.results.leaderboard import QUANTA
from mechsandbox.results.store import ResultStore
from mechsandbox.server.app import create_app
from mechsandbox.server.clients import Client
from mechsandbox.server.runs import RunQuota, Runs
from mechsandbox.server.service import Service
from mechsandbox.server.settings import ServerSettings
from mechsandbox.server.splits import heldout_ref
from mechsandbox.tasks import families, generate
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

SALT = "runs-test-salt-0123456789"
TASK = "dead-neurons"  # the cheapest family to generate


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[Service]:
    settings = ServerSettings(test_salt=SALT, data_dir=str(tmp_path_factory.mktemp("results")), run_quota=0)
    service = Service(settings)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def http(service: Service) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as client:
        yield client


def register(http: TestClient, agent: str = "tester", **extra: Any) -> dict[str, Any]:
    response = http.post("/runs", json={"agent": agent, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def reset(http: TestClient, **params: Any) -> dict[str, Any]:
    response = http.post("/reset", json={"task_id": TASK, "split": "test", "level": "easy", **params})
    assert response.status_code == 200, response.text
    return response.json()


def submit(http: TestClient, episode_id: str, answer: Any) -> dict[str, Any]:
    response = http.post("/step", json={"episode_id": episode_id, "action": {"solution_target": answer}})
    assert response.status_code == 200, response.text
    return response.json()


def finish(http: TestClient, run: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"/runs/{run['run_id']}/finish", json={"run_token": run["run_token"]})
    assert response.status_code == 200, response.text
    return response.json()


def stored_scores(service: Service, run_id: str) -> list[float]:
    """What the database holds for a run's attempts (what sealing hides from every route), oldest first."""
    return [a.score if a.status == "graded" else FLOOR for a in service.runs.store.attempts(run_id)]  # type: ignore


def truth_of(index: int, level: str = "easy", task: str = TASK) -> Any:
    """The answer of a test instance, derived the way only the server (and this test, which knows the salt) can."""
    ref = heldout_ref(SALT.encode(), task, level, index)
    return generate(task, ref.seed, level).truth["indices"]


def candidates(index: int) -> list[list[int]]:
    """An oracle search's guesses, the true answer among them (last, so that a search would stop there)."""
    true = sorted(truth_of(index))
    return [[0], [1, 2], true[:-1] or [3], true]


def test_the_reward_is_no_oracle_within_a_run(http: TestClient) -> None:
    run = register(http)
    token, index = run["run_token"], 1
    first = reset(http, index=index, run_token=token)
    assert first["observation"]["counted"] is True and first["observation"]["run_id"] == run["run_id"]
    counted = submit(http, first["episode_id"], [0])
    assert counted["observation"]["counted"] is True and counted["reward"] == FLOOR  # sealed (issue 55)
    assert counted["observation"]["score"] is None and "sealed" in counted["observation"]["stdout_or_error"]
    seen = []
    for guess in candidates(index):
        episode = reset(http, index=index, run_token=token)
        assert episode["observation"]["counted"] is False  # said at reset already: the agent knows it is a replay
        obs = submit(http, episode["episode_id"], guess)
        seen.append((obs["reward"], obs["observation"]["score"], obs["observation"]["counted"]))
        assert "not counted" in obs["observation"]["stdout_or_error"]
    assert seen == [(FLOOR, None, False)] * len(seen)  # the true answer earns exactly what a wrong one does
    entry = http.get(f"/runs/{run['run_id']}").json()
    assert entry["status"] == "sealed" and entry["overall"] is None and entry["coverage"]["attempted"] == 1


def test_two_runs_are_counted_separately(http: TestClient, service: Service) -> None:
    first, second = register(http, agent="a"), register(http, agent="b")
    index = 2
    wrong = submit(http, reset(http, index=index, run_token=first["run_token"])["episode_id"], [0])
    right = submit(http, reset(http, index=index, run_token=second["run_token"])["episode_id"], truth_of(index))
    assert wrong["observation"]["counted"] and right["observation"]["counted"]
    assert right["reward"] == wrong["reward"] == FLOOR
    assert [stored_scores(service, first["run_id"]), stored_scores(service, second["run_id"])] == [[FLOOR], [0.99]]


def test_run_less_test_resets_are_refused_on_a_fixed_salt(http: TestClient) -> None:
    response = http.post("/reset", json={"task_id": TASK, "split": "test", "index": 0})
    assert response.status_code == 403 and "run_token" in response.json()["detail"]
    assert http.get("/health").json()["runs_required"] is True


@pytest.mark.parametrize(
    ("body", "status", "pattern"),
    [
        ({"split": "test", "run_token": "mst_not-a-token"}, 403, "unknown run_token"),
        ({"split": "train", "seed": 1, "run_token": "mst_x"}, 400, "test split only"),
        ({"split": "test", "run_token": 7}, 400, "run_token must be"),
        ({"split": "test", "run_token": "x" * 500}, 400, "run_token must be"),
        ({"split": "test", "run_token": None, "index": 0}, 403, "run_token"),
    ],
)
def test_bad_run_tokens_get_one_line_4xx(http: TestClient, body: dict, status: int, pattern: str) -> None:
    response = http.post("/reset", json={"task_id": TASK, **body})
    assert response.status_code == status, response.text
    assert pattern in response.json()["detail"] and "\n" not in response.json()["detail"]


@pytest.mark.parametrize(
    ("content", "status", "pattern"),
    [
        (b'{"agent": "' + b"n" * 129 + b'"}', 422, "agent"),
        (b'{"agent": ""}', 422, "agent"),
        (b'{"model": "m"}', 422, "agent"),
        (b'{"agent": "a", "notes": "' + b"x" * 2001 + b'"}', 422, "notes"),
        (b'{"agent": "a", "salt": "mine"}', 422, "salt"),
        (b'{"agent": 5}', 422, "agent"),
        (b'{"agent": "a\\u0000b"}', 422, "control characters"),
        (b'{"agent": "a", "model": "\\u001b[31mred"}', 422, "control characters"),
        (b'{"agent": "a", "notes": "\\ud800"}', 422, "notes"),
        (b"[1, 2]", 400, "JSON object"),
        (b"{not json", 400, "not valid JSON"),
    ],
)
def test_bad_run_registrations_get_one_line_4xx(http: TestClient, content: bytes, status: int, pattern: str) -> None:
    response = http.post("/runs", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert pattern in response.json()["detail"] and "\n" not in response.json()["detail"]


def test_a_run_plays_only_the_standard_set(http: TestClient, service: Service) -> None:
    """Indices past the standard set would let a run pad its mean with the families it does best on."""
    token = register(http)["run_token"]
    outside = service.settings.standard_set
    response = http.post("/reset", json={"task_id": TASK, "split": "test", "index": outside, "run_token": token})
    assert response.status_code == 400 and "standard set" in response.json()["detail"]


def test_a_replay_ends_the_open_attempt(http: TestClient, service: Service) -> None:
    """Keeping the counted episode open while probing replays of the instance buys nothing: the replay's reset
    abandons the attempt (at the floor), and the old episode's submission is not counted."""
    run = register(http)
    counted = reset(http, index=13, run_token=run["run_token"])
    replay = reset(http, index=13, run_token=run["run_token"])
    assert replay["observation"]["counted"] is False
    late = submit(http, counted["episode_id"], truth_of(13))
    assert late["reward"] == FLOOR and late["observation"]["counted"] is False
    assert late["observation"]["score"] is None and "abandoned" in late["observation"]["stdout_or_error"]
    assert stored_scores(service, run["run_id"]) == [FLOOR]


def test_a_null_level_defers_to_task_level(service: Service) -> None:
    assert service.resolve({"task_id": TASK, "level": None, "task_level": "hard"}).level == "hard"


def test_unknown_run_id_is_a_404(http: TestClient) -> None:
    assert http.get("/runs/run-0000").status_code == 404


def test_concurrent_first_attempts_count_once(http: TestClient, service: Service) -> None:
    run = register(http)
    barrier = threading.Barrier(4)
    outcomes: list[bool] = []

    def attempt() -> None:
        barrier.wait()
        outcomes.append(reset(http, index=3, run_token=run["run_token"])["observation"]["counted"])

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(outcomes) == [False, False, False, True]
    store = service.runs.store
    assert store is not None and len(store.attempts(run["run_id"])) == 1


def test_an_abandoned_attempt_counts_at_the_floor(http: TestClient, service: Service) -> None:
    run = register(http)
    episode = reset(http, index=4, run_token=run["run_token"])
    service.close_http(episode["episode_id"])  # what the idle reaper does to an episode left alone
    again = reset(http, index=4, run_token=run["run_token"])
    assert again["observation"]["counted"] is False
    assert submit(http, again["episode_id"], truth_of(4))["reward"] == FLOOR
    assert [a.status for a in service.runs.store.attempts(run["run_id"])] == ["abandoned"]  # type: ignore[union-attr]
    assert stored_scores(service, run["run_id"]) == [FLOOR]


def test_a_database_failure_loses_nothing(http: TestClient, service: Service) -> None:
    run = register(http)
    episode = reset(http, index=5, run_token=run["run_token"])
    store = service.runs.store
    assert store is not None
    working = store.sessions
    # A real failure: a database that refuses connections (nothing listens on port 1).
    store.sessions = sessionmaker(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))
    try:
        response = http.post("/step", json={"episode_id": episode["episode_id"],
                                            "action": {"solution_target": truth_of(5)}})  # fmt: skip
        assert response.status_code == 503 and "retry" in response.json()["detail"]
        assert "postgresql" not in response.json()["detail"]  # the driver's error stays in the server's log
        refused = http.post("/reset", json={"task_id": TASK, "split": "test", "index": 6,
                                            "run_token": run["run_token"]})  # fmt: skip
        assert refused.status_code == 503
        assert http.get("/leaderboard").status_code == 503
    finally:
        store.sessions = working
    state = http.get("/state", params={"episode_id": episode["episode_id"]}).json()
    assert state["step_count"] == 0 and not state["done"]  # the refused submission spent nothing
    retried = submit(http, episode["episode_id"], truth_of(5))
    assert retried["reward"] == FLOOR and retried["observation"]["counted"] is True
    assert stored_scores(service, run["run_id"]) == [0.99]


def test_counted_attempts_keep_their_trajectory(http: TestClient, service: Service) -> None:
    run = register(http)
    episode = reset(http, index=7, run_token=run["run_token"])
    http.post("/step", json={"episode_id": episode["episode_id"], "action": {"python_code": "print('probe')"}})
    submit(http, episode["episode_id"], truth_of(7))
    store = service.runs.store
    assert store is not None
    (attempt,) = store.attempts(run["run_id"], with_trajectory=True)
    assert attempt.status == "graded" and attempt.steps == 2
    assert [t["action"] for t in attempt.trajectory] == [{"python_code": "print('probe')"},
                                                         {"solution_target": truth_of(7)}]  # fmt: skip
    assert "probe" in attempt.trajectory[0]["output"]
    assert "trajectory" not in str(http.get(f"/runs/{run['run_id']}").json())  # answers never leave the server


def test_the_leaderboard_equals_a_recomputation_from_raw_rows(http: TestClient, service: Service) -> None:
    run = register(http, agent="recompute")
    for index, answer in [(8, [0]), (9, truth_of(9)), (10, [1])]:
        submit(http, reset(http, index=index, run_token=run["run_token"])["episode_id"], answer)
    reset(http, index=11, run_token=run["run_token"])  # left open: counts at the floor
    store = service.runs.store
    assert store is not None
    with store.engine.connect() as connection:  # type: ignore[union-attr]
        rows = connection.exec_driver_sql(
            "SELECT status, score FROM attempts WHERE run_id = ?", (run["run_id"],)
        ).fetchall()
    scores = [score if status == "graded" else FLOOR for status, score in rows]
    assert len(scores) == 4
    entry = next(r for r in http.get("/leaderboard").json()["runs"] if r["run_id"] == run["run_id"])
    assert entry["overall"] is None and entry["families"] == {} and entry["rank"] is None  # sealed until finished
    assert entry["coverage"]["open"] == 1 and entry["complete"] is False
    entry = finish(http, run)
    # Published over the whole standard set (unplayed instances at the floor), rounded to its quantum after dither.
    n = len(families()) * 3 * service.settings.standard_set
    mean = (sum(scores) + FLOOR * (n - 4)) / n
    assert entry["episodes"] == n and abs(entry["overall"] - mean) < QUANTA["overall"]
    assert round(entry["overall"] / QUANTA["overall"], 6).is_integer()
    assert entry["ci95"] == list(wilson_interval(entry["overall"], n))
    assert entry["families"][TASK]["episodes"] == 3 * service.settings.standard_set
    assert entry["coverage"]["open"] == 0 and entry["status"] == "finished"
    assert entry["salt_fingerprint"] == service.runs.fingerprint and SALT not in str(entry)


def test_the_leaderboard_command_reads_the_database(http: TestClient, service: Service) -> None:
    import json
    import subprocess
    import sys

    run = register(http, agent="from-the-db")
    submit(http, reset(http, index=12, run_token=run["run_token"])["episode_id"], truth_of(12))
    finish(http, run)
    url = service.runs.store.url  # type: ignore[union-attr]
    command = [sys.executable, "-m", "mechsandbox.cli", "leaderboard", "--db", url]
    table = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert any(run["run_id"] in line and "from-the-db" in line for line in table.stdout.splitlines())
    board = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120).stdout)
    served = {r["run_id"]: r for r in http.get("/leaderboard").json()["runs"]}
    mine = next(r for r in board["runs"] if r["run_id"] == run["run_id"])
    assert served[run["run_id"]]["page"] == f"/web/runs/db/{run['run_id']}"  # the server links its run viewer
    assert {k: v for k, v in mine.items() if k not in ("rank", "group")} == {
        k: v for k, v in served[run["run_id"]].items() if k not in ("rank", "group", "page")
    }
    missing = subprocess.run([*command[:-1], "sqlite:////nonexistent/dir/x.sqlite"], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def finished(run: Any, rows: list[Any], levels: tuple[str, ...] = ("easy", "medium", "hard")) -> Any:
    """``run`` as ``Runs`` leaves it once finished: its published aggregates on the row (no dither: rounded down)."""
    import dataclasses

    from mechsandbox.results.leaderboard import publish

    mine = [a for a in rows if a.run_id == run.run_id]
    return dataclasses.replace(run, finished_at=9.0, published=publish(run, mine, {"x": "1"}, levels, lambda _: 0.0))


def test_partial_runs_never_rank_above_complete_ones(tmp_path) -> None:
    """A tiny standard set (one instance per level of one family) makes a complete run cheap to play."""
    from mechsandbox.results import leaderboard
    from mechsandbox.results.store import Attempt, RunInfo

    complete = RunInfo("run-complete", "c", "", "", "fp", "0.1.0", 1, 1.0)
    partial = RunInfo("run-partial", "p", "", "", "fp", "0.1.0", 1, 2.0)
    other = RunInfo("run-other", "o", "", "", "fp", "0.1.0", 1, 3.0)

    def attempt(run: str, level: str, score: float, version: str = "1") -> Attempt:
        return Attempt(0, run, "x", version, level, 0, f"{run}-{level}", "graded", score, 3, 1.0, 0.0, 1.0)

    rows = [attempt("run-complete", lv, 0.3) for lv in ("easy", "medium", "hard")]
    rows += [attempt("run-partial", "easy", 0.99), attempt("run-other", "easy", 0.99, version="2")]
    complete, partial, other = (finished(run, rows) for run in (complete, partial, other))
    board = leaderboard([complete, partial, other], rows, {"x": "1"}, ("easy", "medium", "hard"), "fp", "0.1.0", 1)
    ranked = [(r["run_id"], r["rank"], r["complete"]) for r in board["runs"]]
    assert ranked[:2] == [("run-complete", 1, True), ("run-partial", 2, False)]
    assert ranked[2] == ("run-other", 1, False)  # another family version: its own group, never ranked with these
    assert board["runs"][2]["group"] != board["current_group"]


def test_runs_on_other_standard_sets_or_old_versions_are_grouped_apart() -> None:
    from mechsandbox.results import leaderboard
    from mechsandbox.results.store import Attempt, RunInfo

    def attempt(run: str, level: str, index: int, version: str = "1") -> Attempt:
        return Attempt(0, run, "x", version, level, index, f"{run}-{level}-{index}", "graded", 0.9, 3, 1.0, 0.0, 1.0)

    levels = ("easy", "medium", "hard")
    small = RunInfo("run-small", "s", "", "", "fp", "0.1.0", 1, 1.0)  # "complete" after 3 episodes
    big = RunInfo("run-big", "b", "", "", "fp", "0.1.0", 2, 2.0)
    old = RunInfo("run-old", "o", "", "", "fp", "0.1.0", 2, 3.0)  # complete on version 0 of the family
    rows = [attempt("run-small", lv, 0) for lv in levels]
    rows += [attempt("run-big", lv, k) for lv in levels for k in range(2)]
    rows += [attempt("run-old", lv, k, version="0") for lv in levels for k in range(2)]
    board = {r["run_id"]: r for r in leaderboard([small, big, old], rows, {"x": "1"}, levels, "fp", "0.1.0", 2)["runs"]}
    assert board["run-small"]["group"] != board["run-big"]["group"] == leaderboard([], [], {"x": "1"}, levels, "fp",
                                                                                         "0.1.0", 2)["current_group"]
    assert board["run-old"]["complete"] is True and board["run-old"]["group"] != board["run-big"]["group"]


def test_a_refused_websocket_reset_keeps_the_counted_attempt(http: TestClient, service: Service) -> None:
    import json

    run = register(http)
    with http.websocket_connect("/ws") as ws:
        ws.send_text(json.dumps({"type": "reset", "data": {"task_id": TASK, "split": "test", "index": 14,
                                                           "run_token": run["run_token"]}}))  # fmt: skip
        assert json.loads(ws.receive_text())["data"]["observation"]["counted"] is True
        ws.send_text(json.dumps({"type": "reset", "data": {"task_id": TASK, "split": "test", "index": 99,
                                                           "run_token": run["run_token"]}}))  # fmt: skip
        assert json.loads(ws.receive_text())["type"] == "error"
        ws.send_text(json.dumps({"type": "step", "data": {"solution_target": truth_of(14)}}))
        graded = json.loads(ws.receive_text())["data"]
        assert graded["reward"] == FLOOR and graded["observation"]["counted"] is True
    assert stored_scores(service, run["run_id"]) == [0.99]


def test_wilson_interval_behaves_at_the_ceiling_and_at_small_n() -> None:
    low, high = wilson_interval(0.99, 20)
    assert 0.8 < low < 0.99 < high <= 1.0  # not the zero-width interval of a normal approximation
    low, high = wilson_interval(0.99, 1)
    assert low < 0.25 and high == 1.0  # one episode says little
    assert wilson_interval(0.5, 0) == (0.0, 1.0)
    assert wilson_interval(0.5, 10_000)[1] - wilson_interval(0.5, 10_000)[0] < 0.02


def test_the_registration_quota_holds_per_client_even_in_a_burst(tmp_path) -> None:
    runs = Runs(ServerSettings(test_salt=SALT, data_dir=str(tmp_path), run_quota=2), SALT.encode(), False)
    runs.open()
    try:
        remote = Client("addr:198.51.100.7")
        barrier = threading.Barrier(8)
        outcomes: list[str] = []

        def register_one() -> None:
            barrier.wait()
            try:
                outcomes.append(runs.register("a", "", "", remote)["run_id"])
            except RunQuota:
                outcomes.append("refused")

        threads = [threading.Thread(target=register_one) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(outcomes).count("refused") == 6  # two slots a day, whatever the timing
        runs.register("a", "", "", Client("addr:198.51.100.8"))  # another client has its own
        runs.register("a", "", "", Client("addr:2001:db8::1"))
        runs.register("a", "", "", Client("addr:2001:db8::2"))
        with pytest.raises(RunQuota):  # the same IPv6 /64 is one client
            runs.register("a", "", "", Client("addr:2001:db8::3"))
        runs.register("a", "", "", Client("addr:127.0.0.1", exempt=True))
        runs.register("a", "", "", Client("addr:127.0.0.1", exempt=True))
        with pytest.raises(RunQuota):  # loopback is a submitter like any other (issue 55)
            runs.register("a", "", "", Client("addr:127.0.0.1", exempt=True))
    finally:
        runs.close()


def test_a_random_salt_server_scores_run_less_test_episodes(tmp_path) -> None:
    """Nothing on a random-salt server is comparable, so nothing there needs a run (and nothing is kept)."""
    runs = Runs(ServerSettings(), b"random", True)
    runs.open()
    try:
        ref = heldout_ref(b"random", TASK, "easy", 0)
        assert runs.check_reset(ref, None) is None
        assert runs.scoring(ref, None, "1").mode == "open"
        folder = runs.store.cleanup  # type: ignore[union-attr]
        assert folder is not None and folder.exists()
    finally:
        runs.close()
    assert not folder.exists()


def test_practice_is_played_and_never_scored(tmp_path) -> None:
    runs = Runs(ServerSettings(test_salt=SALT, data_dir=str(tmp_path), practice=True), SALT.encode(), False)
    runs.open()
    try:
        ref = heldout_ref(SALT.encode(), TASK, "easy", 0)
        assert runs.check_reset(ref, None) is None
        scoring = runs.scoring(ref, None, "1")
        assert scoring.mode == "practice" and scoring.hides_score and scoring.counted is False
    finally:
        runs.close()


def test_a_token_from_another_salt_is_refused(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    a = Runs(ServerSettings(test_salt=SALT, database_url=url), SALT.encode(), False)
    b = Runs(ServerSettings(test_salt="another-salt-0123456789", database_url=url), b"another-salt-0123456789", False)
    a.open()
    b.open()
    try:
        token = a.register("a", "", "", Client("addr:198.51.100.9"))["run_token"]
        assert a.check_reset(heldout_ref(SALT.encode(), TASK, "easy", 0), token) is not None
        with pytest.raises(Exception, match="another test salt"):
            b.check_reset(heldout_ref(b"another-salt-0123456789", TASK, "easy", 0), token)
    finally:
        a.close()
        b.close()


def test_store_rejects_a_bad_url_in_one_line() -> None:
    from mechsandbox.results import ResultsUnavailable

    with pytest.raises(ResultsUnavailable) as caught:
        ResultStore("postgresql://user:secret@127.0.0.1:1/db").open()
    assert "\n" not in str(caught.value) and "secret" not in str(caught.value)
    with pytest.raises(ResultsUnavailable, match="not a database URL"):
        ResultStore("::not a url::").open()
