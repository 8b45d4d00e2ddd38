"""A seccomp deny-list through libseccomp (ctypes), for a worker that must keep its threads.

Why a deny-list and libseccomp: torch needs hundreds of syscalls (and threads), so an allow-list
would be fragile; what an escaped worker must not do is short and well known: start programs,
fork, open sockets, trace or signal other processes, read their memory, load kernel objects or
change namespaces. libseccomp resolves syscall names per architecture. ``clone3`` answers ENOSYS
so that glibc falls back to ``clone``, whose CLONE_THREAD flag the filter can inspect (threads
pass, fork fails). ``kill``/``tgkill`` pass only for the worker's own pid.

Why the metadata and watch calls are here too (issue #13): Landlock has no right for file
metadata, so an escaped root worker could chmod (setuid bits), chown, utime and setxattr host files;
inotify watches on host folders reported other processes' file accesses; ``sysinfo`` describes the
host. ``prctl`` passes only for a short allowlist (thread names, reads of the worker's own state):
clearing the parent-death signal, making the worker dumpable or changing its memory layout answer
EPERM. libseccomp allows one comparison per argument and rule, so "option not in the allowlist" is
written as a few masked-equality rules over aligned blocks of the forbidden values (``_blocks``).

Why locks (issue 20): every worker on one cached instance holds the same sealed model file, and locks, leases and
change notifications live on the file, not on a worker's descriptor: a red team passed bits between two escaped
sessions through ``flock``. So ``flock`` and ``fcntl``'s lock, lease and notify commands answer EPERM (``fcntl``'s
other commands, which Python and torch use on their own descriptors, pass).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

SCMP_ACT_ALLOW = 0x7FFF0000
CLONE_THREAD = 0x00010000
CMP_NE, CMP_LT, CMP_GT, CMP_MASKED_EQ = 1, 2, 6, 7
# fcntl commands that lock, lease or watch the file itself: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK,
# F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY (the status-flag, descriptor and seal commands stay)
FCNTL_DENIED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
# PR_GET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_NAME, PR_GET_NAME, PR_GET_SECCOMP, PR_CAPBSET_READ,
# PR_GET_NO_NEW_PRIVS, PR_GET_THP_DISABLE: what Python, glibc and torch's threads call.
PRCTL_ALLOWED = (2, 3, 15, 16, 21, 23, 39, 42)

DENIED = [
    "execve",
    "execveat",
    "fork",
    "vfork",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "tkill",
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "chroot",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "memfd_create",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "quotactl",
    "personality",
    "process_madvise",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "capset",
    "move_pages",
    "migrate_pages",
    "mbind",
    "kcmp",
    "lookup_dcookie",
    # file metadata: Landlock cannot refuse these
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "getxattrat",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "listxattrat",
    # locks and leases live on the file, not the descriptor: on the sealed model file every session holding the same
    # instance would share them (a channel between sessions); ``fcntl``'s lock commands are refused below
    "flock",
    # watching other processes' file activity, describing the host
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_mark",
    "sysinfo",
    # System V IPC and POSIX message queues (issue 53): a segment or queue outlives the process that made it and is
    # shared by name with every process of the IPC namespace; in the jail each worker has a namespace of its own
    # (``worker_ns.py``), and here they are refused as well, for hosts without one. ``ipc`` is the multiplexer some
    # architectures route them through.
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "ipc",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
]


def _blocks(low: int, high: int) -> list[tuple[int, int]]:
    """[low, high] as aligned power-of-two blocks: (mask, value) pairs for CMP_MASKED_EQ."""
    out = []
    while low <= high:
        size = low & -low if low else 1 << 63
        while size > high - low + 1:
            size >>= 1
        out.append(((~(size - 1)) & 0xFFFFFFFFFFFFFFFF, low))
        low += size
    return out


def prctl_denied_blocks() -> list[tuple[int, int]]:
    """The forbidden ``prctl`` options between the allowed ones (the tail is one CMP_GT rule)."""
    out, low = [], 0
    for allowed in PRCTL_ALLOWED:
        if low < allowed:
            out += _blocks(low, allowed - 1)
        low = allowed + 1
    return out


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@functools.cache
def _load_library() -> ctypes.CDLL:
    """Resolved once, in the zygote: ``find_library`` runs helper programs that a sandboxed worker cannot."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    try:
        _load_library()
    except OSError:
        return False
    return True


def install() -> int:
    """Load the filter into this process; return the number of rules. Raises OSError on failure."""
    lib = _load_library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    rules = 0
    pid = os.getpid()

    def add(name: str, action: int, *cmps: _ArgCmp) -> None:
        nonlocal rules
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not a syscall on this architecture
        arr = (_ArgCmp * max(len(cmps), 1))(*cmps)
        rc = lib.seccomp_rule_add_array(ctypes.c_void_p(ctx), action, nr, len(cmps), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add failed for {name}")
        rules += 1

    try:
        eperm = _errno_action(errno.EPERM)
        for name in DENIED:
            add(name, eperm)
        add("clone3", _errno_action(errno.ENOSYS))
        add("clone", eperm, _ArgCmp(0, CMP_MASKED_EQ, CLONE_THREAD, 0))
        add("kill", eperm, _ArgCmp(0, CMP_NE, pid, 0))
        add("tgkill", eperm, _ArgCmp(0, CMP_NE, pid, 0))
        add("prlimit64", eperm, _ArgCmp(0, CMP_NE, 0, 0))
        for command in FCNTL_DENIED:  # the kernel reads cmd as 32 bits: compare those only, or 1 << 32 | cmd passes
            add("fcntl", eperm, _ArgCmp(1, CMP_MASKED_EQ, 0xFFFFFFFF, command))
        add("prctl", eperm, _ArgCmp(0, CMP_GT, PRCTL_ALLOWED[-1], 0))
        for mask, value in prctl_denied_blocks():
            add("prctl", eperm, _ArgCmp(0, CMP_MASKED_EQ, mask, value))
        rc = lib.seccomp_load(ctypes.c_void_p(ctx))
        if rc < 0:
            raise OSError(-rc, "seccomp_load failed")
    finally:
        lib.seccomp_release(ctypes.c_void_p(ctx))
    return rules
