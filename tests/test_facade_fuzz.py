"""The facade crash scan (bench/facade_fuzz.py) in full: no facade callable kills the process on non-finite or
empty tensors, and the scan itself reports a planted crash and resumes after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "facade_fuzz.py"


def scan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_no_facade_callable_crashes_the_process() -> None:
    run = scan()
    assert run.returncode == 0 and "0 crashed the process" in run.stdout, run.stdout + run.stderr[-2000:]
    assert int(run.stdout.split()[0]) > 900  # every module's callables, not a short list


def test_the_scan_reports_a_planted_crash_and_goes_on() -> None:
    run = scan("--modules", "torch.linalg,torch.fft", "--plant-crash")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "1 crashed the process" in run.stdout and "crash: planted.abort" in run.stdout, run.stdout
    total = int(run.stdout.split()[0])
    assert total > 50, run.stdout  # the callables after the planted one were scanned too
