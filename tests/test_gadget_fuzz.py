"""The gadget search (bench/gadget_fuzz.py), bounded: compositions of facade members, containers and protocols under
the sandbox's real policy expose no address, raw buffer, raw layout or dunder set by data; and, with issue 54's
guards taken out again, the same search finds those classes by itself (it is told the oracles, not the gadgets)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gadget_fuzz.py"
CLASSES = ("address", "dunder", "raw-buffer", "raw-layout")


def search(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_the_gadget_search_finds_nothing() -> None:
    run = search("--seconds", "20")
    assert run.returncode == 0 and "0 classes found" in run.stdout, run.stdout + run.stderr[-2000:]
    assert "stopped early" not in run.stdout, run.stdout  # every generated snippet ran to its end


def test_without_the_guards_the_search_finds_every_class() -> None:
    run = search("--seconds", "0", "--without-guards")  # the systematic pass alone
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    found = {line.split(":")[0].strip() for line in run.stdout.splitlines() if line.startswith("  ")}
    assert found == set(CLASSES), run.stdout
