"""The agent side stays light: the typed client, the agents, the LLM agent and inference.py import
neither torch nor any task family nor OpenEnv's Gradio interface (openenv_core.py says why: 3.9 s of the client's
import); each import runs in a fresh interpreter, since this one has them all;
``select_tasks`` gives ``TASKS`` the meaning it had when it read the installed families."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mechsandbox.catalogue import local_catalogue, select_tasks
from mechsandbox.tasks import families

ROOT = Path(__file__).resolve().parents[1]
REPORT = """
import json, sys
heavy = [m for m in sys.modules if m in ("torch", "gradio") or m.startswith(("torch.", "gradio.", "mechsandbox.tasks"))]
print(json.dumps(sorted(heavy)))
"""


def heavy_modules_after(statement: str) -> list[str]:
    """The torch and task modules a fresh interpreter holds after running ``statement``."""
    out = subprocess.run([sys.executable, "-c", statement + "\n" + REPORT], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "module", ["mechsandbox.client", "mechsandbox.agents", "mechsandbox.agents.llm", "mechsandbox.catalogue"]
)
def test_client_modules_import_neither_torch_nor_tasks(module: str) -> None:
    assert heavy_modules_after(f"import {module}") == []


def test_inference_script_imports_neither_torch_nor_tasks() -> None:
    # run_name other than "__main__": the module is executed (every import it makes), main() is not.
    statement = f"import runpy; assert 'main' in runpy.run_path({str(ROOT / 'inference.py')!r}, run_name='probe')"
    assert heavy_modules_after(statement) == []


def test_the_probe_sees_torch_when_it_is_loaded() -> None:
    loaded = heavy_modules_after("import mechsandbox.tasks")
    assert "torch" in loaded and "mechsandbox.tasks" in loaded
    assert "gradio" in heavy_modules_after("import openenv.core")  # OpenEnv's own import brings its interface


def test_the_server_leaves_openenvs_gradio_interface_unimported_and_gradio_usable() -> None:
    """The server imports OpenEnv without its interface (openenv_core.py); gradio itself still imports afterwards, and
    a program that imported gradio first keeps it."""
    after = heavy_modules_after("import mechsandbox.server.app")
    assert "torch" in after and not any(m == "gradio" or m.startswith("gradio.") for m in after)
    assert "gradio" in heavy_modules_after("import mechsandbox.server.app, gradio")
    assert "gradio" in heavy_modules_after("import gradio, mechsandbox.server.app")


def test_select_tasks_reads_ids_aliases_and_all() -> None:
    catalogue = local_catalogue()
    every = [fam.id for fam in families()]
    assert select_tasks("all", catalogue) == select_tasks("", catalogue) == every
    assert select_tasks(" task5, dead-neurons ,,das", catalogue) == ["copy-head", "dead-neurons", "causal-subspace"]
    for fam in families():
        assert select_tasks(",".join(fam.aliases), catalogue) == [fam.id] * len(fam.aliases)
    with pytest.raises(KeyError, match="unknown task 'no-such-task'"):
        select_tasks("copy-head,no-such-task", catalogue)
