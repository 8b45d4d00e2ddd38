"""The jail as the boundary (issue 53): an escaped worker reaches nothing that is not its own.

Every snippet here runs through the test-only ``unrestricted`` hook, as if the language policy and the facades had
both fallen. Most checks run three times: with every layer on; with the jail alone ("jail-only": bubblewrap's and the
worker's own namespaces, no Landlock, seccomp, rlimits or uid drop), so that what the namespaces promise is tested
without the older layers hiding it; and without the jail, as on a host that cannot make namespaces. They need root
and bubblewrap, like tests/test_sandbox_jail.py.
"""

from __future__ import annotations

import os
import secrets
import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import cached_instance
from mechsandbox.results.store import default_data_dir
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.server.sandbox.host import jail, memory
from mechsandbox.server.sandbox.host import pool as pool_module
from mechsandbox.server.sandbox.host.pool import WorkerLost
from mechsandbox.settings import ServerSettings

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the jail is checked as root (CI runs as root)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

PACKAGE = Path(pool_module.__file__).resolve().parents[3]  # the repository root, which is the package
CONFIGS = {
    "all": {},
    "jail-only": {"landlock": False, "seccomp": False, "rlimits": False, "uid_drop": "off"},
    "no-jail": {"namespaces": False},  # a host without namespaces: seccomp and Landlock must hold on their own
}


@pytest.fixture(scope="module")
def payload() -> ModelPayload:
    return ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pool(request):
    settings = SandboxSettings(pool_size=1, wall_seconds=10.0, test_unrestricted=True, **CONFIGS[request.param])
    with SandboxPool(settings) as p:
        yield p


def run(session, code: str):
    reply = session.unrestricted(textwrap.dedent(code))
    assert reply["error"] is None, reply["error"]
    return reply["result"]


SYSV_MAKE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(KEY, 4096, 0o1000 | 0o666)  # IPC_CREAT
if shmid < 0:
    result = {"made": False, "errno": ctypes.get_errno()}
else:
    address = libc.shmat(shmid, None, 0)
    ctypes.memmove(address, b"secret", 6)
    result = {"made": True, "shmid": shmid}
"""

SYSV_FIND = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
found = {"by-key": libc.shmget(KEY, 0, 0) >= 0}
address = libc.shmat(SHMID, None, 0o10000) if SHMID >= 0 else None  # SHM_RDONLY
found["by-id"] = address not in (None, ctypes.c_void_p(-1).value)
if found["by-id"]:
    found["read"] = ctypes.string_at(address, 6).decode(errors="replace")
try:
    found["listed"] = [line.split()[:2] for line in open("/proc/sysvipc/shm").read().splitlines()[1:]]
except OSError:
    found["listed"] = []
result = found
"""

FILES_MAKE = """
import os
made = {}
for path in PATHS:
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
        os.write(fd, b"secret")
        os.close(fd)
        made[path] = True
    except OSError:
        made[path] = False
result = made
"""

FILES_FIND = """
import os
result = {path: os.path.exists(path) for path in PATHS}
"""


def test_sysv_shared_memory_is_neither_shared_nor_left_behind(pool, payload) -> None:
    key = secrets.randbelow(2**30) + 1
    maker, other = pool.open_session(payload), pool.open_session(payload)
    try:
        made = run(maker, SYSV_MAKE.replace("KEY", str(key)))
        shmid = made.get("shmid", -1)
        find = SYSV_FIND.replace("KEY", str(key)).replace("SHMID", str(shmid))
        seen = run(other, find)  # a live session beside the maker
        assert not seen["by-key"] and not seen["by-id"] and not seen["listed"], (made, seen)
    finally:
        maker.close()
    later = pool.open_session(payload)
    try:
        seen = run(later, find)
        assert not seen["by-key"] and not seen["by-id"] and not seen["listed"], (made, seen)
    finally:
        later.close()
        other.close()


def test_posix_shared_memory_and_tmp_files_are_neither_shared_nor_left_behind(pool, payload) -> None:
    tag = secrets.token_hex(4)
    paths = [f"/dev/shm/ms-{tag}", f"/tmp/ms-{tag}"]
    maker, other = pool.open_session(payload), pool.open_session(payload)
    try:
        made = run(maker, FILES_MAKE.replace("PATHS", repr(paths)))
        seen = run(other, FILES_FIND.replace("PATHS", repr(paths)))
        assert not any(seen.values()), (made, seen)
    finally:
        maker.close()
    later = pool.open_session(payload)
    try:
        seen = run(later, FILES_FIND.replace("PATHS", repr(paths)))
        assert not any(seen.values()), (made, seen)
    finally:
        later.close()
        other.close()


SHARED_ANONYMOUS = """
import ctypes, mmap, time
block = mmap.mmap(-1, SIZE, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(block)), 1, SIZE)
time.sleep(8)
result = "kept"
"""

SYSV_DETACHED = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, SIZE, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
address = libc.shmat(shmid, None, 0)
ctypes.memset(address, 1, SIZE)
libc.shmdt(ctypes.c_void_p(address))  # in no process's maps now, still held by the IPC namespace
time.sleep(8)
result = "kept"
"""


@pytest.mark.parametrize(
    ("config", "code", "cgroup"),
    [
        ("all", SHARED_ANONYMOUS, True),
        ("all", SHARED_ANONYMOUS, False),  # no memory cgroup: the watchdog's fallback reads smaps_rollup
        ("jail-only", SHARED_ANONYMOUS, True),
        ("jail-only", SYSV_DETACHED, True),
    ],
)
def test_shared_memory_past_the_budget_is_killed(payload, monkeypatch, config: str, code: str, cgroup: bool) -> None:
    """500 MiB held as shared memory, on a 300 MiB budget: the watchdog must count it and kill the worker."""
    if not cgroup:
        monkeypatch.setattr(memory.MemoryCgroup, "_candidates", staticmethod(lambda: []))
    settings = SandboxSettings(
        pool_size=0, wall_seconds=20.0, memory_budget_mb=300, test_unrestricted=True, **CONFIGS[config]
    )
    with SandboxPool(settings) as pool:
        assert (pool.isolation["memory_cgroup"] == "active") == cgroup, pool.isolation
        session = pool.open_session(payload)
        try:
            with pytest.raises(WorkerLost, match="memory budget exceeded"):
                session.unrestricted(textwrap.dedent(code.replace("SIZE", str(500 << 20))))
            assert pool.memory_kills >= 1
        finally:
            session.close()


# What of the checkout a worker may see: the code it imports (sources and bytecode), nothing else.
GUEST_CODE = ("__init__.py", "settings.py", "jsonvalue.py", "arch/", "server/__init__.py", "server/sandbox/")

WALK = """
import os
PACKAGE, RUNTIME, CODE, SECRETS = ARGS
MOUNT_POINTS = ("/run", "/run/mechsandbox-pids", "/run/mechsandbox-memory")  # left empty: a worker unmounts them
outside, package = [], []

def code(rel):
    head, _, name = rel.rpartition("/")
    if name == "__pycache__":
        return head == "" or code(head)
    if head.endswith("__pycache__"):  # bytecode of a guest source only
        source = head[: -len("__pycache__")] + name.split(".")[0] + ".py"
        return name.endswith(".pyc") and code(source)
    if rel == "server" or any(c.startswith(rel + "/") for c in CODE if c.endswith("/")):
        return True  # a folder on the way to the code
    inside = any(rel == c or (c.endswith("/") and rel.startswith(c)) for c in CODE)
    return inside and (os.path.isdir(os.path.join(PACKAGE, rel)) or rel.endswith(".py"))

def ancestor(path):
    return any(root.startswith(path.rstrip("/") + "/") for root in RUNTIME + [PACKAGE])

for folder, dirs, files in os.walk("/"):
    if folder in ("/proc", "/dev"):
        dirs[:] = []
        continue
    dirs[:] = [d for d in dirs if os.path.join(folder, d) not in RUNTIME]
    for name in dirs + files:
        path = os.path.join(folder, name)
        if path == PACKAGE or path.startswith(PACKAGE + "/"):
            if path != PACKAGE and not code(os.path.relpath(path, PACKAGE)):
                package.append(path)
        elif path not in RUNTIME and not ancestor(path) and path not in ("/proc", "/dev", "/tmp", *MOUNT_POINTS):
            outside.append(path)
result = {"outside": outside[:40], "package": package[:40], "secrets": [p for p in SECRETS if os.path.lexists(p)]}
"""


def test_the_jail_shows_only_the_runtime_and_the_guest_code(pool, payload, tmp_path) -> None:
    """Walk the jail's root from an escaped worker: every path is the interpreter, its libraries or the code workers
    import; no other file of the checkout (.git, tests, docs, bench, artifacts), no data folder, no results database."""
    if pool.isolation["namespaces"] != "active":
        pytest.skip("without the jail Landlock decides what can be read (tests/test_sandbox_isolation.py)")
    package = str(PACKAGE)
    runtime = [p for p in jail.interpreter_binds() if p != package]  # the virtualenv too, wherever it is
    runtime.append(pool.workdir)  # the worker's working folder: empty and read-only in its own /tmp
    data = ServerSettings().data_dir
    secrets_ = [str(PACKAGE / name) for name in (".git", "tests", "docs", "bench", "artifacts", "mechsandbox-data")]
    secrets_ += [os.path.abspath(os.path.expanduser(data)) if data else str(default_data_dir()), str(tmp_path)]
    session = pool.open_session(payload)
    try:
        found = run(session, WALK.replace("ARGS", repr((package, runtime, list(GUEST_CODE), secrets_))))
    finally:
        session.close()
    assert found == {"outside": [], "package": [], "secrets": []}, found


PROCESSES = """
import os
seen = [n for n in range(1, 70000) if os.path.exists(f"/proc/{n}")]  # stat: Landlock refuses listing /proc
status = {}
for pid in seen:
    try:
        status[pid] = open(f"/proc/{pid}/status").read().split("\\n")[0]
    except OSError:
        pass
result = {"self": os.getpid(), "seen": seen, "status": status}
"""


def test_another_sessions_worker_is_not_visible_through_proc(pool, payload) -> None:
    """Two live sessions: neither worker sees the other (nor the zygote) in /proc; each sees only itself."""
    if pool.isolation["namespaces"] != "active":
        pytest.skip("without the jail Landlock refuses /proc listings (tests/test_sandbox_isolation.py)")
    first, second = pool.open_session(payload), pool.open_session(payload)
    try:
        run(second, "result = 1")  # loaded and alive
        found = run(first, PROCESSES)
    finally:
        first.close()
        second.close()
    assert found["seen"] == [found["self"]], found  # in the jail's PID namespace: the zygote and every worker


def test_no_file_of_the_checkout_but_the_guest_code_can_be_read(pool, payload) -> None:
    """With or without the jail (where there is none, Landlock's read rules must do it): the checkout's other files
    cannot be opened by an escaped worker, while the code it runs can."""
    session = pool.open_session(payload)
    paths = [str(PACKAGE / name) for name in (".git/HEAD", "README.md", "tests/test_sandbox_boundary.py")]
    try:
        found = run(
            session,
            f"""
            def readable(path):
                try:
                    open(path, "rb").close()
                    return True
                except OSError:
                    return False
            result = {{p: readable(p) for p in {paths!r}}}
            result["code"] = readable({str(PACKAGE / "server" / "sandbox" / "guest" / "worker.py")!r})
            """,
        )
    finally:
        session.close()
    assert found.pop("code") and not any(found.values()), found
