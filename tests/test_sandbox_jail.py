"""Assume escaped: plain Python in a fully hardened worker, against the process layer alone (issue #13).

Every snippet here runs through the test-only ``unrestricted`` hook, as if the language policy and
the facades had both fallen. The outside audit found that such code could change the metadata of
root-owned host files (Landlock has no right for it), stat any host path, enumerate host PIDs,
watch host folders with inotify, outlive a SIGKILLed server, and leave hundreds of threads behind.
Each test below is one of those findings, checked from the test process (the host side) where it
can be. They need root (to create root-owned files and the jail) and bubblewrap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from escape_attacks import survivors_of_a_killed_owner
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.server.sandbox.host import jail
from mechsandbox.server.sandbox.host import pool as pool_module
from mechsandbox.server.sandbox.host.pool import SandboxUnavailable

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the jail is checked as root (CI runs as root)"),
    pytest.mark.skipif(
        shutil.which("bwrap") is None,
        reason="bubblewrap is not installed (apt-get install bubblewrap; .ci/run and ./dev.sh test install it as root)",
    ),
]



@pytest.fixture(scope="module")
def payload() -> ModelPayload:
    return ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxSettings(pool_size=1, wall_seconds=10.0, test_unrestricted=True)) as p:
        yield p


@pytest.fixture
def session(pool, payload):
    s = pool.open_session(payload)
    yield s
    s.close()


def run(session, code: str):
    reply = session.unrestricted(textwrap.dedent(code))
    assert reply["error"] is None, reply["error"]
    return reply["result"]


def test_every_layer_is_active(pool) -> None:
    layers = pool.status()["layers"]
    assert all(state == "active" for state in layers.values()), layers
    assert set(layers) >= {"namespaces", "pids", "uid", "landlock", "seccomp", "rlimits"}


def _host_file(folder: Path) -> Path:
    path = folder / "root-owned"
    path.write_text("host")
    os.chmod(path, 0o600)
    os.utime(path, (1_000_000, 1_000_000))
    return path


METADATA_ATTACKS = """
import os
import shutil
out = {}
for name, call in [
    ("chmod", lambda p: os.chmod(p, 0o4777)),
    ("chown", lambda p: os.chown(p, 12345, 12345)),
    ("utime", lambda p: os.utime(p, (0, 0))),
    ("setxattr", lambda p: os.setxattr(p, "user.escaped", b"1")),
    ("stat", lambda p: os.stat(p)),
]:
    try:
        call(PATH)
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.strerror
result = out
"""


@pytest.mark.parametrize("where", ["tmp", "runtime"])
def test_no_metadata_change_of_a_host_file(session, tmp_path, where: str) -> None:
    folder = (
        tmp_path if where == "tmp" else Path(__import__("tempfile").mkdtemp(prefix=".jail-canary-", dir=sys.prefix))
    )  # "runtime": a folder the jail does show (read-only): the interpreter's prefix (the checkout itself is not there)
    try:
        path = _host_file(folder)
        before = os.stat(path)
        result = run(session, METADATA_ATTACKS.replace("PATH", repr(str(path))))
        after = os.stat(path)
        assert all(v != "done" for k, v in result.items() if k != "stat" or where == "tmp"), result
        assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, 0, 0)
        assert (after.st_mtime, after.st_atime) == (before.st_mtime, before.st_atime)
        assert os.listxattr(path) == []
    finally:
        if where == "runtime":
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()


def test_no_stat_of_host_paths_and_no_host_pids(session, tmp_path) -> None:
    canary = _host_file(tmp_path)
    server = os.getpid()
    result = run(
        session,
        f"""
        import os
        seen = {{}}
        for p in [{str(canary)!r}, {str(tmp_path)!r}, "/etc/passwd", "/home", "/sys/fs/cgroup", "/proc/{server}"]:
            try:
                os.stat(p)
                seen[p] = True
            except OSError:
                seen[p] = False
        pids = [n for n in range(1, 70000) if os.path.exists(f"/proc/{{n}}")]
        result = {{"seen": seen, "pids": pids}}
        """,
    )
    assert not any(result["seen"].values()), result["seen"]
    assert server not in result["pids"] and len(result["pids"]) <= 16, result["pids"]  # the jail's own


LIBC_CALLS = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def attempt(name, call):
    try:
        value = call()
        out[name] = "done" if value is None or (isinstance(value, int) and value >= 0) else "refused"
    except OSError:
        out[name] = "refused"
attempt("inotify_init1", lambda: libc.inotify_init1(0))
attempt("inotify_init", lambda: libc.inotify_init())
attempt("fanotify_init", lambda: libc.fanotify_init(0, 0))
attempt("socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()] and None)
attempt("fork", lambda: os.fork() and None)
attempt("exec", lambda: os.execv("/usr/bin/true", ["true"]))
attempt("posix_spawn", lambda: os.posix_spawn("/usr/bin/true", ["true"], {}) and None)
attempt("sysinfo", lambda: libc.sysinfo(ctypes.create_string_buffer(256)))
attempt("clear-pdeathsig", lambda: libc.prctl(1, 0, 0, 0, 0))
attempt("set-dumpable", lambda: libc.prctl(4, 1, 0, 0, 0))
result = out
"""


def test_no_inotify_socket_fork_exec_sysinfo_or_prctl(session) -> None:
    result = run(session, LIBC_CALLS)
    assert result and all(v == "refused" for v in result.values()), result


THREADS = """
import os, threading
stop = threading.Event()
started = 0
try:
    for _ in range(300):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
result = {"started": started, "tasks": os.stat("/proc/self/task").st_nlink - 2}
"""


def test_threads_are_capped_and_do_not_outlive_the_step(pool, session) -> None:
    before = run(
        session, "import os, threading\nresult = [os.stat('/proc/self/task').st_nlink - 2, threading.active_count()]"
    )
    old = session.pid
    result = run(session, THREADS)
    assert result["tasks"] <= pool.settings.max_pids and result["started"] < 300, result
    after = run(
        session, "import os, threading\nresult = [os.stat('/proc/self/task').st_nlink - 2, threading.active_count()]"
    )
    assert session.pid != old and after[0] <= before[0] and after[1] <= 2, (before, after)
    deadline = time.time() + 2
    while os.path.exists(f"/proc/{old}") and time.time() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{old}")


def test_a_joined_thread_does_not_cost_the_namespace(session) -> None:
    old = session.pid
    run(session, "import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()")
    run(session, "result = 1")
    assert session.pid == old


def test_pool_addresses_workers_by_kernel_host_pids(pool, session) -> None:
    pid = session.pid
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    ns_pids = [int(p) for p in status["NSpid"].split()]
    # a host pid, the worker's pid in the jail (the zygote's namespace), and 1 in a PID namespace of its own
    assert ns_pids[0] == pid and len(ns_pids) == 3 and ns_pids[2] == 1, ns_pids
    assert run(session, "import os\nresult = os.getpid()") == ns_pids[2] != pid
    assert int(status["PPid"]) == pool.zygote.pid


def test_a_fake_worker_pid_never_gets_a_host_process_signalled(pool, monkeypatch) -> None:
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group leader, as a worker would be
    real_recv_fds = pool_module.socket.recv_fds

    def lying_zygote(sock, bufsize, maxfds, flags=0):
        data, fds, msg_flags, address = real_recv_fds(sock, bufsize, maxfds, flags)
        info = json.loads(data)
        return json.dumps({**info, "pid": victim.pid}).encode(), fds, msg_flags, address

    monkeypatch.setattr(pool_module.socket, "recv_fds", lying_zygote)
    try:
        try:
            worker = pool._spawn()
        except SandboxUnavailable:
            worker = None
        if worker is not None:
            pool.release(worker)
        time.sleep(0.1)
        assert victim.poll() is None, "the pool signalled a host process that is not its worker"
    finally:
        victim.kill()
        victim.wait()


def test_workers_die_within_2s_of_a_sigkilled_pool_owner() -> None:
    info, survivors = survivors_of_a_killed_owner(grace=2.0)
    assert info["reply"]["result"] == "stuck", info
    assert not survivors, survivors


def test_require_namespaces_refuses_to_start_without_them() -> None:
    settings = SandboxSettings(pool_size=0, namespaces=False, require=("namespaces",))
    with pytest.raises(SandboxUnavailable, match="namespaces: skipped: disabled by configuration"):
        SandboxPool(settings).start()


def test_without_a_pids_controller_the_pool_says_so(monkeypatch) -> None:
    monkeypatch.setattr(jail.PidsCgroup, "_candidates", staticmethod(lambda: []))
    with SandboxPool(SandboxSettings(pool_size=0)) as p:
        status = p.status()
    assert status["layers"]["pids"].startswith("skipped: no pids cgroup controller; RLIMIT_NPROC 64 instead")
    assert status["pids_cgroup"] == "no pids cgroup controller is mounted"
    assert status["layers"]["namespaces"] == "active"
