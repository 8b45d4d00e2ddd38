"""OpenEnv packaging: both generations of `openenv validate`, `--url` against a running server, the
submission validator script, the lock file and the README's Space front matter."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from server_harness import running_server

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("MECHSANDBOX_TOOLS", Path.home() / ".cache" / "mechsandbox-tools"))
NEW_CLI = Path(sys.executable).parent / "openenv"  # openenv 0.10.0, a project dependency


def old_cli() -> Path:
    """openenv-core 0.3.0 in its own tool environment (it owns the same `openenv` import package)."""
    venv = TOOLS / "openenv-core-0.3.0"
    cli = venv / "bin" / "openenv"
    if not cli.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "openenv-core==0.3.0"], check=True, timeout=900)
    return cli


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("pkg")) as s:
        yield s


def test_new_openenv_validate_passes_static_checks() -> None:
    """The static level; the runtime level that openenv.yaml declares (its execution block) builds and runs the image
    with a container engine: tests/test_container_image.py runs it."""
    out = subprocess.run([str(NEW_CLI), "validate", "--level", "static"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  static.manifest" in out.stdout and "FAIL" not in out.stdout
    manifest = (ROOT / "openenv.yaml").read_text()
    assert "execution: {kind: openenv_ws, probe_path: validation/runtime.json" in manifest


def test_old_openenv_validate_passes() -> None:
    out = subprocess.run([str(old_cli()), "validate"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "[OK]" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("generation", ["new", "old"])
def test_openenv_validate_url(server, generation: str) -> None:
    cli = NEW_CLI if generation == "new" else old_cli()
    out = subprocess.run([str(cli), "validate", "--url", server.url], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"passed": false' not in out.stdout


def test_submission_validator_runs_every_check_it_can(server) -> None:
    out = subprocess.run(["bash", str(ROOT / "validate-submission.sh"), server.url, str(ROOT)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert sum("PASSED --" in line for line in lines) == 4
    assert any("openenv validate passed, static level only" in line for line in lines)
    assert any("SKIPPED -- docker build NOT RUN" in line and "daemon" in line for line in lines)
    strict = subprocess.run(["bash", str(ROOT / "validate-submission.sh"), server.url, str(ROOT), "--strict"],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert strict.returncode == 1 and "FAILED -- docker build could not run" in strict.stdout
    assert "Validation stopped at Step 2" in strict.stdout


def test_submission_validator_shows_why_openenv_validate_failed(server, tmp_path: Path) -> None:
    """A repository whose openenv.yaml OpenEnv refuses (a reversed reward range): step 3 fails, and the report shows
    the failing check with openenv's reason and remedy under it, and the verdict."""
    manifest = (ROOT / "openenv.yaml").read_text()
    assert "reward: {range: [0.0, 1.0]" in manifest
    (tmp_path / "openenv.yaml").write_text(manifest.replace("reward: {range: [0.0, 1.0]", "reward: {range: [1.0, 0.0]"))
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")  # never built: the docker step finds no engine
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",  # openenv beside this interpreter
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(ROOT / "validate-submission.sh"), server.url, str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert out.returncode == 1 and "FAILED -- openenv validate failed" in out.stdout, out.stdout + out.stderr
    report = out.stdout.split("FAILED -- openenv validate failed", 1)[1]
    assert "FAIL  static.manifest" in report and "reward range must be strictly increasing" in report, report
    assert "remediation:" in report and "Verdict: FAIL" in report and "Validation stopped at Step 3" in report
    assert "Validation report for" not in report  # the checks and the verdict, not openenv's whole output


def test_submission_validator_fails_on_an_unreachable_server(tmp_path) -> None:
    out = subprocess.run(["bash", str(ROOT / "validate-submission.sh"), "http://127.0.0.1:9", str(ROOT)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "FAILED -- the environment is not reachable" in out.stdout
    usage = subprocess.run(["bash", str(ROOT / "validate-submission.sh")], capture_output=True, text=True)
    assert usage.returncode == 1 and "usage" in usage.stderr


def test_lock_file_and_scripts() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["server"] == "mechsandbox.server.app:main"
    assert "openenv==0.10.0" in project["project"]["dependencies"]
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    names = {p["name"]: p.get("version") for p in lock["package"]}
    assert names["openenv"] == "0.10.0" and "torch" in names and "mechsandbox" in names
    app = (ROOT / "server" / "app.py").read_text()
    assert "def main(" in app and 'if __name__ == "__main__":\n    main()' in app


def test_readme_has_space_front_matter() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n")
    front = text.split("---\n")[1]
    for line in ("sdk: docker", "app_port: 8000", "- openenv"):
        assert line in front


def test_the_runtime_plan_is_valid_and_its_answer_is_right() -> None:
    """validation/runtime.json, which openenv validate plays against the image: a plan its own model accepts, whose
    reset names a real task and whose last action is that instance's right answer (so a generator change shows)."""
    from mechsandbox.tasks import get_family
    from openenv.validation.runtime.contracts import RuntimePlan

    plan = RuntimePlan.model_validate_json((ROOT / "validation" / "runtime.json").read_text())
    options = plan.reset.options
    inst = get_family(options["task_id"]).generate(plan.reset.seed, options["level"])
    answer = plan.actions[-1]["solution_target"]
    assert get_family(options["task_id"]).grade(answer, inst.truth, inst).score == 0.99
