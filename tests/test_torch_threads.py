"""Torch's thread count in the processes that run the task models outside the server (issue 52): the Gym env and the
examples set one intra-op thread (``torch_threads.py``) and keep a count the user chose. Each case runs in a fresh
interpreter whose environment has no ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (the suite sets them for its own
subprocesses), since torch reads them once, at its start."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mechsandbox.torch_threads import THREAD_VARIABLES, torch_default_counts

ROOT = Path(__file__).resolve().parents[1]
BACKSTOP_S = 180  # generous: a fresh interpreter imports torch and the families in seconds, more on a busy machine


def bare_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the thread variables (the OPENBLAS_ ones the CPU needs stay), plus
    ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}, **extra}


def run_python(code: str, **extra: str) -> list[str]:
    """``code``'s printed words. In a session of its own, so that a hang ends with every process it forked."""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=bare_environment(**extra), start_new_session=True)  # fmt: skip
    try:
        out, err = process.communicate(timeout=BACKSTOP_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == 0, err[-3000:]
    return out.split()


MAKE = """
import torch
{before}
import gymnasium, mechsandbox.gym
start = torch.get_num_threads()
gymnasium.make("MechSandbox/HeadDiscovery-v0")
first = torch.get_num_threads()
torch.set_num_threads(max(start, 2))  # the user's choice after the first env, even the default count
mechsandbox.gym.HeadDiscoveryEnv(tasks=["copy-head"])
print(start, first, torch.get_num_threads())
"""


@pytest.mark.skipif(2 not in torch_default_counts(), reason="needs a machine where torch starts with 2 threads")
def test_the_gym_env_sets_one_thread_and_keeps_a_later_choice() -> None:
    start, first, later = map(int, run_python(MAKE.format(before="")))
    assert (start, first, later) == (2, 1, 2)


@pytest.mark.skipif(2 not in torch_default_counts(), reason="needs a machine where torch starts with 2 threads")
def test_the_gym_env_keeps_the_users_environment_variable_and_set_num_threads() -> None:
    """OMP_NUM_THREADS=2 (torch's default count here: a choice only the variable shows) and an earlier
    ``set_num_threads(3)``. (Torch with MKL caps the variable at the physical cores: 3 would start it with 2.)"""
    start, first, _ = map(int, run_python(MAKE.format(before=""), OMP_NUM_THREADS="2"))
    assert start == first == 2
    start, first, _ = map(int, run_python(MAKE.format(before="torch.set_num_threads(3)")))
    assert start == first == 3


ASYNC = """
import numpy as np, torch, gymnasium
from mechsandbox.gym import HeadDiscoveryEnv
env = HeadDiscoveryEnv(tasks=["copy-head"], budget=4)
_, info = env.reset(seed=1)
env.step(int(np.flatnonzero(info["action_mask"])[0]))  # parallel regions on the user's 2 threads
envs = gymnasium.vector.AsyncVectorEnv([lambda: HeadDiscoveryEnv(tasks=["copy-head"], flatten=True)] * 2)
envs.reset(seed=[0, 1])
envs.step(np.array([0, 1]))
envs.close()
print(torch.get_num_threads())
"""


@pytest.mark.skipif(2 not in torch_default_counts(), reason="needs a machine where torch starts with 2 threads")
def test_forked_vector_env_workers_run_even_when_the_parent_used_two_threads() -> None:
    """AsyncVectorEnv forks its workers; with the parent's OpenMP team left behind, a worker on 2 threads hung in
    its first parallel region (libgomp waits for threads the fork did not copy). The workers run on one thread; the
    parent keeps the user's 2."""
    assert run_python(ASYNC, OMP_NUM_THREADS="2") == ["2"]


def first_lines(command: list[str], n: int) -> list[str]:
    """The first ``n`` lines ``command`` prints (it is then stopped): what a user sees before the long work."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                               env=bare_environment())  # fmt: skip
    lines: list[str] = []
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while len(lines) < n:  # each line is flushed whole
                assert selector.select(BACKSTOP_S), f"{command[1]} printed {lines} in {BACKSTOP_S} s, then nothing"
                line = process.stdout.readline()
                assert line, f"{command[1]} ended after {lines}"
                lines.append(line.rstrip("\n"))
        return lines
    finally:
        process.kill()
        process.wait(timeout=30)


def test_the_ppo_example_says_at_once_that_it_runs_on_one_thread_and_reports_each_update() -> None:
    """Its first line comes before any instance is generated, then a line per update (the whole example evaluates
    for minutes; tests/test_gym.py trains it at a suite-sized budget)."""
    script = str(ROOT / "examples" / "ppo_head_discovery.py")
    header, update, trained = first_lines([sys.executable, script, "--updates", "1", "--steps", "2",
                                           "--train-seeds", "1"], 3)  # fmt: skip
    assert header.startswith("ppo_head_discovery: 1 updates of 4 x 2 steps on 1 seeds") and (
        "torch on 1 thread;" in header
    ), header
    assert update.startswith("update   1: mean return") and trained.startswith("trained in"), (update, trained)


def test_the_grpo_example_says_at_once_that_it_runs_on_one_thread() -> None:
    """Before TRL and the model load (tests/test_trl.py runs the whole example against a server)."""
    [line] = first_lines([sys.executable, str(ROOT / "examples" / "grpo_mechsandbox.py"), "--tiny", "--max-steps", "2"],
                         1)  # fmt: skip
    assert line.startswith("grpo_mechsandbox: 2 steps") and "torch on 1 CPU thread" in line, line
