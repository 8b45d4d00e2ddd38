"""The console script, the artifacts (``gen-art --check``) and the installed package's layout."""

from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import cached_instance
from mechsandbox import export
from mechsandbox.tasks import families, generate

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "mechsandbox.cli"]
REQUIRED = {
    "id",
    "aliases",
    "difficulty",
    "levels",
    "answer_format",
    "answer_schema",
    "answer_example",
    "max_steps",
    "family_version",
    "description",
}
FAMILIES = [
    "dead-neurons",
    "multiplication-neuron",
    "fourier-frequencies",
    "additive-bypass",
    "copy-head",
    "induction-circuit",
    "committee-circuit",
    "modular-addition",
    "head-roles",
    "causal-subspace",
    "fact-storage",
    "superposition",
]


def test_tasks_json_lists_every_family() -> None:
    out = subprocess.run([*CLI, "tasks", "--json"], capture_output=True, text=True, check=True).stdout
    cards = json.loads(out)
    assert sorted(c["id"] for c in cards) == sorted(FAMILIES)
    for card in cards:
        assert set(card) >= REQUIRED, card["id"]
        assert set(card["max_steps"]) == {"easy", "medium", "hard"}
        assert any(a.startswith("task") for a in card["aliases"])


@pytest.mark.parametrize("task_id", FAMILIES)
def test_answer_example_is_valid_for_any_instance(task_id: str) -> None:
    fam = next(f for f in families() if f.id == task_id)
    for level in fam.levels:
        inst = cached_instance(task_id, 3, level)
        assert not fam.grade(fam.answer_example, inst.truth, inst).rejected


def test_tasks_table_and_command_usage() -> None:
    table = subprocess.run([*CLI, "tasks"], capture_output=True, text=True, check=True).stdout
    assert all(t in table for t in FAMILIES)
    evaluate = subprocess.run([*CLI, "eval"], capture_output=True, text=True)
    assert evaluate.returncode == 2 and "required: --agent, --out" in evaluate.stderr
    serve = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True)
    assert serve.returncode == 0 and "--port" in serve.stdout


def test_committed_artifacts_match_regeneration() -> None:
    assert export.check(export.DEFAULT_DIR, progress=False) == []
    manifest = json.loads((export.DEFAULT_DIR / "manifest.json").read_text())
    assert manifest["family_versions"] == {f.id: f.family_version for f in families()}

    def keys(value) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys(v)}
        if isinstance(value, list):
            return {k for v in value for k in keys(v)}
        return set()

    for name in manifest["files"]:
        if name.endswith(".json"):
            public = json.loads((export.DEFAULT_DIR / name).read_text())
            public.pop("answer_schema")  # the schema names the answer's fields, not their values
            found = keys(public)
            assert not found & {"truth", "indices", "heads", "roles", "frequencies", "pairs"}, name


def test_check_reports_tampering(tmp_path: Path) -> None:
    copy = tmp_path / "artifacts"
    shutil.copytree(export.DEFAULT_DIR, copy)
    victim = next(copy.glob("dead-neurons/easy/seed0.safetensors"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    (copy / "copy-head/easy/seed1.json").unlink()
    problems = export.check(copy, progress=False)
    assert any("dead-neurons/easy/seed0.safetensors" in p and "differs" in p for p in problems)
    assert any("copy-head/easy/seed1.json" in p and "missing" in p for p in problems)
    result = subprocess.run([*CLI, "gen-art", "--check", "--quiet", "--out", str(copy)], capture_output=True, text=True)
    assert result.returncode == 1 and "FAILED" in result.stderr


def test_artifacts_load_without_pickle() -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(export.DEFAULT_DIR / "copy-head/easy/seed0.safetensors"))
    inst = generate("copy-head", 0, "easy")
    for key, value in inst.model.state_dict().items():
        assert (tensors[f"model.{key}"] == value).all()


def test_wheel_installs_one_namespace(tmp_path: Path) -> None:
    """A plain build puts everything under mechsandbox/ and nothing generic (tasks/, server/) at top level."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("mechsandbox-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"mechsandbox"}
    for module in (
        "mechsandbox/tasks/copy_head/generator.py",
        "mechsandbox/arch/hooked.py",
        "mechsandbox/cli.py",
        "mechsandbox/server/__init__.py",
    ):
        assert module in names
    packages = {
        str(p.parent.relative_to(ROOT))
        for p in ROOT.glob("**/__init__.py")
        if ".venv" not in p.parts and "tests" not in p.parts and "build" not in p.parts
    }
    for pkg in packages:
        prefix = "mechsandbox/" + ("" if pkg == "." else pkg + "/") + "__init__.py"
        assert prefix in names, f"{pkg} is missing from the wheel (setup.py's package discovery)"
    import mechsandbox.tasks as tasks_pkg

    family_packages = [m.name for m in pkgutil.iter_modules(tasks_pkg.__path__) if m.ispkg]
    assert len(family_packages) == len(families())  # the registry found one family per package
    for name in family_packages:  # and every one of them ships
        assert f"mechsandbox/tasks/{name}/__init__.py" in names and f"mechsandbox/tasks/{name}/generator.py" in names
