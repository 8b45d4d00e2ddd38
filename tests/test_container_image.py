"""The image itself, built by docker/build-local.sh and run by a real engine (podman here): it starts, says which
sandbox layers hold inside it, plays a scripted episode through its port, runs read-only as an unprivileged uid (as
OpenEnv's runtime validation runs it) and stops gracefully.

Then ``openenv validate`` at its runtime level, against podman's Docker API.

Needs podman (or a docker engine), mmdebstrap, runc and catatonit: .ci/run installs them, and the file skips with
that reason where they are missing. The image build is about 3.5 minutes of one core (mmdebstrap of the base, the
install, ``gen-art --check`` in the image), ordered early by its budget (tests/time_budget.json: pytest-xdist's
worksteal gives the first half of that order to one worker, so it starts after that worker's sweeps and audit). The
validator builds the image a second time through the Docker API (no shared layer cache: 2 more
minutes), so its test runs with ``MECHSANDBOX_CONTAINER_TESTS=full`` only; the default run checks the plan it plays
(tests/test_packaging.py) and the state contract it reads (tests/test_server_sessions.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
TAG = "mechsandbox:test"
ENGINE = os.environ.get("ENGINE") or shutil.which("podman") or shutil.which("docker") or "podman"

MISSING = [tool for tool in (ENGINE, "mmdebstrap") if not shutil.which(tool)]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"{', '.join(MISSING)} missing: apt-get install podman mmdebstrap runc catatonit (.ci/run)"
)


@pytest.fixture(scope="module")
def engine_args() -> list[str]:
    """Builds the image; returns what a container needs to start on this host, as build-local.sh probed it (podman
    inside a container: runc and lowered rlimits)."""
    script = str(ROOT / "docker" / "build-local.sh")
    built = subprocess.run(["sh", script], env={**os.environ, "TAG": TAG}, capture_output=True, text=True,
                           timeout=1800)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    probed = subprocess.run(["sh", script, "--print-engine-args"], capture_output=True, text=True, check=True)
    return probed.stdout.split()


@contextlib.contextmanager
def started(engine_args: list[str], *extra: str) -> Iterator[tuple[str, int]]:
    """The image running with ``extra`` options, published on a free port; removed afterwards."""
    port = free_port()
    cid = subprocess.run([ENGINE, "run", "-d", *engine_args, *extra, "-p", f"127.0.0.1:{port}:8000", TAG],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    try:
        yield cid, port
    finally:
        subprocess.run([ENGINE, "rm", "-f", cid], capture_output=True)


def _health(port: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            if response.status_code == 200:
                return response.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"/health did not answer 200 within {timeout} s")


def test_the_image_serves_an_episode_and_stops_gracefully(engine_args: list[str], tmp_path: Path) -> None:
    with started(engine_args) as (cid, port):
        health = _health(port)
        assert health["status"] == "healthy" and {"landlock", "seccomp", "rlimits"} <= set(health["isolation_active"])
        jail = health["isolation"]["namespaces"]  # podman's defaults: skipped, with the reason (docs/DEPLOY.md)
        assert jail == "active" or (jail.startswith("skipped: ") and len(jail) > 20), jail
        url = f"http://127.0.0.1:{port}"
        played = subprocess.run([sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--url", url,
                                 "--tasks", "copy-head", "--level", "easy", "--episodes", "1", "--out",
                                 str(tmp_path / "eval")], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert played.returncode == 0, played.stderr[-2000:]
        summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
        assert summary["overall"]["mean_score"] == 0.99
        stopping = time.monotonic()
        subprocess.run([ENGINE, "stop", "-t", "30", cid], capture_output=True, check=True)  # SIGTERM, then 30 s
        assert time.monotonic() - stopping < 25, "the server did not stop on SIGTERM"
        state = json.loads(subprocess.run([ENGINE, "inspect", cid], capture_output=True, text=True).stdout)[0]["State"]
        assert state["ExitCode"] == 0, state


def test_the_image_runs_read_only_as_an_unprivileged_uid(engine_args: list[str]) -> None:
    """As OpenEnv's runtime validation runs it: only /tmp writable, uid 65532, no capabilities."""
    read_only = ("--read-only", "--tmpfs", "/tmp", "--user", "65532:65532", "--cap-drop", "ALL")
    with started(engine_args, *read_only) as (cid, port):
        assert _health(port)["status"] == "healthy"
        logs = subprocess.run([ENGINE, "logs", cid], capture_output=True, text=True).stderr
        assert "results database: sqlite:////tmp/" in logs  # the unwritable data folder fell back to /tmp


def test_unmasking_proc_gives_the_namespace_jail(engine_args: list[str]) -> None:
    """With podman's defaults bwrap cannot mount a fresh /proc over the masked one; ``--security-opt unmask=ALL``
    (docs/DEPLOY.md) lets it, and the jail's namespaces become active inside the container."""
    with started(engine_args, "--security-opt", "unmask=ALL") as (_, port):
        assert "namespaces" in _health(port)["isolation_active"]


def test_openenv_validate_runs_its_runtime_level(engine_args: list[str], tmp_path: Path) -> None:
    """openenv.yaml's execution block: the validator builds the Dockerfile with no build arguments (the base and the
    torch wheel of build-local.sh are found locally), runs the image read-only and plays validation/runtime.json
    over the WebSocket. It calls the docker CLI, pointed here at podman's Docker API (needs catatonit for --init)."""
    if os.environ.get("MECHSANDBOX_CONTAINER_TESTS") != "full":
        pytest.skip("builds the image a second time (2 min): MECHSANDBOX_CONTAINER_TESTS=full runs it")
    if not ENGINE.endswith("podman"):
        pytest.skip("the docker engine is used directly; this test serves podman's Docker API")
    conf = tmp_path / "containers.conf"
    ulimits = [a for a in engine_args if "=" in a and a.split("=")[0] in ("nofile", "nproc")]
    runtime = engine_args[engine_args.index("--runtime") + 1] if "--runtime" in engine_args else ""
    conf.write_text(f"[containers]\ndefault_ulimits = {json.dumps(ulimits)}\n[engine]\n"
                    + (f'runtime = "{runtime}"\n' if runtime else ""))  # fmt: skip
    sock = tmp_path / "podman.sock"
    service = subprocess.Popen([ENGINE, "system", "service", "--time=0", f"unix://{sock}"],
                               env={**os.environ, "CONTAINERS_CONF": str(conf)}, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        cli = Path(sys.executable).with_name("openenv")
        out = subprocess.run([str(cli), "validate"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "DOCKER_HOST": f"unix://{sock}"})  # fmt: skip
    finally:
        service.terminate()
        service.wait(timeout=30)
    report = out.stdout
    for check in ("runtime.startup", "runtime.observation_schema", "runtime.reward_well_formed",
                  "runtime.state_contract"):  # fmt: skip
        assert f"PASS  {check}" in report, report[-3000:]
    assert "FAIL" not in report and out.returncode == 0, report[-3000:]
