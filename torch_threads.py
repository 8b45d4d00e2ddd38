"""One place that decides how many intra-op threads torch uses in a MechSandbox process that runs the task models.

Why one thread: the models are small (a few layers, widths of tens to hundreds), so a forward pass is many tiny
kernels and each extra OpenMP thread adds a synchronisation per kernel and little else. On a busy machine it is
worse: torch's default (one thread per core) spins threads that wait on each other while other processes hold the
cores. A copy-head reset of the Gymnasium env took 0.90 s (median, up to 2.7 s) at the default beside four CPU hogs
on 2 cores and 0.14 s on one thread (issue 52 measured 6.3 s against 0.21 s on a busier machine). The server's
sandbox workers run the same models on one thread for the same reason (``server/sandbox/guest/zygote.py``).

A choice the user made is kept: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment (torch read it when it
started), or an earlier ``torch.set_num_threads`` (seen as a count other than the one torch starts with). Torch
starts with one thread per physical core, so a ``set_num_threads`` to exactly that count cannot be told from the
default and is replaced; the environment variable is the sure way to ask for it.

One exception to keeping the user's count: in a forked child (Gymnasium's ``AsyncVectorEnv`` forks its workers) the
first call sets one thread whatever the count. The parent's OpenMP threads do not come along in a fork, and
libgomp's first parallel region in the child waits for them forever: the workers hung at their first reset when the
parent had run torch on 2 threads (``OMP_NUM_THREADS=2``).

Used by ``mechsandbox.gym`` (each env's construction), the examples (their first step) and meant for the server's
start, so that every process that runs the models follows the same rule.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

DEFAULT_THREADS = 1
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The environment variables torch reads for its intra-op thread count at start; either set means the user chose."""


def physical_cores() -> int | None:
    """The number of physical cores Linux lists (distinct package and core ids), or None where it lists none."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            continue
    return len(cores) or None


def torch_default_counts() -> set[int]:
    """The counts torch may start with when nobody chose: one thread per physical core (its rule), or per CPU the
    process may use or the machine has (where the core count is not known or a build counts differently)."""
    counts = {os.cpu_count() or 1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1}
    cores = physical_cores()
    if cores:
        counts.add(cores)
    return counts


_configured = False  # the first call in this process decided; later calls keep whatever is in force
_forked = False  # this process is a fork of one that imported this module: its first call sets one thread


def _after_fork_in_child() -> None:
    global _configured, _forked
    _configured, _forked = False, True  # no torch call here: the hook runs on every os.fork of the process


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def user_chose_threads() -> bool:
    """Whether the process's thread count is the user's choice (an environment variable or ``set_num_threads``)."""
    if any(os.environ.get(name, "").strip() for name in THREAD_VARIABLES):
        return True
    return torch.get_num_threads() not in torch_default_counts()


def configure_torch_threads(threads: int = DEFAULT_THREADS) -> int:
    """Set torch's intra-op threads to ``threads`` unless the user chose a count (see the module docstring); return
    the count now in force. Only the first call in a process sets anything: a later one (every env construction
    calls it) keeps what is in force, so a ``set_num_threads`` the user made after the first env stays."""
    global _configured, _forked
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    if _forked and not _configured:
        torch.set_num_threads(1)  # the parent's OpenMP threads are not here (module docstring)
    elif not _configured and not user_chose_threads():
        torch.set_num_threads(threads)
    _configured, _forked = True, False
    return torch.get_num_threads()
