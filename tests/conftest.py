"""Shared fixtures and run-wide plumbing (helpers live in helpers.py, importable because pytest puts
tests/ on the path).

Two things here serve the whole run, whether it is one process or several pytest-xdist workers:

- the instance cache folder (``helpers.cached_instance``): created by the controlling process before
  any worker starts, handed down through the environment, removed when the run ends; likewise the
  results folder (``MECHSANDBOX_DATA_DIR``) of the servers the tests start, so none writes into the checkout;
- the per-file time budget (``tests/time_budget.json``): the run adds up each file's setup, call and
  teardown seconds and prints a table at the end, flagging every file over its budget, so the next
  change that makes the suite slower is seen where it happens. ``.ci/run`` shows that table.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers import FAMILY_IDS, INSTANCE_CACHE_ENV, shared_pool
from mechsandbox.tasks import LEVELS, Family, get_family

BUDGET_FILE = Path(__file__).with_name("time_budget.json")
RESULTS_ENV = "MECHSANDBOX_DATA_DIR"
_CONFIG: dict[str, pytest.Config] = {}  # the run's config, for the report hook (which is not given it)


@pytest.fixture(params=FAMILY_IDS)
def family(request) -> Family:
    return get_family(request.param)


@pytest.fixture(params=LEVELS)
def level(request) -> str:
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _close_shared_pool():
    yield
    if shared_pool.cache_info().currsize:
        shared_pool().close()


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # xdist workers carry ``workerinput``


def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config) and not os.environ.get(INSTANCE_CACHE_ENV):
        folder = tempfile.mkdtemp(prefix="mechsandbox-instances-")
        os.environ[INSTANCE_CACHE_ENV] = folder  # inherited by the xdist workers started after this
        config._instance_cache_dir = folder  # type: ignore[attr-defined]
    if _is_controller(config) and not os.environ.get(RESULTS_ENV):
        # Servers the tests start with a fixed salt keep their results database here, never in the checkout.
        results = tempfile.mkdtemp(prefix="mechsandbox-results-")
        os.environ[RESULTS_ENV] = results
        config._results_dir = results  # type: ignore[attr-defined]
    if _is_controller(config):
        # Every process the tests start (servers, `mechsandbox gen-art`, the CLI) gets one intra-op
        # thread too: on a 2-core machine already busy with the xdist workers, torch's default of one
        # thread per core made a subprocess's generation many times slower (threads spinning against
        # each other; `gen-art --check` measured 49 s alone, 16 min beside a loaded run).
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")
        # Servers the tests start do not generate instances ahead (server/prefetch.py): a seedless reset would set
        # one thread filling its (task, level) in the background, beside the suite's own generation on two cores.
        # tests/test_prefetch.py switches it on where it is the subject.
        os.environ.setdefault("MECHSANDBOX_PREFETCH_DEPTH", "0")
        # Nor generate cache misses in child processes (server/generator_pool.py): each would import torch and the
        # families (seconds of CPU) beside the suite. tests/test_generator_pool.py switches them on.
        os.environ.setdefault("MECHSANDBOX_GENERATORS", "0")
    if not _is_controller(config):
        # One intra-op thread per xdist worker: the workers already use every core, and the models
        # are small, so more threads only add synchronisation (artifacts must not depend on it:
        # gen-art --check compares their bytes with the manifest).
        torch.set_num_threads(1)
    config._file_seconds = defaultdict(float)  # type: ignore[attr-defined]
    config._run_started = time.monotonic()  # type: ignore[attr-defined]
    _CONFIG["config"] = config


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_instance_cache_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(INSTANCE_CACHE_ENV, None)
    results = getattr(config, "_results_dir", None)
    if results:
        shutil.rmtree(results, ignore_errors=True)
        os.environ.pop(RESULTS_ENV, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files with the largest time budget first (a stable sort: same order on every worker).

    Why: pytest-xdist hands tests out in collection order, so a heavy file collected last (the seed
    sweeps in ``test_variation.py``) would leave one worker busy long after the other ran dry.
    Longest first keeps the tail short. The files named in "start_first" come before all: they mostly
    wait (the container image's build and runs wait on the engine), and started first their waits
    overlap the other worker's tests instead of ending the run.
    """
    budget = _budget()
    files, first = budget.get("files", {}), budget.get("start_first", [])

    def order(item: pytest.Item) -> tuple[bool, float]:
        name = Path(item.nodeid.split("::")[0]).name
        return name not in first, -files.get(name, 0)

    items.sort(key=order)


def _budget() -> dict:
    return json.loads(BUDGET_FILE.read_text()) if BUDGET_FILE.exists() else {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seen by the controller for every phase of every test, also the ones run by xdist workers."""
    config = _CONFIG.get("config")
    if config is not None:
        config._file_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _is_controller(config):
        return
    seconds: dict[str, float] = config._file_seconds  # type: ignore[attr-defined]
    if not seconds:
        return
    budget = _budget()
    wall = time.monotonic() - config._run_started  # type: ignore[attr-defined]
    write = terminalreporter.write_line
    terminalreporter.section("time per test file (seconds of test time; budget in tests/time_budget.json)")
    over = []
    for path, spent in sorted(seconds.items(), key=lambda kv: -kv[1]):
        limit = budget.get("files", {}).get(Path(path).name)
        flag = ""
        if limit is None:
            flag = "  NO BUDGET"
        elif spent > limit:
            flag = "  OVER BUDGET"
            over.append(path)
        write(f"{spent:8.1f}  {'-' if limit is None else f'{limit:6.0f}':>6}  {path}{flag}")
    total = sum(seconds.values())
    write(f"{total:8.1f}  total test time; {wall:.0f} s wall for the run (budget {budget.get('wall_s', '-')} s)")
    if over:
        write(
            f"over budget: {', '.join(over)} -- speed them up or raise the budget with a reason in docs/PERFORMANCE.md"
        )
