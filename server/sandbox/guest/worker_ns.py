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
  tmpfs mounts (but for the worker's own code and runtime where those live under ``/tmp``, bound back read-only as
  the jail showed them) and ``/`` and ``/dev`` are read-only: there is nowhere to leave a file for the next session.

This needs CAP_SYS_ADMIN in the jail (the zygote keeps it for this, and every worker drops it with the rest of its
capabilities before it runs anything of a session). seccomp refuses SysV IPC calls too, so a host without namespaces
(where this module is not used) still has no shared segment between sessions.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
EMPTY_MOUNTS = ("/tmp", "/dev/shm")  # fresh, empty and read-only in each worker
READ_ONLY = ("/", "/dev")  # bubblewrap's writable tmpfs mounts, made read-only in each worker
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")  # read-only in a worker's own /proc

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


def next_child_in_new_pid_namespace() -> None:
    """In the zygote, before a fork: the next child is PID 1 of a PID namespace of its own (``unshare`` moves only the
    children; the zygote itself stays where it is). Undo with ``back_to_pid_namespace`` right after the fork."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")


def back_to_pid_namespace(own: int) -> None:
    """In the zygote, after the fork: later children are born in the zygote's own PID namespace again (``own`` is a
    descriptor of ``/proc/self/ns/pid``), so that the next ``next_child_in_new_pid_namespace`` may make a new one."""
    _check(_libc.setns(own, CLONE_NEWPID), "setns(CLONE_NEWPID)")


def enter_private_namespaces(workdir: str = "", own_pid: bool = True) -> None:
    """Move this (freshly forked, single-threaded) process into IPC and mount namespaces of its own, with a ``/proc``
    of its own PID namespace (the zygote made one for it: it is PID 1 there and alone).

    ``workdir``: a folder under ``/tmp`` to leave, empty, in the worker's own ``/tmp`` (its working directory keeps
    the path the server made for it). ``own_pid``: the worker is PID 1 of a PID namespace of its own, and gets a
    ``/proc`` of it; without one it keeps the jail's ``/proc`` (a kernel that refuses a worker its PID namespace, as
    under podman's ``unmask=ALL``, refuses that mount too). Raises OSError when the kernel refuses (no CAP_SYS_ADMIN in
    the jail's user namespace)."""
    _check(_libc.unshare(CLONE_NEWIPC | CLONE_NEWNS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates back to the zygote's view
    safe = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if own_pid:
        # on top of the jail's /proc, which shows the zygote and every other worker (it stays mounted beneath: in a
        # user namespace the kernel mounts a new proc only where a fully visible one is already there)
        _mount("proc", "/proc", "proc", safe)
        for part in PROC_READ_ONLY:  # as bubblewrap leaves them: no kernel setting or trigger is written through /proc
            path = f"/proc/{part}"
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | safe)
    for target in EMPTY_MOUNTS:
        if os.path.isdir(target):
            kept = _open_kept(target)
            try:
                _mount("tmpfs", target, "tmpfs", safe, f"size=64k,nr_inodes={4 + 32 * len(kept)},mode=0755")
                for path, fd in kept:  # the code and runtime beneath it, as the jail showed them
                    os.makedirs(path, mode=0o555, exist_ok=True)
                    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            finally:
                for _, fd in kept:
                    os.close(fd)
            if workdir.startswith(target + "/"):
                os.makedirs(workdir, mode=0o555, exist_ok=True)
            os.chmod(target, 0o555)
            _mount(None, target, None, MS_REMOUNT | MS_RDONLY | safe)
    for target in READ_ONLY:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _open_kept(target: str) -> list[tuple[str, int]]:
    """The folders under ``target`` that the worker runs from (the package's guest code, the virtualenv, any import
    path: a checkout or a virtualenv may live under ``/tmp``), each with an ``O_PATH`` descriptor, outermost only, so
    that a fresh empty ``target`` can show them again. Without this a checkout under ``/tmp`` vanished from every
    worker's view: the package's own files could no longer be read or imported."""
    import sys

    import mechsandbox

    wanted = {os.path.dirname(os.path.abspath(mechsandbox.__file__)), sys.prefix, sys.base_prefix, *sys.path}
    paths = {os.path.abspath(w) for w in wanted if w}
    under = sorted(p for p in paths if p.startswith(target + "/") and os.path.isdir(p))
    outermost = [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]
    kept = []
    try:
        for path in outermost:
            kept.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    except OSError:
        for _, fd in kept:
            os.close(fd)
        raise
    return kept


def hide(paths: tuple[str, ...]) -> None:
    """Unmount the pool's cgroup folders from this worker's view once it has joined its slots: from there on it has
    no use for them, and they would show every other slot's counters (how much memory other sessions hold)."""
    for path in paths:
        if path and _libc.umount2(path.encode(), MNT_DETACH) != 0:
            _check(-1, f"umount {path}")


def spawn_child(private: bool, own_pid_namespace: int) -> int:
    """``os.fork()``; with ``private`` the child is born in a PID namespace of its own (the caller, in the child,
    enters the rest with ``enter_private_namespaces``)."""
    if private:
        next_child_in_new_pid_namespace()
    pid = os.fork()
    if pid != 0 and private:
        back_to_pid_namespace(own_pid_namespace)
    return pid


def probe(own_pid_namespace: int, workdir: str = "") -> str:
    """Whether a worker can have namespaces of its own here (the zygote asks once): ``active``; ``active without a
    PID namespace of its own (...)`` where IPC and mount namespaces work but the zygote could not return to its own
    PID namespace after making one; else ``failed: ...``.

    The rehearsal runs in a throwaway child, never in the zygote: a zygote that unshared a PID namespace and then could
    not ``setns`` back (as under podman with ``unmask=ALL``) would fork every later worker into the dead rehearsal's
    namespace, and each fork fails with ENOMEM. The child makes two workers in a row, as the zygote will."""
    pid_ns = _rehearse(own_pid_namespace, workdir, own_pid=True)
    if pid_ns == "active":
        return "active"
    rest = _rehearse(own_pid_namespace, workdir, own_pid=False)
    return f"active without a PID namespace of its own ({pid_ns})" if rest == "active" else rest


def _rehearse(own_pid_namespace: int, workdir: str, own_pid: bool) -> str:
    """In a throwaway child: spawn two would-be workers (each in a PID namespace of its own when ``own_pid``) that
    enter their private namespaces; what the first failure said, or ``active``."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        message = b"active"
        try:
            os.close(reader)
            for _ in range(2):
                message = _one_worker(own_pid_namespace, workdir, own_pid)
                if message != b"active":
                    break
        except OSError as exc:
            message = f"failed: {exc.strerror or exc}"[:300].encode()
        finally:
            with contextlib.suppress(OSError):
                os.write(writer, message)
            os._exit(0)
    os.close(writer)
    return _answer(reader, child).decode(errors="replace")


def _one_worker(own_pid_namespace: int, workdir: str, own_pid: bool) -> bytes:
    reader, writer = os.pipe()
    pid = spawn_child(own_pid, own_pid_namespace)
    if pid == 0:
        try:
            os.close(reader)
            try:
                enter_private_namespaces(workdir, own_pid)
                alone = os.getpid() == 1 or not own_pid
                message = b"active" if alone else b"failed: not PID 1 of a namespace of its own"
            except OSError as exc:
                message = f"failed: {exc.strerror or exc}"[:300].encode()
            os.write(writer, message)
        finally:
            os._exit(0)
    os.close(writer)
    return _answer(reader, pid)


def _answer(reader: int, child: int) -> bytes:
    """What a probing child wrote before it exited (read to the end, then reaped); a child that died saying nothing
    failed."""
    try:
        chunks = []
        while chunk := os.read(reader, 512):
            chunks.append(chunk)
    finally:
        os.close(reader)
        os.waitpid(child, 0)
    return b"".join(chunks) or b"failed: the probe died"
