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

import pytest
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings, memory
from mechsandbox.server.sandbox.pool import WorkerLost

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the jail is checked as root (CI runs as root)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

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
