"""Process layer behaviour: how the zygote and workers are started, limited, killed and replaced."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import cached_instance, wait_until
from mechsandbox.evaluation.procfs import cmdline, is_gone
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings, SandboxUnavailable
from mechsandbox.server.sandbox.host.pool import WorkerLost
from mechsandbox.server.sandbox.sealed import SEALS

SECRET_ENV = "MECHSANDBOX_TEST_SALT"
SWALLOW = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.fixture(scope="module")
def payload() -> ModelPayload:
    return ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))


@pytest.fixture(scope="module")
def pool():
    os.environ[SECRET_ENV] = "do-not-leak-" + "x" * 8
    os.environ["HF_TOKEN"] = "hf_should_not_reach_the_zygote"
    try:
        settings = SandboxSettings(pool_size=2, wall_seconds=5.0, memory_budget_mb=1500, test_unrestricted=True)
        with SandboxPool(settings) as p:
            yield p
    finally:
        os.environ.pop(SECRET_ENV, None)
        os.environ.pop("HF_TOKEN", None)


def test_zygote_is_a_fresh_interpreter_with_a_scrubbed_environment(pool) -> None:
    zygote = pool.zygote
    with open(f"/proc/{zygote.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert b"mechsandbox.server.sandbox.guest.zygote" in argv and b"-I" in argv
    parent = int(_status(zygote.pid)["PPid"])  # the server, or the bubblewrap that the server started
    if parent != os.getpid():
        assert cmdline(parent).split(b"\0", 1)[0].endswith(b"bwrap") and int(_status(parent)["PPid"]) == os.getpid()
    with open(f"/proc/{zygote.pid}/environ", "rb") as f:
        keys = {item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item}
    assert SECRET_ENV not in keys and "HF_TOKEN" not in keys
    allowed = {"PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED"}
    allowed.add("PWD")  # bubblewrap sets it to the (empty) working directory
    assert all(k in allowed or k.startswith("OPENBLAS_") for k in keys), keys
    if "OPENBLAS_CORETYPE" in os.environ:
        assert "OPENBLAS_CORETYPE" in keys


def test_worker_is_hardened(pool, payload) -> None:
    session = pool.open_session(payload)
    try:
        pid = session.pid
        status = _status(pid)
        assert int(status["PPid"]) == pool.zygote.pid
        assert os.getpgid(pid) == pid  # its own process group, killed as a whole
        assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
        links = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
        model = [fd for fd, link in links.items() if link.startswith("/memfd:mechsandbox-model")]
        sock = [fd for fd, link in links.items() if link.startswith("socket:")]
        assert fds[:3] == [0, 1, 2] and len(model) == 1 and len(sock) == 1 and len(fds) == 5, links
        held = os.open(f"/proc/{pid}/fd/{model[0]}", os.O_RDONLY)  # the very file the worker holds: sealed
        try:
            assert fcntl.fcntl(held, fcntl.F_GET_SEALS) == SEALS
        finally:
            os.close(held)
        for fd in (1, 2):
            assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/cwd") == pool.workdir and os.listdir(pool.workdir) == []
        with open(f"/proc/{pid}/oom_score_adj") as f:
            assert f.read().strip() == "1000"
        with open(f"/proc/{pid}/limits") as f:
            limits = f.read()
        assert "Max file size             0" in limits and "Max core file size        0" in limits
        assert f"Max address space         {pool.zygote.address_space}" in limits
        assert int(status["CapEff"], 16) == 0
    finally:
        session.close()


@pytest.mark.parametrize(
    "crash",
    ["import ctypes\nctypes.string_at(0)", "import os\nos._exit(3)", "import os\nos.abort()"],
)
def test_crashed_worker_is_replaced_and_says_so(pool, payload, crash: str) -> None:
    session = pool.open_session(payload)
    try:
        session.run("kept = 1")
        old = session.pid
        with pytest.raises(Exception, match="died"):
            session.unrestricted(crash)
        result = session.run("print(kept)")
        assert result.namespace_reset and "NameError" in result.error and "died" in result.notice
        assert session.pid != old
        deadline = time.time() + 5  # the socket closes before the kernel has finished tearing the process down
        while not is_gone(old) and time.time() < deadline:
            time.sleep(0.02)
        assert is_gone(old)
        assert session.run("print(model(X).shape[0] > 0)").stdout == "True\n"
    finally:
        session.close()


def test_timeout_kills_the_whole_process_group(pool, payload) -> None:
    session = pool.open_session(payload)
    try:
        old = session.pid
        swallow = (
            "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
        )
        result = session.run(swallow)
        assert result.namespace_reset and "wall-clock" in result.error
        deadline = time.time() + 5
        while not is_gone(old) and time.time() < deadline:
            time.sleep(0.05)
        assert is_gone(old)
        assert session.run("print(1)").stdout == "1\n"
    finally:
        session.close()


def test_memory_watchdog_kills_the_largest_worker(pool, payload) -> None:
    hog, bystander = pool.open_session(payload), pool.open_session(payload)
    try:
        bystander.run("kept = 7")
        kills = pool.memory_kills
        # 1.6 GB held for as long as the snippet runs (torch.ones touches every page): the pool is then over
        # its 1500 MiB budget for good, not only during a transient peak the watchdog may not sample
        result = hog.run("x = torch.ones(1_600_000_000, dtype=torch.uint8)\nwhile True:\n    pass")
        assert result.namespace_reset and "memory budget exceeded" in result.error
        assert pool.memory_kills > kills
        assert bystander.run("print(kept)").stdout == "7\n"
        assert hog.run("print(2)").stdout == "2\n"
    finally:
        hog.close()
        bystander.close()


def test_a_killed_zygote_is_restarted_and_sessions_recover(payload) -> None:
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        session = pool.open_session(payload)
        old_zygote, old_worker = pool.zygote.pid, session.pid
        os.kill(old_zygote, signal.SIGKILL)
        deadline = time.time() + 60
        while (pool.zygote.pid == old_zygote or not pool.healthy()) and time.time() < deadline:
            time.sleep(0.1)
        assert pool.healthy() and pool.status()["zygote_restarts"] == 1
        result = session.run("print(5)")
        assert is_gone(old_worker) and result.namespace_reset and result.stdout == "5\n"


def test_parallel_refill_fills_the_pool_and_never_overshoots() -> None:
    """Four refill threads for a pool of three: taken workers are replaced, and the warm workers plus the spawns
    under way never exceed the pool size (sampled throughout), so the slots in use stay at taken + pool size."""
    with SandboxPool(SandboxSettings(pool_size=3, spawn_parallel=4)) as pool:
        seen: list[int] = []

        def settle(want_workers: int) -> None:
            deadline = time.time() + 60
            while time.time() < deadline:
                with pool.lock:
                    seen.append(len(pool.warm) + pool.starting)
                    done = len(pool.warm) == 3 and pool.starting == 0 and len(pool.workers) == want_workers
                if done:
                    return
                time.sleep(0.005)
            pytest.fail(f"the pool did not settle: {pool.status()}")

        settle(3)
        taken = [pool.take_worker() for _ in range(3)]
        settle(6)
        assert max(seen) <= 3 and len(pool.threads) == 5  # four refill threads and the watchdog
        assert len(pool.workers) - len(pool.warm) == 3 and len({w.slot for w in pool.workers.values()}) == 6
        for worker in taken:
            pool.release(worker)
        assert len(pool.workers) == 3 and len(pool.warm) == 3
        pool.release(taken[0])  # twice: nothing more is freed
        assert len(pool.workers) == 3 and sorted(pool.free_slots) == sorted(set(pool.free_slots))


def test_closed_sessions_leave_no_worker(pool, payload) -> None:
    sessions = [pool.open_session(payload) for _ in range(3)]
    pids = [s.pid for s in sessions]
    for s in sessions:
        s.close()
    time.sleep(0.2)
    assert all(is_gone(pid) for pid in pids)


def test_required_layer_that_is_not_active_refuses_to_start() -> None:
    with pytest.raises(SandboxUnavailable, match="required isolation layers are not active"):
        SandboxPool(SandboxSettings(pool_size=1, seccomp=False, require=("seccomp",))).start()


def test_settings_from_environment() -> None:
    env = {"MECHSANDBOX_POOL_SIZE": "7", "MECHSANDBOX_REQUIRE": "landlock,seccomp", "MECHSANDBOX_LANDLOCK": "false"}
    settings = SandboxSettings.from_env(env)
    assert settings.pool_size == 7 and settings.require == ("landlock", "seccomp") and settings.landlock is False
    with pytest.raises(ValueError, match="unknown layers"):
        SandboxSettings.from_env({"MECHSANDBOX_REQUIRE": "landlock,magic"})
    with pytest.raises(ValueError, match="MECHSANDBOX_POOL_SIZE"):
        SandboxSettings.from_env({"MECHSANDBOX_POOL_SIZE": "many"})
    with pytest.raises(ValueError, match="UID_DROP"):
        SandboxSettings.from_env({"MECHSANDBOX_UID_DROP": "sometimes"})


SERVER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
    from mechsandbox.tasks import get_family
    pool = SandboxPool(SandboxSettings(pool_size=2)).start()
    session = pool.open_session(ModelPayload.from_instance(get_family("dead-neurons").generate(0, "easy")))
    session.run("print(1)")
    time.sleep(0.5)
    print(pool.zygote.pid, *pool.workers, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_server_leaves_no_zygote_or_worker() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 3, line  # zygote, the session's worker, at least one warm worker
        assert not any(is_gone(pid) for pid in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and not all(is_gone(pid) for pid in pids):
        time.sleep(0.1)
    assert all(is_gone(pid) for pid in pids)


# An escaped worker's own reply frame: what it sends when layers 1-2 have fallen and it speaks on the socket itself.
FORGED_REPLY = textwrap.dedent(
    """
    import json, os, socket, stat, time
    from mechsandbox.server.sandbox import frames
    fd = next(f for f in range(3, 64) if os.path.exists(f"/proc/self/fd/{f}") and stat.S_ISSOCK(os.fstat(f).st_mode))
    body = json.dumps({"error": None, "result": "forged"}).encode()
    frame = frames.HEADER.pack(len(body), 0, frames._last_received[fd]) + body
    sock = socket.socket(fileno=os.dup(fd))
    """
)


def test_a_reply_dribbled_inside_every_timeout_still_meets_the_wall_clock_deadline(pool, payload) -> None:
    """A socket's timeout counts per read, so a worker that sends its reply one byte at a time, each inside the
    limit, held a server thread for as long as it liked (a red team, 2026-12-05). The reply has a deadline."""
    dribble = FORGED_REPLY + "for i in range(len(frame)):\n    sock.send(frame[i:i + 1])\n    time.sleep(2.0)\n"
    session = pool.open_session(payload)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerLost, match="wall-clock limit"):
            session.unrestricted(dribble)  # each byte within the 5 s limit; the frame takes a minute
        assert time.monotonic() - started < pool.settings.wall_seconds + 3
        assert session.run("print(7)").stdout == "7\n"  # a fresh worker
    finally:
        session.close()


def test_a_worker_that_runs_between_requests_is_killed(pool, payload) -> None:
    """An escaped worker can answer its request with a forged reply and go on computing: no request is in flight,
    so no wall-clock limit applies. The watchdog kills a worker that uses CPU between requests."""
    kills = pool.idle_cpu_kills
    session = pool.open_session(payload)
    try:
        reply = session.unrestricted(FORGED_REPLY + "sock.sendall(frame)\nwhile True:\n    pass\n")
        assert reply["result"] == "forged"  # the server took it as the answer
        worker = session.worker
        assert worker is not None
        deadline = time.monotonic() + 20
        while worker.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not worker.alive and "between requests" in (worker.dead_reason or "")
        assert pool.idle_cpu_kills == kills + 1
        result = session.run("print(8)")
        assert result.namespace_reset and result.stdout == "8\n"
    finally:
        session.close()


def test_an_honest_worker_that_computed_and_went_idle_is_not_killed(pool, payload) -> None:
    """The check counts CPU from the end of the last reply: a snippet's own CPU time, however long, never counts."""
    kills = pool.idle_cpu_kills
    session = pool.open_session(payload)
    try:
        burn = "import time\nend = time.process_time() + 2.0\nwhile time.process_time() < end:\n    pass\nresult = 1\n"
        assert session.unrestricted(burn)["result"] == 1
        time.sleep(1.5)  # three watchdog polls
        assert session.worker is not None and session.worker.alive and pool.idle_cpu_kills == kills
    finally:
        session.close()


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat: the main thread's niceness


@pytest.fixture(scope="module")
def nice_pool():
    with SandboxPool(SandboxSettings(pool_size=1, snippet_nice=5, test_unrestricted=True)) as p:
        yield p


def test_a_worker_runs_snippets_at_the_snippet_niceness_and_cannot_undo_it(nice_pool, payload) -> None:
    """Warm workers and the load run at the server's priority (a reset waits for them); from the load on, the worker
    runs at ``snippet_nice`` and an escaped snippet cannot raise its priority back."""
    pool = nice_pool
    assert SandboxSettings().snippet_nice == 0  # off unless the operator sets it
    with pool.lock:
        warm = [w.pid for w in pool.warm]
    assert warm and all(_nice(pid) == 0 for pid in warm)
    session = pool.open_session(payload)
    try:
        assert session.pid is not None and _nice(session.pid) == 5
        code = "import os\ntry:\n    os.setpriority(os.PRIO_PROCESS, 0, 0)\n    result = 'raised'\n"
        reply = session.unrestricted(code + "except OSError as exc:\n    result = exc.errno\n")
        assert reply["result"] == errno.EACCES and _nice(session.pid) == 5
    finally:
        session.close()


def _opened_behind(pool, payload):
    """A session opened ``behind`` while the caller holds the pool's lock, so its loading thread waits to take a
    worker; opened on another thread, so that an open that waited for its worker fails here instead of hanging."""
    opened: list = []
    opener = threading.Thread(target=lambda: opened.append(pool.open_session(payload, behind=True)), daemon=True)
    opener.start()
    opener.join(10)
    assert opened, "open_session waited for a worker"
    session = opened[0]
    assert session.worker is None and session.lock.locked() and session.loading
    return session


def _busy_workers(pool) -> int:
    with pool.lock:
        return len(pool.workers) - len(pool.warm) - pool.starting


def test_a_session_loaded_behind_returns_before_its_worker_and_its_first_snippet_waits_for_it(pool, payload) -> None:
    """The server's resets open sessions ``behind``: the call returns while the loading thread has not even taken a
    worker (the pool's lock, held here, keeps it waiting), and the first snippet then waits and runs on the model."""
    ran: list = []
    with pool.lock:
        session = _opened_behind(pool, payload)
        code = "print(sum(p.numel() for p in model.parameters()))"
        runner = threading.Thread(target=lambda: ran.append(session.run(code)), daemon=True)
        runner.start()
        runner.join(0.5)
        assert not ran  # the snippet waits for the load
    try:
        runner.join(60)
        result = ran[0]
        assert result.error is None and not result.namespace_reset and int(result.stdout) > 0
        assert session.pid in pool.workers
    finally:
        session.close()
    assert session.worker is None
    wait_until(lambda: _busy_workers(pool) == 0, 15)  # one worker was taken, and it is back: no second load raced it


def test_a_load_that_fails_behind_is_tried_again_by_the_first_use(payload, caplog) -> None:
    """With every worker slot taken the load behind fails (one log line); the first snippet tries again and reports
    why it cannot run; once a slot is free the next one runs."""
    with SandboxPool(SandboxSettings(pool_size=0, max_workers=1)) as pool:
        holder = pool.open_session(payload)
        late = pool.open_session(payload, behind=True)
        try:
            wait_until(lambda: not late.lock.locked(), 30)  # the load behind ended (a bound, not a hang, if it did not)
            with pytest.raises(SandboxUnavailable, match="all 1 sandbox workers are in use"):
                late.run("print(1)")
            assert "could not be loaded ahead of its first use" in caplog.text
            holder.close()
            result = late.run("print(2)")
            assert result.stdout == "2\n" and not result.namespace_reset
        finally:
            holder.close()
            late.close()


def test_closing_a_session_whose_load_is_behind_does_not_wait_and_frees_its_worker(pool, payload) -> None:
    """An episode that ends or is replaced before its first step closes its session while the load may still be under
    way: the close returns at once (a reset that replaces an episode would otherwise wait for its load) and the
    loading thread frees the worker when the load ends."""
    wait_until(lambda: _busy_workers(pool) == 0, 30)
    closed = threading.Event()
    with pool.lock:
        session = _opened_behind(pool, payload)
        threading.Thread(target=lambda: (session.close(), closed.set()), daemon=True).start()
        assert closed.wait(10), "close waited for the load"
    wait_until(lambda: not session.loading and not session.lock.locked(), 30)
    assert session.worker is None and session.closed
    wait_until(lambda: _busy_workers(pool) == 0, 30)
    with pytest.raises(SandboxUnavailable, match="closed"):
        session.run("print(1)")


def test_past_the_bound_on_loads_behind_a_session_loads_before_it_returns(pool, payload) -> None:
    """A client that resets in a loop must not pile up loads (and the spawns they need) without limit: past
    ``max_loads_behind`` loads under way, opening a session behind waits for its own load, as before."""
    saved = pool.max_loads_behind
    pool.max_loads_behind = 1
    opened: list = []
    try:
        with pool.lock:
            opened.append(_opened_behind(pool, payload))  # takes the one place; its load waits for the pool's lock
            assert pool.status()["loads_behind"] == 1
            second = threading.Thread(target=lambda: opened.append(pool.open_session(payload, behind=True)))
            second.daemon = True
            second.start()
            second.join(0.5)
            assert len(opened) == 1  # loading before it returns, so it waits for the pool's lock too
        second.join(60)
        first, late = opened
        assert not late.loading and late.worker is not None
        wait_until(lambda: pool.status()["loads_behind"] == 0 and not first.lock.locked(), 30)
        assert first.run("print(4)").stdout == "4\n" and late.run("print(5)").stdout == "5\n"
    finally:
        pool.max_loads_behind = saved
        for session in opened:
            session.close()
