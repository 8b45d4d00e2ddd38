"""docs/CONTRIBUTING.md's worked family, built through the documented steps and used end to end.

The test copies the package to a temporary folder, writes the guide's four files into it exactly as
the guide shows them, and runs the copy (``PYTHONPATH`` puts it ahead of the installed package):
the family is listed by the registry and by ``mechsandbox tasks``, generates and grades at every
level, and ``mechsandbox eval`` serves it from a real server and solves it with the scripted agent.
So the guide cannot drift from what the code needs, and "four files" stays true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "CONTRIBUTING.md"
BLOCK = re.compile(r"<!-- file: (?P<path>[\w/.]+) -->\n```python\n(?P<code>.*?)\n```", re.S)
NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "artifacts", "tests", "bench", "docs", "build", "*.egg-info",
                                    "__pycache__", "uv.lock")  # fmt: skip


def guide_files() -> dict[str, str]:
    return {m["path"]: m["code"] + "\n" for m in BLOCK.finditer(GUIDE.read_text())}


@pytest.fixture(scope="module")
def copy_with_family(tmp_path_factory) -> dict[str, str]:
    files = guide_files()
    assert len(files) == 4 and len({Path(p).parent for p in files}) == 1, "the common case is four files"
    root = tmp_path_factory.mktemp("contrib")
    package = root / "mechsandbox"
    shutil.copytree(ROOT, package, ignore=NOT_COPIED)
    for rel, code in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(code)
    return {**os.environ, "PYTHONPATH": str(root), "root": str(root)}


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in env.items() if k != "root"}
    return subprocess.run([sys.executable, *args], env=clean, capture_output=True, text=True, timeout=timeout)


LISTED_GENERATED_GRADED = """
import json, sys
import mechsandbox
from mechsandbox.tasks import LEVELS, families, generate, grade
assert mechsandbox.__file__.startswith(sys.argv[1]), mechsandbox.__file__
fam = families()[-1]
scores = []
for level in LEVELS:
    for seed in range(4):
        inst = generate("silent-inputs", seed, level)
        assert "silent" not in json.dumps(inst.config)
        scores.append(grade("silent-inputs", inst.truth["indices"], inst.truth).score)
        scores.append(grade("silent-inputs", fam.answer_example, inst.truth).score)
print(json.dumps({"ids": [f.id for f in families()], "scores": scores}))
"""


def test_the_documented_family_is_listed_generated_and_graded(copy_with_family) -> None:
    done = run(copy_with_family, "-c", LISTED_GENERATED_GRADED, copy_with_family["root"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["ids"][-1] == "silent-inputs" and len(out["ids"]) >= 13
    truth_scores, example_scores = out["scores"][::2], out["scores"][1::2]
    assert set(truth_scores) == {0.99} and max(example_scores) < 0.99
    table = run(copy_with_family, "-m", "mechsandbox.cli", "tasks", "--json")
    assert table.returncode == 0 and "silent-inputs" in {c["id"] for c in json.loads(table.stdout)}


def test_the_documented_family_is_served_and_solved_by_the_scripted_agent(copy_with_family, tmp_path) -> None:
    out = tmp_path / "run"
    done = run(copy_with_family, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--tasks", "silent-inputs",
               "--level", "all", "--split", "train", "--seeds", "0-1", "--episodes", "2", "--concurrency", "2",
               "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["task_id"] for r in rows} == {"silent-inputs"}
    assert all(r["score"] == 0.99 for r in rows), rows


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ("import torch.no_such_module\n", "No module named 'torch.no_such_module'"),
        ("VALUE = 1  # a package under tasks/ without FAMILY\n", "defines no FAMILY"),
    ],
)
def test_a_family_package_that_fails_is_an_error_never_skipped(tmp_path, init: str, message: str) -> None:
    package = tmp_path / "mechsandbox"
    shutil.copytree(ROOT, package, ignore=NOT_COPIED)
    (package / "tasks" / "broken_family").mkdir()
    (package / "tasks" / "broken_family" / "__init__.py").write_text(init)
    done = run({**os.environ, "PYTHONPATH": str(tmp_path)}, "-c", "import mechsandbox.tasks")
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]
