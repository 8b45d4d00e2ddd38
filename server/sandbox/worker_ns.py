"""Namespaces of a worker's own, inside the jail: nothing one session makes is seen by, or left to, another.

Why: bubblewrap gives the zygote one set of namespaces, which every worker then shared. A red team with unrestricted
code in a worker (issue 53) made 1 GiB of SysV shared memory that stayed after its session until the server stopped,
and a second session attached to it and read the first one's message; files in the shared ``/tmp`` and ``/dev/shm``
could do the same wherever Landlock and the uid drop were gone. So right after the fork, still as the zygote's
trusted code and before it hardens itself, a worker enters

* a **new IPC namespace**: SysV shared memory, semaphores, message queues and POSIX message queues it makes are
  invisible to every other worker and are destroyed by the kernel when the worker dies (the namespace dies with its
  last process), so nothing outlives the session;
* a **new mount namespace** (every mount private) in which ``/tmp`` and ``/dev/shm`` are fresh, empty, read-only
  tmpfs mounts and ``/`` and ``/dev`` are read-only: there is nowhere to leave a file for the next session.

This needs CAP_SYS_ADMIN in the jail (the zygote keeps it for this, and every worker drops it with the rest of its
capabilities before it runs anything of a session). seccomp refuses SysV IPC calls too, so a host without namespaces
(where this module is not used) still has no shared segment between sessions.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
EMPTY_MOUNTS = ("/tmp", "/dev/shm")  # fresh, empty and read-only in each worker
READ_ONLY = ("/", "/dev")  # bubblewrap's writable tmpfs mounts, made read-only in each worker

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(_bytes(source), _bytes(target), _bytes(kind), flags, _bytes(data))
    _check(rc, f"mount {target}")


def enter_private_namespaces() -> None:
    """Move this (freshly forked, single-threaded) process into IPC and mount namespaces of its own.

    Raises OSError when the kernel refuses (no CAP_SYS_ADMIN in the jail's user namespace)."""
    _check(_libc.unshare(CLONE_NEWIPC | CLONE_NEWNS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates back to the zygote's view
    safe = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for target in EMPTY_MOUNTS:
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", safe | MS_RDONLY, "size=4k,nr_inodes=1,mode=0555")
    for target in READ_ONLY:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def hide(paths: tuple[str, ...]) -> None:
    """Unmount the pool's cgroup folders from this worker's view once it has joined its slots: from there on it has
    no use for them, and they would show every other slot's counters (how much memory other sessions hold)."""
    for path in paths:
        if path and _libc.umount2(path.encode(), MNT_DETACH) != 0:
            _check(-1, f"umount {path}")


def probe() -> str:
    """Whether a worker can have namespaces of its own here: a throwaway child tries (the zygote asks once)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            try:
                enter_private_namespaces()
                message = b"active"
            except OSError as exc:
                message = f"failed: {exc.strerror or exc}"[:300].encode()
            os.write(writer, message)
        finally:
            os._exit(0)
    os.close(writer)
    try:
        chunks = []
        while chunk := os.read(reader, 512):
            chunks.append(chunk)
    finally:
        os.close(reader)
        os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace") or "failed: the probe died"
