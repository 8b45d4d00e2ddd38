"""The Dockerfile's shape, and its install and start steps run in a clean virtualenv where no engine builds the image.

The image installs with ``docker/install.sh`` and starts with its CMD; the second test runs the same script
in a fresh venv (torch from pip's local configuration instead of the PyTorch index), starts the CMD
with ``PORT`` set, and runs the image's HEALTHCHECK command against it. Where this session also builds and runs the
real image (tests/test_container_image.py selected, podman and mmdebstrap present, as in CI), that test runs the same
script inside the image and much more, so this one skips and says so: about 2 minutes of test time saved in CI.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from container_engine import builds_the_real_image
from server_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_dockerfile_shape() -> None:
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in DOCKERFILE
    assert "ENABLE_WEB_INTERFACE=false" in DOCKERFILE and "docker/install.sh" in DOCKERFILE
    user = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert user and user[-1] not in ("root", "0")
    health = re.search(r"^\s*CMD python -c (.+)$", DOCKERFILE, re.M)
    assert health and "curl" not in DOCKERFILE.split("HEALTHCHECK")[1].split("\n\n")[0]
    assert json.loads(re.search(r"^CMD (\[.+\])$", DOCKERFILE, re.M).group(1)) == ["mechsandbox", "serve"]
    assert not re.search(r"^VOLUME", DOCKERFILE, re.M)  # OpenEnv's runtime validation refuses images with one
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\nFROM \$\{BASE_IMAGE\}$", DOCKERFILE, re.M)


@pytest.fixture(scope="module")
def clean_venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if builds_the_real_image(request.session):
        pytest.skip("tests/test_container_image.py builds and runs the real image in this session (install.sh, the "
                    "CMD, PORT and the HEALTHCHECK inside it); this venv replay is for machines without an engine")
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "TORCH_INDEX_URL": ""}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(["sh", str(ROOT / "docker" / "install.sh"), str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "artifacts differ" not in done.stderr
    return venv


def test_image_steps_install_start_and_pass_the_healthcheck(clean_venv: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MECHSANDBOX_")}
    env.update(PATH=f"{clean_venv / 'bin'}:{os.environ['PATH']}", PORT=str(port), ENABLE_WEB_INTERFACE="false",
               MECHSANDBOX_HOST="127.0.0.1", HOME=str(tmp_path))  # fmt: skip
    cmd = json.loads(re.search(r"^CMD (\[.+\])$", DOCKERFILE, re.M).group(1))
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert health.json()["isolation"]["seccomp"] == "active"
        check = shlex.split(re.search(r"^\s*CMD (python -c .+)$", DOCKERFILE, re.M).group(1))
        assert subprocess.run(check, env=env, timeout=30).returncode == 0
        reset = httpx.post(f"http://127.0.0.1:{port}/reset", json={}, timeout=60)
        assert reset.status_code == 200 and reset.json()["observation"]["prompt"]
        probe = [str(clean_venv / "bin" / "python"), "-c", "import mechsandbox; print(mechsandbox.__file__)"]
        installed = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert str(clean_venv) in installed.stdout  # the installed package, not the checkout
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            assert server.wait(timeout=20) == 0  # graceful shutdown
        finally:
            if server.poll() is None:
                server.kill()
            log.close()
