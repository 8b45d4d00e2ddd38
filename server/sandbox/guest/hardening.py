"""Process hardening applied by a freshly forked worker before it touches any session data.

Order matters: things that need privileges or file access (process group, closing inherited fds,
``/dev/null`` on 1 and 2, an empty working directory, joining the slot's pids cgroup, rlimits,
``oom_score_adj``) come first; then
the optional drop to a per-slot uid (which clears the parent-death signal, so it is set again and
the parent re-checked); then Landlock; seccomp last, because it forbids the set*id calls used before.

Each layer reports ``"active"``, ``"skipped: why"`` or ``"failed: why"``; the server publishes the
report in ``/health`` and refuses to start when ``MECHSANDBOX_REQUIRE`` names a layer that is not
active.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from dataclasses import dataclass, field

from . import landlock, seccomp, worker_ns

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class HardeningConfig:
    """What a worker applies to itself; built by the pool from its settings."""

    workdir: str
    address_space: int  # bytes for RLIMIT_AS
    cpu_seconds: int
    open_files: int = 64
    uid_base: int = 20000
    uid_drop: str = "auto"  # auto | force | off
    landlock: bool = True
    seccomp: bool = True
    rlimits: bool = True
    read_paths: tuple[str, ...] = field(default_factory=tuple)
    pids_cgroup: str = ""  # the pool's pids cgroup as this process sees it; "" = none could be had
    memory_cgroup: str = ""  # the pool's memory cgroup likewise (``memory.py``); "" = none
    own_namespaces: bool = False  # the worker has a mount namespace of its own (``worker_ns.py``)
    max_pids: int = 64


def library_paths() -> tuple[str, ...]:
    """What a worker may still read: the interpreter, site-packages, the package's guest code, system libraries.

    Of the package only the code workers import (``code_paths.GUEST_CODE``), never the whole folder: the package is
    the repository root, and without the jail (a host with no namespaces) this rule is what keeps ``.git``, the tests
    and a results database in the working directory out of an escaped worker's reach (issue 53)."""
    import mechsandbox

    from ..code_paths import GUEST_CODE

    package = os.path.dirname(os.path.abspath(mechsandbox.__file__))
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p) and p != os.getcwd() and p != package)
    paths.update(os.path.join(package, entry) for entry in GUEST_CODE)
    paths.update(["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/dev/urandom"])
    return tuple(sorted(p for p in paths if os.path.exists(p)))


def set_parent_death_signal(expected_parent: int) -> None:
    """Die with the parent; if it is already gone, exit now."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(70)


def isolate_process(keep_fd: int, workdir: str) -> None:
    """Own process group, only ``keep_fd`` plus 0-2 open (0-2 on /dev/null), empty cwd, quiet signals."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    max_fd = os.sysconf("SC_OPEN_MAX")
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, max_fd)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.chdir(workdir)


def apply_rlimits(cfg: HardeningConfig) -> None:
    for limit, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_NOFILE, cfg.open_files),
        (resource.RLIMIT_CPU, cfg.cpu_seconds),
        (resource.RLIMIT_AS, cfg.address_space),
    ):
        resource.setrlimit(limit, (value, value))
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _readable_by(uid: int, paths: tuple[str, ...]) -> str | None:
    """The first path the uid cannot traverse (checked on the mode bits), or None."""
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)
        for i in range(2, len(parts) + 1):
            st = os.stat(os.sep.join(parts[:i]) or os.sep)
            if st.st_uid == uid:
                continue
            bit = 0o001 if os.path.isdir(os.sep.join(parts[:i])) else 0o004
            if not st.st_mode & bit:
                return os.sep.join(parts[:i])
    return None


def interpreter_paths() -> tuple[str, ...]:
    import torch

    return (os.path.realpath(sys.executable), os.path.dirname(os.__file__), os.path.dirname(torch.__file__))


def drop_privileges(cfg: HardeningConfig, slot: int) -> str:
    if cfg.uid_drop == "off":
        return "skipped: disabled by configuration"
    if os.getuid() != 0:
        return "skipped: the server does not run as root (Landlock and seccomp still apply)"
    uid = cfg.uid_base + slot
    blocked = _readable_by(uid, interpreter_paths())
    if blocked and cfg.uid_drop != "force":
        return f"skipped: uid {uid} cannot read the interpreter ({blocked} is not world-searchable)"
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_pids, cfg.max_pids))
    return "active"


def join_pids_cgroup(cfg: HardeningConfig, slot: int) -> str:
    """Move this (still single-threaded) process into its slot's pids cgroup, capped at ``max_pids``.

    Where no pids controller could be had, RLIMIT_NPROC is the fallback: it counts per uid, so it
    only binds with the uid drop (the kernel exempts uid 0), and the report says so.
    """
    if cfg.pids_cgroup:
        try:
            with open(os.path.join(cfg.pids_cgroup, f"slot-{slot}", "cgroup.procs"), "w") as f:
                f.write("0")
            return "active"
        except OSError as exc:
            why = f"joining the pids cgroup failed ({exc.strerror or exc})"
    else:
        why = "no pids cgroup controller"
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_pids, cfg.max_pids))
    return f"skipped: {why}; RLIMIT_NPROC {cfg.max_pids} instead (per uid, void for uid 0)"


def join_memory_cgroup(cfg: HardeningConfig, slot: int) -> str:
    """Move this process into its slot's memory cgroup, where the kernel charges everything it brings in (shared and
    SysV memory included) and the watchdog reads it; without one, the watchdog reads the process's maps."""
    if not cfg.memory_cgroup:
        return "skipped: no memory cgroup controller; the watchdog reads smaps_rollup instead"
    try:
        with open(os.path.join(cfg.memory_cgroup, f"slot-{slot}", "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError as exc:
        return f"failed: joining the memory cgroup failed ({exc.strerror or exc}); the watchdog reads smaps_rollup"
    return "active"


def drop_bounding_set() -> None:
    """Empty the capability bounding set (needs CAP_SETPCAP, which the jailed zygote keeps for this; without it each
    drop fails quietly): no later exec of a file with capabilities could give any back."""
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def drop_capabilities() -> None:
    """A worker without a uid drop keeps the zygote's capabilities (in the jail CAP_SYS_ADMIN among them, also as a
    non-root uid in a user namespace); remove them all (bounding set, effective, permitted, inheritable)."""
    drop_bounding_set()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)
    data = (Data * 2)()
    _libc.capset(ctypes.byref(header), data)


def harden(cfg: HardeningConfig, slot: int, keep_fd: int, parent: int) -> dict[str, str]:
    """Apply every configured layer to this (freshly forked) process; return the report."""
    report: dict[str, str] = {}
    isolate_process(keep_fd, cfg.workdir)
    set_parent_death_signal(parent)
    try:
        report["pids"] = join_pids_cgroup(cfg, slot)
    except (OSError, ValueError) as exc:
        report["pids"] = f"failed: {exc}"
    report["memory_cgroup"] = join_memory_cgroup(cfg, slot)
    if cfg.own_namespaces:  # joined: the cgroup folders leave this worker's view
        try:
            worker_ns.hide((cfg.pids_cgroup, cfg.memory_cgroup))
        except OSError as exc:
            report["pids"] = f"failed: {exc}"
    if cfg.rlimits:
        try:
            apply_rlimits(cfg)
            report["rlimits"] = "active"
        except (OSError, ValueError) as exc:
            report["rlimits"] = f"failed: {exc}"
    else:
        report["rlimits"] = "skipped: disabled by configuration"
    drop_bounding_set()
    try:
        report["uid"] = drop_privileges(cfg, slot)
    except OSError as exc:
        report["uid"] = f"failed: {exc}"
    if report["uid"] != "active":
        drop_capabilities()
    set_parent_death_signal(parent)
    if cfg.landlock:
        try:
            abi = landlock.restrict(cfg.read_paths)
            report["landlock"] = "active"
            report["landlock_abi"] = str(abi)
        except OSError as exc:
            report["landlock"] = f"failed: {exc}"
    else:
        report["landlock"] = "skipped: disabled by configuration"
    if cfg.seccomp:
        try:
            seccomp.install()
            report["seccomp"] = "active"
        except OSError as exc:
            report["seccomp"] = f"failed: {exc}"
    else:
        report["seccomp"] = "skipped: disabled by configuration"
    return report
