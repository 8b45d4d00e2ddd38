"""The operator's train budget override (MECHSANDBOX_TRAIN_MAX_STEPS): train episodes take it, test
episodes never do, and the setting is validated at start-up."""

from __future__ import annotations

import pytest
from mechsandbox.server.clients import LOCAL
from mechsandbox.server.episode import EpisodeError
from mechsandbox.server.service import Service
from mechsandbox.server.settings import ServerSettings
from mechsandbox.tasks import get_family


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    # practice: a fixed-salt server refuses run-less test resets otherwise (tests/test_runs.py)
    settings = ServerSettings(train_max_steps=3, test_salt="budget-test", public_salt=True, practice=True,
                              data_dir=str(tmp_path_factory.mktemp("results")))  # fmt: skip
    svc = Service(settings).start()
    yield svc
    svc.stop()


def test_train_episodes_take_the_override(service) -> None:
    episode = service.open_episode({"task_id": "dead-neurons", "seed": 5}, transport="websocket")
    try:
        assert episode.reset_observation()["max_steps"] == 3
        for n in range(1, 4):
            obs = episode.step({"python_code": "print(1)"})
            assert obs["step"] == n and obs["max_steps"] == 3
        assert obs["done"] and obs["truncated"] and obs["score"] == 0.01
    finally:
        episode.close()


def test_test_episodes_keep_the_family_budget(service) -> None:
    episode = service.open_episode({"task_id": "dead-neurons", "split": "test", "index": 0}, transport="websocket")
    try:
        assert episode.max_steps == get_family("dead-neurons").max_steps["easy"] != 3
    finally:
        episode.close()
    assert service.health()["train_max_steps"] == 3


@pytest.mark.parametrize(("raw", "expected"), [("0", 0), ("500", 500)])
def test_setting_parses(raw: str, expected: int) -> None:
    assert ServerSettings.from_env({"MECHSANDBOX_TRAIN_MAX_STEPS": raw}).train_max_steps == expected


@pytest.mark.parametrize("raw", ["-1", "many"])
def test_bad_setting_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="MECHSANDBOX_TRAIN_MAX_STEPS"):
        ServerSettings.from_env({"MECHSANDBOX_TRAIN_MAX_STEPS": raw})


def test_a_step_that_finds_no_sandbox_worker_is_refused_and_not_counted(tmp_path) -> None:
    """A step whose session cannot get a worker (here: the only worker slot is held by another episode) answers 503
    with the reason, spends no step and records nothing; sent again once a worker is free, it runs."""
    from mechsandbox.server.episode import ServiceUnavailable
    from mechsandbox.server.sandbox import SandboxSettings

    settings = ServerSettings(test_salt="budget-test", public_salt=True, practice=True, data_dir=str(tmp_path))
    svc = Service(settings, SandboxSettings(pool_size=0, max_workers=1)).start()
    try:
        holder = svc.open_episode({"task_id": "dead-neurons", "seed": 5}, transport="websocket")
        assert holder.step({"python_code": "print(1)"})["step"] == 1  # it holds the slot before the next reset
        late = svc.open_episode({"task_id": "dead-neurons", "seed": 6}, transport="websocket")
        with pytest.raises(ServiceUnavailable, match=r"all 1 sandbox workers are in use.*step was not counted") as info:
            late.step({"python_code": "print(2)"})
        assert info.value.status == 503 and late.step_count == 0
        holder.close()
        obs = late.step({"python_code": "print(2)"})
        assert obs["step"] == 1 and obs["stdout_or_error"] == "2\n"
        late.close()
        with pytest.raises(EpisodeError, match="sandbox session was closed") as closed:
            late._run("print(3)")  # a step that raced the session's close: 409, nothing to send again
        assert closed.value.status == 409
    finally:
        svc.stop()


def test_a_counted_episode_that_gets_no_worker_is_refused_at_reset_and_claims_nothing(tmp_path) -> None:
    """A run's attempt is claimed at reset, so a counted episode loads its model before the reset answers: with no
    worker to be had the reset is the 503 and the attempt stays unclaimed (a later reset of it is still counted)."""
    from mechsandbox.server.episode import ServiceUnavailable
    from mechsandbox.server.sandbox import SandboxSettings

    settings = ServerSettings(test_salt="budget-test", public_salt=True, data_dir=str(tmp_path))
    svc = Service(settings, SandboxSettings(pool_size=0, max_workers=1)).start()
    try:
        token = svc.runs.register("budget-test", "", "", LOCAL)["run_token"]
        holder = svc.open_episode({"task_id": "dead-neurons", "seed": 5}, transport="websocket")
        holder.step({"python_code": "print(1)"})
        reset = {"task_id": "dead-neurons", "split": "test", "index": 0, "run_token": token}
        with pytest.raises(ServiceUnavailable, match="all 1 sandbox workers are in use"):
            svc.open_episode(reset, transport="websocket")
        holder.close()
        counted = svc.open_episode(reset, transport="websocket")
        assert counted.scoring.counted and counted.reset_observation()["counted"]
        counted.close()
    finally:
        svc.stop()
