"""The image itself, built on docker/build-local.sh's base and run by a real engine (podman here): it starts, says which
sandbox layers hold inside it, plays a scripted episode through its port, runs read-only as an unprivileged uid (as
OpenEnv's runtime validation runs it), stops gracefully, holds the "assume escaped" attacks inside it, and passes
validate-submission.sh with every step run for real, ``openenv validate``'s runtime level included.

Needs podman (or a docker engine), mmdebstrap, runc and catatonit: .ci/run installs them, and the file skips with
that reason where they are missing. The image build is about 3.5 minutes of one core (mmdebstrap of the base, the
install, ``gen-art --check`` in the image), so conftest.py starts this file first (tests/time_budget.json,
"start_first"): its waits on the engine then overlap the other worker's tests instead of ending the run.
The image is built once, through podman's Docker API (on build-local.sh's base): validate-submission.sh's ``docker
build`` and ``openenv validate``'s build then find every layer cached. A podman CLI build would share none with them
(podman 4.3: a fresh CI run paid two builds, +4 min): docs/DEPLOY.md, "The validator, for real".
"""

from __future__ import annotations

import contextlib
import fcntl
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
from escape_attacks import CONFIGS, EXPECTED
from server_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
TAG = "localhost/mechsandbox:test"  # qualified: the API would name a short tag docker.io/library/...
ENGINE = os.environ.get("ENGINE") or shutil.which("podman") or shutil.which("docker") or "podman"

MISSING = [tool for tool in (ENGINE, "mmdebstrap") if not shutil.which(tool)]
INSTALL = "apt-get install podman mmdebstrap runc catatonit (.ci/run)"
SKIP = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} missing: {INSTALL}")
pytestmark = [pytest.mark.container, SKIP]


@pytest.fixture(scope="module")
def engine_args(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Builds the image once; returns what a container needs to start on this host (podman inside a container: runc
    and lowered rlimits). The build goes through the Docker API where podman serves one, as validate-submission.sh's
    ``docker build`` and ``openenv validate``'s build go: builds through the API share their layers with each other
    but not with the podman CLI's, so those two then find every layer cached instead of building twice more. Under a
    lock shared by the xdist workers: a worker that steals a test of this file waits, then hits the cache."""
    with open(tmp_path_factory.getbasetemp().parent / "container-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        args = _base_and_engine_args()
        if docker_host and shutil.which("docker"):
            build = ["docker", "build", "-t", TAG, str(ROOT)]
        else:
            build = [ENGINE, "build", *args, "-t", TAG, str(ROOT)]
        env = {**os.environ, "DOCKER_HOST": docker_host} if docker_host else dict(os.environ)
        built = subprocess.run(build, env=env, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return args


def _base_and_engine_args() -> list[str]:
    """docker/build-local.sh's base (mmdebstrap, tagged python:3.11-slim) and torch wheel; the engine arguments it
    probes. Idempotent: the lock of the first caller's fixture makes the second wait for the first's base."""
    script = str(ROOT / "docker" / "build-local.sh")
    base = subprocess.run(["sh", script, "--base-only"], capture_output=True, text=True, timeout=900)
    assert base.returncode == 0, base.stderr[-3000:]
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
        page = httpx.get(f"{url}/web/static/playground.js", timeout=10)  # the pages' files were installed
        assert page.status_code == 200 and "textContent" in page.text
        played = subprocess.run([sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--url", url,
                                 "--tasks", "copy-head", "--level", "easy", "--episodes", "1", "--out",
                                 str(tmp_path / "eval")], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert played.returncode == 0, played.stderr[-2000:]
        summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
        assert summary["overall"]["mean_score"] == 0.99
        running = _host_pids(cid)  # the server, the sandbox's zygote and its workers, as host pids
        assert len(running) >= 3, running
        stopping = time.monotonic()
        subprocess.run([ENGINE, "stop", "-t", "30", cid], capture_output=True, check=True)  # SIGTERM, then 30 s
        assert time.monotonic() - stopping < 25, "the server did not stop on SIGTERM"
        state = json.loads(subprocess.run([ENGINE, "inspect", cid], capture_output=True, text=True).stdout)[0]["State"]
        assert state["ExitCode"] == 0, state
        assert not [pid for pid in running if Path(f"/proc/{pid}").exists()], "a process outlived the container"


def _host_pids(cid: str) -> list[int]:
    listed = subprocess.run([ENGINE, "top", cid, "hpid"], capture_output=True, text=True, check=True).stdout.split()
    return [int(word) for word in listed if word.isdigit()]


def test_the_image_runs_read_only_as_an_unprivileged_uid(engine_args: list[str]) -> None:
    """As OpenEnv's runtime validation runs it: only /tmp writable, uid 65532, no capabilities."""
    read_only = ("--read-only", "--tmpfs", "/tmp", "--user", "65532:65532", "--cap-drop", "ALL")
    with started(engine_args, *read_only) as (cid, port):
        assert _health(port)["status"] == "healthy"
        logs = subprocess.run([ENGINE, "logs", cid], capture_output=True, text=True).stderr
        assert "results database: sqlite:////tmp/" in logs  # the unwritable data folder fell back to /tmp


@pytest.mark.parametrize("security", ["engine defaults", "unmask=ALL"])
def test_assume_escaped_inside_the_image(engine_args: list[str], security: str) -> None:
    """tests/escape_probe.py in the image, as its user: plain Python in a hardened worker (as if the language policy
    and the facades had fallen) against every layer the container allows. With podman's defaults bwrap cannot mount a
    fresh /proc over the masked one, so the jail is off and the outcomes are the host table's "no-jail" column (stat
    and /proc/PID then reach the container's own files and processes); ``--security-opt unmask=ALL`` (docs/DEPLOY.md)
    gives the jail, and every attack is denied. A worker that disables its own exit dies with its SIGKILLed owner."""
    extra = ["--security-opt", "unmask=ALL"] if security == "unmask=ALL" else []
    command = [*extra, "-v", f"{ROOT / 'tests'}:/probe:ro", TAG, "python", "/probe/escape_probe.py"]
    probe = subprocess.run([ENGINE, "run", "--rm", *engine_args, *command], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.splitlines()[-1])
    layers = report["layers"]
    assert layers["landlock"] == layers["seccomp"] == layers["rlimits"] == "active", layers
    assert layers["uid"].startswith("skipped: the server does not run as root"), layers  # the image's user
    jailed = layers["namespaces"] == "active"
    assert jailed or (security == "engine defaults" and layers["namespaces"].startswith("skipped: ")), layers
    column = list(CONFIGS).index("all" if jailed else "no-jail")
    assert report["attacks"] == {attack: row[column] for attack, row in EXPECTED.items()}
    assert report["stuck"]["result"] == "stuck" and report["survivors"] == [], report


@pytest.fixture(scope="module")
def docker_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Where the docker CLI finds an engine: podman's Docker API, serving this host's engine arguments as its defaults
    (containers.conf), on the storage build-local.sh built the base into; a docker engine serves its own."""
    if not ENGINE.endswith("podman"):
        yield os.environ.get("DOCKER_HOST", "")
        return
    with open(tmp_path_factory.getbasetemp().parent / "container-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        engine_args = _base_and_engine_args()
    folder = tmp_path_factory.mktemp("podman-api")
    conf = folder / "containers.conf"
    ulimits = [a for a in engine_args if "=" in a and a.split("=")[0] in ("nofile", "nproc")]
    runtime = engine_args[engine_args.index("--runtime") + 1] if "--runtime" in engine_args else ""
    conf.write_text(f"[containers]\ndefault_ulimits = {json.dumps(ulimits)}\n[engine]\n"
                    + (f'runtime = "{runtime}"\n' if runtime else ""))  # fmt: skip
    sock = folder / "podman.sock"
    service = subprocess.Popen([ENGINE, "system", "service", "--time=0", f"unix://{sock}"],
                               env={**os.environ, "CONTAINERS_CONF": str(conf)}, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        yield f"unix://{sock}"
    finally:
        service.terminate()
        service.wait(timeout=30)


def test_validate_submission_runs_every_step_against_the_image(engine_args: list[str], docker_host: str) -> None:
    """validate-submission.sh --strict, nothing skipped: ping the running image, ``docker build`` (the docker CLI),
    ``openenv validate`` with its runtime level (openenv.yaml's execution block: it builds the Dockerfile with no
    build arguments, runs the image read-only and plays validation/runtime.json over the WebSocket), then every task
    and level and a scripted episode through the image's port."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    with started(engine_args) as (_, port):
        _health(port)
        out = subprocess.run(["bash", str(ROOT / "validate-submission.sh"), f"http://127.0.0.1:{port}", str(ROOT),
                              "--strict"], capture_output=True, text=True, timeout=1500, env=env)  # fmt: skip
    report = out.stdout
    assert out.returncode == 0 and "All 5/5 checks passed" in report, report[-3000:]
    assert "PASSED -- docker build succeeded" in report, report[-3000:]
    assert "openenv validate passed, static and runtime levels" in report, report[-3000:]
    for check in ("startup", "observation_schema", "reward_well_formed", "state_contract"):
        assert f"PASS  runtime.{check}" in report, report[-3000:]
