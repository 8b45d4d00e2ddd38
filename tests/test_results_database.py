"""The results database on both back ends (issue 15): migrations that match the models, results that survive a
restart (SQLite), two server processes sharing one PostgreSQL without ever counting two attempts at an instance of
a run, and a database that is down or a folder that is not writable met with one clear line.

The servers here are real ``mechsandbox serve`` processes; PostgreSQL is a real server (``postgres_harness``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from mechsandbox.client import MechSandboxEnv
from mechsandbox.results import ResultStore, ResultsUnavailable, resolve_database_url
from mechsandbox.results.schema import Base
from mechsandbox.server.splits import heldout_ref
from mechsandbox.tasks import generate
from openenv.core.generic_client import GenericEnvClient
from postgres_harness import Postgres, postgres_or_skip
from server_harness import running_server

SALT = "results-database-salt-0123456789"
TASK = "dead-neurons"


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_or_skip() as server:
        yield server


def answer(index: int) -> list[int]:
    ref = heldout_ref(SALT.encode(), TASK, "easy", index)
    return generate(TASK, ref.seed, "easy").truth["indices"]


def play(http: httpx.Client, token: str, index: int, guess: Any) -> dict[str, Any]:
    reset = http.post("/reset", json={"task_id": TASK, "split": "test", "index": index, "run_token": token})
    assert reset.status_code == 200, reset.text
    step = http.post("/step", json={"episode_id": reset.json()["episode_id"], "action": {"solution_target": guess}})
    assert step.status_code == 200, step.text
    return step.json()


def register(http: httpx.Client, agent: str) -> dict[str, Any]:
    response = http.post("/runs", json={"agent": agent})
    assert response.status_code == 200, response.text
    return response.json()


def test_migrations_match_the_models_on_sqlite(tmp_path) -> None:
    store = ResultStore(f"sqlite:///{tmp_path / 'r.sqlite'}").open()
    try:
        with store.engine.connect() as connection:  # type: ignore[union-attr]
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    finally:
        store.close()


def test_migrations_match_the_models_on_postgres(postgres: Postgres) -> None:
    store = ResultStore(postgres.url).open()
    try:
        with store.engine.connect() as connection:  # type: ignore[union-attr]
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        assert store.backend == "postgresql"
    finally:
        store.close()


def test_counted_results_survive_a_restart(tmp_path) -> None:
    env = {"MECHSANDBOX_TEST_SALT": SALT, "MECHSANDBOX_DATA_DIR": str(tmp_path / "data")}
    with running_server(tmp_path, **env) as server, server.http() as http:
        run = register(http, "survivor")
        first = play(http, run["run_token"], 0, answer(0))
        assert first["reward"] == 0.01 and first["observation"]["counted"] is True  # sealed on a fixed salt
        # Over the WebSocket the token is a keyword of reset, for the typed client and for OpenEnv's generic one.
        with MechSandboxEnv(base_url=server.url).sync() as typed:
            obs = typed.reset(task_id=TASK, split="test", index=2, run_token=run["run_token"]).observation
            assert obs.counted is True and obs.run_id == run["run_id"]
            assert typed.submit(answer(2)).observation.counted is True
        with GenericEnvClient(base_url=server.url).sync() as generic:
            replay = generic.reset(task_id=TASK, split="test", index=2, run_token=run["run_token"])
            assert replay.observation["counted"] is False
            with pytest.raises(RuntimeError, match="unknown run_token"):
                generic.reset(task_id=TASK, split="test", index=3, run_token="mst_forged")
    assert (tmp_path / "data" / "results.sqlite").exists()
    with running_server(tmp_path, **env) as server, server.http() as http:
        entry = http.get(f"/runs/{run['run_id']}").json()
        assert entry["status"] == "sealed" and entry["overall"] is None and entry["coverage"]["attempted"] == 2
        again = play(http, run["run_token"], 0, answer(0))  # the same token still plays, and still counts once
        assert again["reward"] == 0.01 and again["observation"]["counted"] is False
        assert play(http, run["run_token"], 1, [0])["observation"]["counted"] is True
        assert http.get(f"/runs/{run['run_id']}").json()["coverage"]["attempted"] == 3
        done = http.post(f"/runs/{run['run_id']}/finish", json={"run_token": run["run_token"]}).json()
        assert done["status"] == "finished" and done["overall"] is not None
    with running_server(tmp_path, **env) as server, server.http() as http:
        assert http.get(f"/runs/{run['run_id']}").json() == done  # a finished run is immutable, across restarts too
        body = {"task_id": TASK, "split": "test", "index": 4, "run_token": run["run_token"]}
        refused = http.post("/reset", json=body)
        assert refused.status_code == 403 and "finished" in refused.json()["detail"]


def test_concurrent_claims_count_once_on_postgres(postgres: Postgres) -> None:
    """Eight threads over two engines (two "replicas") claim one instance of one run: one claim wins."""
    stores = [ResultStore(postgres.url).open() for _ in range(2)]
    try:
        run, _ = stores[0].register_run("racer", "", "", "addr:x", "fp", "0.1.0", 20)
        barrier = threading.Barrier(8)

        def claim(i: int) -> int | None:
            barrier.wait()
            return stores[i % 2].claim(run.run_id, TASK, "1", "easy", 0, "test-race")

        with ThreadPoolExecutor(8) as pool:
            claims = list(pool.map(claim, range(8)))
        assert sum(c is not None for c in claims) == 1
        assert len(stores[1].attempts(run.run_id)) == 1
    finally:
        for store in stores:
            store.close()


def test_two_servers_share_one_leaderboard_on_postgres(tmp_path, postgres: Postgres) -> None:
    env = {"MECHSANDBOX_TEST_SALT": SALT, "MECHSANDBOX_DATABASE_URL": postgres.url}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with (
        running_server(tmp_path / "a", **env) as a,
        running_server(tmp_path / "b", **env) as b,
        a.http() as http_a,
        b.http() as http_b,
    ):
        run = register(http_a, "replicated")
        assert play(http_b, run["run_token"], 0, answer(0))["observation"]["counted"] is True  # registered on A
        barrier = threading.Barrier(4)

        def attempt(http: httpx.Client) -> bool:
            barrier.wait()
            body = {"task_id": TASK, "split": "test", "index": 1, "run_token": run["run_token"]}
            return http.post("/reset", json=body).json()["observation"]["counted"]

        with ThreadPoolExecutor(4) as pool:
            counted = list(pool.map(attempt, [http_a, http_b, http_a, http_b]))
        assert sorted(counted) == [False, False, False, True]  # four resets on two replicas: one claim
        finished = http_b.post(f"/runs/{run['run_id']}/finish", json={"run_token": run["run_token"]}).json()
        board_a, board_b = http_a.get("/leaderboard").json(), http_b.get("/leaderboard").json()
        assert board_a["runs"] == board_b["runs"]
        entry = next(r for r in board_a["runs"] if r["run_id"] == run["run_id"])
        assert entry["coverage"]["attempted"] == 2 and entry["overall"] == finished["overall"] is not None
        assert http_a.get("/health").json()["results_database"] == "postgresql"


def test_a_database_that_is_down_stops_the_server_in_one_line(tmp_path) -> None:
    env = {"MECHSANDBOX_TEST_SALT": SALT, "MECHSANDBOX_DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:1/db"}
    done = subprocess.run([sys.executable, "-m", "mechsandbox.cli", "serve", "--port", "1"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("mechsandbox serve: results database") and "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unwritable_data_dir_falls_back_to_a_named_folder(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    url, note, cleanup = resolve_database_url("", str(blocker / "data"), salt_is_random=False)
    assert note is not None and "not writable" in note and url.removeprefix("sqlite:///") in note
    assert cleanup is None
    store = ResultStore(url).open()
    store.close()
    with pytest.raises(ResultsUnavailable):
        ResultStore(f"sqlite:///{blocker}/x/results.sqlite").open()
