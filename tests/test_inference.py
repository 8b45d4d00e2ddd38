"""inference.py end to end: a local fake OpenAI-compatible server and a real MechSandbox server; every
stdout line is checked against the strict format, also when the LLM fails, the key is missing or the
environment is unreachable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm import FakeLLM
from mechsandbox.tasks import get_family
from server_harness import free_port, running_server

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["dead-neurons", "fourier-frequencies"]
START = re.compile(r"^\[START\] task=([a-z-]+) env=mechsandbox model=(\S+)$")
STEP = re.compile(r"^\[STEP\] step=(\d+) action=(.+) reward=(\d\.\d\d) done=(true|false) error=(.+)$")
END = re.compile(r"^\[END\] success=(true|false) steps=(\d+) score=(\d\.\d{3}) rewards=(\d\.\d\d(?:,\d\.\d\d)*)$")


def answers() -> dict[str, str]:
    out = {}
    for task_id in TASKS:
        truth = get_family(task_id).generate(0, "easy").truth
        out[task_id] = json.dumps(truth.get("indices", truth.get("frequencies")))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("inference")) as s:
        yield s


def run_inference(env: dict[str, str], status: int = 0) -> tuple[list[str], str]:
    base = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "API_KEY", "ENV_URL", "LOCAL_IMAGE_NAME")}
    out = subprocess.run([sys.executable, str(ROOT / "inference.py")], env={**base, **env}, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == status, out.stderr[-3000:]
    return out.stdout.splitlines(), out.stderr


def parse(lines: list[str]) -> dict[str, dict]:
    """Check every line against the format; group them per task."""
    episodes: dict[str, dict] = {}
    current = None
    for line in lines:
        if m := START.match(line):
            current = {"steps": [], "end": None}
            episodes[m.group(1)] = current
        elif m := STEP.match(line):
            assert current is not None and current["end"] is None
            current["steps"].append(m.groups())
        elif m := END.match(line):
            assert current is not None and current["end"] is None
            current["end"] = m.groups()
        else:
            raise AssertionError(f"unexpected stdout line: {line!r}")
    for task_id, ep in episodes.items():
        assert ep["end"] is not None, f"{task_id} has no [END]"
        success, steps, score, rewards = ep["end"]
        assert int(steps) == len(ep["steps"]) >= 1
        assert rewards.split(",") == [s[2] for s in ep["steps"]]
        assert 0.01 <= float(score) <= 0.99 and (success == "true") == (float(score) >= 0.5)
        assert all(0.01 <= float(r) <= 0.99 for r in rewards.split(","))
    return episodes


def common_env(llm: FakeLLM) -> dict[str, str]:
    return {"API_BASE_URL": llm.url, "MODEL_NAME": "fake-model", "TASKS": ",".join(TASKS), "DEADLINE_S": "300"}


def test_a_solving_llm(server) -> None:
    with FakeLLM(answers()) as llm:
        lines, _stderr = run_inference({**common_env(llm), "HF_TOKEN": "x", "ENV_URL": server.url})
    episodes = parse(lines)
    assert list(episodes) == TASKS
    for ep in episodes.values():
        success, _steps, score, _ = ep["end"]
        assert success == "true" and float(score) >= 0.95
        errors = [s[4] for s in ep["steps"]]
        assert errors[0] != "null" and "no ```python block" in errors[0]  # the unusable reply cost a turn
        assert ep["steps"][1][1].startswith('{"python_code":') and ep["steps"][-1][3] == "true"
    assert len(llm.calls) >= 1 + 3 * len(TASKS)


def test_a_failing_llm_still_ends_every_task(server) -> None:
    with FakeLLM({}, mode="fail") as llm:
        lines, _stderr = run_inference({**common_env(llm), "API_KEY": "k", "ENV_URL": server.url, "MAX_TURNS": "4"})
    episodes = parse(lines)
    assert list(episodes) == TASKS and len(llm.calls) >= 1
    for ep in episodes.values():
        assert ep["end"][0] == "false"
        assert any("LLM call failed" in s[4] for s in ep["steps"])
        assert ep["steps"][-1][3] == "true"  # the fallback (the example answer) was submitted and graded


def test_missing_key_and_unreachable_environment(tmp_path) -> None:
    with FakeLLM(answers()) as llm:
        lines, stderr = run_inference({**common_env(llm), "ENV_URL": "http://127.0.0.1:9"})
    assert "no API key" in stderr and "environment unavailable" in stderr
    assert stderr.strip().splitlines()[-1].endswith("; 2 infrastructure errors")  # the summary line counts them
    episodes = parse(lines)
    assert list(episodes) == TASKS and len(llm.calls) >= 1
    for ep in episodes.values():
        assert ep["end"][:3] == ("false", "1", "0.010")
        assert ep["steps"][0][4].startswith("infrastructure error (connection): environment unavailable")


def test_the_test_split_on_a_fixed_salt_server_plays_a_run(tmp_path) -> None:
    from mechsandbox.server.splits import heldout_ref

    salt = "inference-fixed-salt-0123456789"
    ref = heldout_ref(salt.encode(), "dead-neurons", "easy", 0)
    answer = json.dumps(get_family("dead-neurons").generate(ref.seed, "easy").truth["indices"])
    with running_server(tmp_path, MECHSANDBOX_TEST_SALT=salt) as server, FakeLLM({"dead-neurons": answer}) as llm:
        env = {**common_env(llm), "TASKS": "dead-neurons", "SPLIT": "test", "HF_TOKEN": "x", "ENV_URL": server.url,
               "RUN_NAME": "inference-test"}  # fmt: skip
        lines, stderr = run_inference(env)
        episodes = parse(lines)
        assert episodes["dead-neurons"]["end"][2] == "0.010"  # sealed: the line format holds, at the floor
        run_id = re.search(r"playing as (run-[0-9a-f]+)", stderr).group(1)  # type: ignore[union-attr]
        with server.http() as http:
            entry = http.get(f"/runs/{run_id}").json()
    assert entry["agent"] == "inference-test" and entry["model"] == "fake-model"
    assert entry["status"] == "finished" and entry["coverage"]["attempted"] == 1  # inference.py finished it
    [result] = [line for line in stderr.splitlines() if line.startswith("[RESULT]")]
    assert f"run={run_id} overall={entry['overall']}" in result
    assert "infrastructure error" in stderr.strip().splitlines()[-1]  # the last line is still the count


def test_a_dead_llm_endpoint_stops_a_counted_run_before_its_first_reset(tmp_path) -> None:
    """SPLIT=test on a fixed-salt server is a counted run: with an endpoint nobody listens on, inference.py says so in
    one line and exits 1 before registering the run, so the server's results database holds no run and no
    attempt (each would have been a counted episode at the floor)."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with running_server(tmp_path, MECHSANDBOX_TEST_SALT="inference-dead-endpoint-salt",
                        MECHSANDBOX_DATA_DIR=str(tmp_path / "results")) as server:  # fmt: skip
        env = {"API_BASE_URL": dead, "MODEL_NAME": "fake-model", "TASKS": "dead-neurons", "SPLIT": "test",
               "HF_TOKEN": "x", "ENV_URL": server.url, "RUN_NAME": "dead-endpoint", "DEADLINE_S": "120"}  # fmt: skip
        lines, stderr = run_inference(env, status=1)
        with server.http() as http:
            board = http.get("/leaderboard").json()
    assert lines == []  # no [START]: no episode was begun
    [line] = [line for line in stderr.splitlines() if "LLM endpoint check failed" in line]
    assert "stopping before the counted run is registered" in line
    assert board["runs"] == []  # nothing registered, nothing claimed
