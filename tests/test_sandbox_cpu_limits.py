"""A snippet's time limit counts the CPU time of its own worker, not the wall clock (issue 52).

On a busy machine a snippet gets a slice of a core: under a wall-clock limit a snippet that needs 2 s of CPU could take
15 s and lose a step for the machine's load. Here: a snippet beside CPU hogs on every core finishes; a snippet that
spins past its CPU limit is stopped with a message that names CPU time; a worker that waits without using CPU ends at
the wall-clock backstop; and a lost worker says whether the loss was the server's doing (``server_fault``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import cached_instance, wait_until
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings, SandboxUnavailable
from mechsandbox.server.sandbox.host.pool import SandboxSession, WorkerLost, soft_timeout

CPU_LIMIT = 3.0  # seconds of CPU per snippet: small, so the tests are short
SWALLOW = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"


@pytest.fixture(scope="module")
def payload() -> ModelPayload:
    return ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    with SandboxPool(SandboxSettings(pool_size=1, wall_seconds=CPU_LIMIT, test_unrestricted=True)) as p:
        yield p


@pytest.fixture
def session(pool: SandboxPool, payload: ModelPayload) -> Iterator[SandboxSession]:
    session = pool.open_session(payload)
    try:
        yield session
    finally:
        session.close()


def _loop_for(session: SandboxSession, cpu_seconds: float) -> str:
    """A snippet that needs about ``cpu_seconds`` of this worker's CPU: a plain loop, its length measured here on
    the worker itself (its CPU time from /proc around a short run), since the sandbox offers snippets no clock."""
    probe = 4_000_000
    worker = session.worker
    assert worker is not None
    before = worker.cpu_seconds()
    assert session.run(f"for i in range({probe}):\n    pass").error is None
    used = worker.cpu_seconds() - before
    assert used > 0.02, used  # enough clock ticks to measure the loop's speed
    return f"for i in range({int(probe * cpu_seconds / used)}):\n    pass\nprint('done')"


@pytest.fixture
def hogs() -> Iterator[None]:
    """Busy loops on every core, three per core, each in a session (and so a scheduling autogroup) of its own, like
    unrelated work on the machine."""
    count = 3 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]
    try:
        time.sleep(0.3)  # let them take the CPUs
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def test_a_snippet_beside_cpu_hogs_is_not_timed_out(session: SandboxSession, request: pytest.FixtureRequest) -> None:
    """It needs about 40 % of its CPU limit; the hogs stretch its wall time past the limit, and it still finishes."""
    code = _loop_for(session, 0.4 * CPU_LIMIT)
    request.getfixturevalue("hogs")
    result = session.run(code)
    assert result.error is None and result.stdout == "done\n" and not result.namespace_reset, result
    assert result.seconds > CPU_LIMIT, f"the hogs did not slow the snippet ({result.seconds:.2f} s): nothing shown"


def test_a_snippet_past_its_cpu_limit_gets_a_readable_timeout(session: SandboxSession) -> None:
    session.run("kept = 1")
    result = session.run("while True:\n    pass")
    assert result.error and "TimeoutError" in result.error and "CPU time" in result.error, result.error
    assert f"more than {soft_timeout(CPU_LIMIT):.1f} s of CPU time" in result.error  # its own timer, before the limit
    assert not result.namespace_reset and not result.server_fault
    assert session.run("print(kept)").stdout == "1\n"  # the worker's own timer: the namespace is kept


def test_a_snippet_that_swallows_its_timeout_is_killed_at_the_cpu_limit(session: SandboxSession) -> None:
    result = session.run(SWALLOW)
    assert result.namespace_reset and not result.server_fault
    assert result.error and f"used more than {CPU_LIMIT:g} s of CPU time" in result.error, result.error
    assert session.run("print(2)").stdout == "2\n"


@pytest.fixture(scope="module")
def backstop_pool() -> Iterator[SandboxPool]:
    """A pool whose backstop (4 s) comes soon after its CPU limit (3 s), so reaching it is quick."""
    settings = SandboxSettings(pool_size=1, wall_seconds=CPU_LIMIT, wall_backstop_seconds=4.0, test_unrestricted=True)
    with SandboxPool(settings) as p:
        yield p


def test_a_worker_that_waits_without_cpu_ends_at_the_wall_clock_backstop(
    backstop_pool: SandboxPool, payload: ModelPayload
) -> None:
    session = backstop_pool.open_session(payload)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerLost, match="4 s wall-clock backstop") as lost:
            session.unrestricted("import time\ntime.sleep(600)")
        assert time.monotonic() - started < 30  # bounded: a backstop, not the sleep
        assert not lost.value.server_fault and "waited" in lost.value.reason  # it slept: the snippet's doing
        assert session.unrestricted("result = 5")["result"] == 5  # a fresh worker
    finally:
        session.close()


def test_a_worker_starved_of_cpu_until_the_backstop_is_the_servers_fault(
    backstop_pool: SandboxPool, payload: ModelPayload, request: pytest.FixtureRequest
) -> None:
    """Beside three hogs per core it gets about a quarter of a core, so it spends most of the 4 s waiting for a CPU:
    the server admitted more work than the machine runs, and the loss is not the snippet's."""
    session = backstop_pool.open_session(payload)
    try:
        request.getfixturevalue("hogs")
        result = session.run("while True:\n    pass")
        assert result.namespace_reset and result.server_fault, result
        assert "too little CPU before the 4 s wall-clock backstop" in result.error
    finally:
        session.close()


def _run_in_thread(session: SandboxSession, code: str) -> tuple[threading.Thread, list]:
    results: list = []
    thread = threading.Thread(target=lambda: results.append(session.run(code)), daemon=True)
    thread.start()
    return thread, results


def test_a_worker_killed_by_the_server_is_marked_the_servers_fault(session: SandboxSession) -> None:
    """What the memory watchdog does when it kills a worker within its guarantee: ``kill(..., server_fault=True)``."""
    worker = session.worker
    assert worker is not None
    thread, results = _run_in_thread(session, "while True:\n    pass")
    wait_until(lambda: worker.busy, timeout_s=30)
    worker.kill("killed for another session's memory", server_fault=True)
    thread.join(timeout=30)
    (result,) = results
    assert result.server_fault and result.namespace_reset
    assert "another session's memory" in result.error
    after = session.run("print(3)")
    assert after.stdout == "3\n" and not after.server_fault


def test_a_worker_lost_with_its_zygote_is_the_servers_fault(session: SandboxSession, pool: SandboxPool) -> None:
    worker = session.worker
    assert worker is not None
    thread, results = _run_in_thread(session, "while True:\n    pass")
    wait_until(lambda: worker.busy, timeout_s=30)
    pool.zygote.process.kill()  # the zygote (or the bubblewrap holding it): its workers die with it
    thread.join(timeout=30)
    (result,) = results
    assert result.server_fault and result.namespace_reset and "zygote" in result.error, result
    wait_until(lambda: _prints(session, "4"), timeout_s=60)  # a new zygote, a fresh worker


def _prints(session: SandboxSession, text: str) -> bool:
    """True once the session runs a snippet again (False while the pool restarts its zygote)."""
    try:
        return session.run(f"print({text})").stdout == f"{text}\n"
    except SandboxUnavailable:
        return False


def test_a_snippets_own_crash_is_not_the_servers_fault(session: SandboxSession) -> None:
    with pytest.raises(WorkerLost, match="died") as lost:
        session.unrestricted("import os\nos._exit(3)")
    assert not lost.value.server_fault
    answer = session.solution_from("missing")
    assert answer == (None, answer[1]) and not answer.server_fault
