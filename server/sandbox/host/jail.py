"""The jail around the zygote and its workers: bubblewrap namespaces and a pids cgroup per worker.

Why: the language and facade layers may fall, and Landlock has no right for file metadata, so an
escaped worker that still runs as uid 0 could chmod, chown, utime or setxattr host files, stat any
host path, enumerate host PIDs through ``/proc`` and outlive the server by clearing its
parent-death signal. Here the zygote starts inside new mount, PID, network, IPC and UTS namespaces
(``bwrap``, a well-kept tool, rather than hand-written ``unshare`` code):

* the root is an empty tmpfs holding read-only binds of what the interpreter needs (the Python
  prefix, the virtualenv, this package, the shared libraries, ``/etc/ld.so.cache``), a private
  ``/tmp``, a minimal ``/dev`` and a ``/proc`` of the new PID namespace only. Every ancestor folder
  is created 0755, so a 0700 ``/root`` around a pyenv interpreter no longer stops the per-slot uid
  drop (``hardening.drop_privileges``): inside the jail workers become uids that own no host file;
* the zygote is PID 1 there (``--as-pid-1``), so when it dies the kernel kills every worker,
  whatever a worker did to its own signals; ``--die-with-parent`` ties the zygote to the server;
* the zygote keeps only CAP_SETUID and CAP_SETGID (for the uid drop); no network, no host IPC.

Measured here (bubblewrap 0.8, 2 shared cores): the probe costs 4.9 ms once per pool; the jail adds
~3 ms to the zygote's start (``python -I -S -c pass``: 10.0 ms jailed, 7.2 ms bare, median of 10),
against ~2 s of imports and warm-up, and nothing to a fork from the zygote, which happens inside it.

The pids cgroup (v2 where the host delegates its ``pids`` controller, else v1) gives each worker
slot a child group with ``pids.max``; a worker joins its slot's group before it drops privileges,
so threads and processes a snippet starts are capped at ``max_pids`` per worker, not per host.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig

JAIL_PIDS = "/run/mechsandbox-pids"  # where the pool's pids cgroup is bound inside the jail
JAIL_MEMORY = "/run/mechsandbox-memory"  # and its memory cgroup (``memory.py``)
NAMESPACE_FLAGS = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
# What the zygote keeps: the per-slot uid drop (SETUID, SETGID), each worker's own namespaces (SYS_ADMIN, worker_ns.py)
# and emptying a worker's bounding set (SETPCAP). Every worker drops them all before it runs a session's code.
ZYGOTE_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN", "CAP_SETPCAP")
_POOL_NUMBERS = itertools.count()  # two pools in one process get two groups (slot numbers overlap)
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/etc/ld.so.cache")


def interpreter_binds() -> list[str]:
    """Host paths the zygote needs inside the jail: the interpreter, its packages, this package."""
    import mechsandbox

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.abspath(sys.executable))}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    # The zygote runs with -I: it imports from the install's paths, never from this process's
    # sys.path[0] (a script's folder or the working directory, e.g. /tmp or a home folder).
    paths.update(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    paths.add(os.path.dirname(os.path.abspath(mechsandbox.__file__)))
    paths.update(SYSTEM_LIBRARIES)
    return sorted(os.path.abspath(p) for p in paths if os.path.lexists(p))


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths that lie under another one (already visible through the outer bind)."""
    kept: list[str] = []
    for path in sorted(paths):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def nested_in_package(binds: list[str], package: str) -> list[str]:
    """The binds that lie beneath the package folder (a virtualenv inside the checkout): the package's view in the
    jail (``guest_tree.assemble``) needs a mount point for each."""
    return _outermost([p for p in binds if _under(p, package)])


def bwrap_argv(
    bwrap: str,
    workdir: str,
    pids_dir: str | None,
    binds: list[str] | None = None,
    memory_dir: str | None = None,
    package_view: tuple[str, str] | None = None,
) -> list[str]:
    """The bubblewrap command line that runs the zygote (append the interpreter's argv).

    ``package_view``: (the package folder, the folder of its guest code, ``guest_tree.assemble``): the jail shows the
    second where the first is, so nothing of the checkout but the code workers import is inside; binds beneath the
    package folder are made on top of it."""
    argv = [bwrap, *NAMESPACE_FLAGS, "--die-with-parent", "--as-pid-1", "--new-session"]
    if os.geteuid() != 0:
        argv += ["--unshare-user"]  # without root, namespaces need a user namespace of its own
    argv += ["--cap-drop", "ALL", *itertools.chain.from_iterable(("--cap-add", cap) for cap in ZYGOTE_CAPABILITIES)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # first: binds may lie under /tmp
    made: set[str] = {"/", "/proc", "/dev", "/tmp"}

    def parents(path: str) -> None:
        parent = os.path.dirname(path)
        chain = []
        while parent not in made:
            chain.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(chain):
            argv.extend(["--perms", "0755", "--dir", folder])
            made.add(folder)

    wanted = (binds if binds is not None else interpreter_binds()) + [workdir]
    package = package_view[0] if package_view else None
    outer = [p for p in wanted if package is None or not (p == package or _under(p, package))]
    outer = _outermost(outer)
    for path in outer:
        parents(path)
        if os.path.islink(path) and path in SYSTEM_LIBRARIES:
            argv += ["--symlink", os.readlink(path), path]  # /lib -> usr/lib on merged-/usr systems
        else:
            argv += ["--ro-bind", os.path.realpath(path), path]
        made.add(path)
    if package_view is not None and package is not None:
        if not any(_under(package, bound) for bound in outer):  # else it lies inside a bind already made
            parents(package)
        argv += ["--ro-bind", package_view[1], package]
        for path in nested_in_package(wanted, package):  # their mount points are in the view
            argv += ["--ro-bind", os.path.realpath(path), path]
    argv += ["--chdir", workdir]
    for host, inside in ((pids_dir, JAIL_PIDS), (memory_dir, JAIL_MEMORY)):
        if host is not None:
            parents(inside)
            argv += ["--bind", host, inside]
    return argv


@functools.cache
def probe() -> tuple[str | None, str]:
    """(path of bwrap, "active") when namespaces can be made here, else (None, "skipped: why")."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "skipped: bubblewrap (bwrap) is not installed"
    argv = [bwrap, *NAMESPACE_FLAGS, "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    if os.geteuid() != 0:
        argv.insert(1, "--unshare-user")
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"skipped: bubblewrap did not run ({exc})"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return None, f"skipped: no namespaces here ({why[0][:200]})"
    return bwrap, "active"


def _mounts() -> list[list[str]]:
    with open("/proc/self/mounts") as f:
        return [line.split() for line in f]


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` (``""`` = the v2 hierarchy)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(",") or (controller == "" and names == ""):
                return path
    return None


def cgroup_candidates(controller: str) -> list[tuple[int, str, str]]:
    """Where this process could make child cgroups with ``controller`` (``pids``, ``memory``): ``(version, folder,
    path relative to the hierarchy)`` for each mounted hierarchy that has it, cgroup v2 first. Shared by the pids and
    the memory groups of the worker slots."""
    found = []
    for fields in _mounts():
        if len(fields) < 4:
            continue
        mount, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup2":
            relative = _own_cgroup("")
            try:
                with open(os.path.join(mount, "cgroup.controllers")) as f:
                    present = controller in f.read().split()
            except OSError:
                present = False
            if relative is not None and present:
                found.insert(0, (2, mount + relative.rstrip("/"), relative.rstrip("/")))
        elif kind == "cgroup" and controller in options:
            relative = _own_cgroup(controller)
            if relative is not None:
                found.append((1, mount + relative.rstrip("/"), relative.rstrip("/")))
    return found


class PidsCgroup:
    """The pool's pids cgroup: one child group per worker slot, each with ``pids.max``.

    ``root`` is the host path of the pool's group, ``relative`` its path inside the hierarchy (as
    ``/proc/<pid>/cgroup`` shows it). The server creates slot groups; a worker joins its own
    (``hardening.join_pids_cgroup``) before it drops privileges.
    """

    def __init__(self, root: str, relative: str, version: int, limit: int):
        self.root, self.relative, self.version, self.limit = root, relative, version, limit
        self.prepared: set[int] = set()

    @classmethod
    def create(cls, limit: int, slots: int) -> tuple[PidsCgroup | None, str]:
        """A fresh group for this pool, or (None, why not).

        The pool's group is capped too (``limit`` x ``slots``): a worker that kept uid 0 (no uid drop)
        owns the group's files, and were Landlock gone as well, it could move itself up a level.
        """
        reasons = []
        for version, base, relative in cls._candidates():
            name = f"mechsandbox-{os.getpid()}-{next(_POOL_NUMBERS)}"
            remove_stale(base)
            try:
                if version == 2:
                    with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                        f.write("+pids")
                path = os.path.join(base, name)
                os.makedirs(path, exist_ok=True)
                if version == 2:
                    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
                        f.write("+pids")
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(limit * slots))
                return cls(path, os.path.join(relative, name), version, limit), f"cgroup v{version}"
            except OSError as exc:
                reasons.append(f"cgroup v{version} at {base}: {exc.strerror or exc}")
        return None, "; ".join(reasons) or "no pids cgroup controller is mounted"

    @staticmethod
    def _candidates() -> list[tuple[int, str, str]]:
        return cgroup_candidates("pids")

    def prepare_slot(self, slot: int) -> None:
        if slot in self.prepared:
            return
        path = os.path.join(self.root, f"slot-{slot}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(self.limit))
        self.prepared.add(slot)

    def kill_slot(self, slot: int) -> None:
        """SIGKILL what is left in a slot's group, never a process outside it (pidfd, checked membership)."""
        path = os.path.join(self.root, f"slot-{slot}")
        if self.version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
            with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
            return
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        wanted = f"{self.relative}/slot-{slot}"
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if self.member(pid, wanted):  # checked after the pidfd pins the process: no pid reuse
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)

    def member(self, pid: int, wanted: str) -> bool:
        controller = "" if self.version == 2 else "pids"
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                for line in f:
                    _id, names, path = line.rstrip("\n").split(":", 2)
                    if controller in names.split(",") or (controller == "" and names == ""):
                        return path == wanted
        except OSError:
            pass
        return False

    def remove(self, wait: float = 2.0) -> None:
        _remove_tree(self.root, wait)


def remove_stale(base: str) -> None:
    """Groups left by servers that died without closing their pool (SIGKILL): ``mechsandbox-<pid>-...``."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            owner = name.split("-")[1] if name.startswith("mechsandbox-") else ""
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                _remove_tree(os.path.join(base, name))


def _remove_tree(root: str, wait: float = 0.0) -> None:
    """rmdir the slot groups, then the group (empty groups only; retried while workers finish dying)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError):
            for name in os.listdir(root):
                if name.startswith("slot-"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(root, name))
        try:
            os.rmdir(root)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
