"""Server side of the sandbox: the zygote process, the warm worker pool, per-session handles, the watchdog.

Why this shape (figures in docs/PERFORMANCE.md, "Sandbox"): forking a preloaded zygote costs
milliseconds where a fresh interpreter costs seconds, so a small pool of pre-forked, pre-hardened,
model-less workers makes a reset cost only the model transfer. The wall-clock limit cannot live
inside the worker (a snippet can swallow any exception), so the server kills the worker's process
group from outside and the session gets a fresh worker next time (``namespace_reset``). A watchdog
thread polls every worker's private memory and kills the largest when the pool exceeds its budget.
Nothing here compiles or runs snippet code.

Host pids come from the kernel only (issue #13): in the jail (``jail.py``) the zygote and its
workers live in their own PID namespace, so a pid the zygote or a worker reports would name an
unrelated host process. The server reads the sender's pid from SCM_CREDENTIALS (the kernel
translates it into the server's namespace), pins the process with a pidfd, checks its NSpid against
the zygote's report, and signals only through that pidfd or through the slot's pids cgroup with
membership checked after pinning. A worker pid number is never passed to ``kill``/``killpg``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from ....jsonvalue import AnswerError, check_json_value
from ..frames import MAX_REPLY, FrameError, MalformedFrame, recv_frame, recv_numbered, send_frame
from ..payload import ModelPayload
from ..settings import KNOWN_LAYERS, SandboxSettings
from . import guest_tree, jail, memory

log = logging.getLogger("mechsandbox.sandbox")

ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL")
ZYGOTE_START_TIMEOUT = 120.0
# CPU seconds a worker may use while no request is in flight before the watchdog kills it. An honest worker uses none
# (it waits on its socket; a snippet that leaves threads behind retires the worker): CPU between requests is code the
# wall-clock limit no longer covers, e.g. an escaped worker that forged its reply and kept running.
IDLE_CPU_SECONDS = 1.0
# Loads under way behind resets at once (``SandboxSession``); past it a reset loads before it answers. Why a bound: a
# reset that does not wait for its load gives a client that resets in a loop no back-pressure, so its loads (and the
# spawns they need) would pile up without limit and could take every worker slot; 8 sessions playing at RL speed keep
# a few under way.
MAX_LOADS_BEHIND = 16
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class SandboxUnavailable(RuntimeError):
    """The zygote is down or the pool is closed."""


class WorkerLost(Exception):
    """The worker died or was killed; ``reason`` says why in words for the agent, ``server_fault`` whether the loss
    was the server's doing rather than the snippet's (``Worker.kill``)."""

    def __init__(self, reason: str, server_fault: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.server_fault = server_fault


class LimitReached(Exception):
    """A request's worker passed its CPU limit or the wall-clock backstop (``_Watch``); ``reason`` completes
    "the snippet ...", ``server_fault`` says whether the server, not the snippet, is to blame."""

    def __init__(self, reason: str, server_fault: bool = False):
        super().__init__(reason)
        self.reason, self.server_fault = reason, server_fault


#: Once a reply's first byte has arrived, the whole frame must follow within this many seconds. An honest worker
#: writes its reply at once (milliseconds, even 1 MiB); the deadline stops a reply dribbled a byte at a time from
#: holding a server thread (a red team, 2026-12-05) now that the wait before the first byte is measured in CPU time.
REPLY_SECONDS = 5.0
#: Longest pause between two looks at a busy worker's CPU time: a look is one small /proc read, so a long snippet
#: costs the server a few reads a second, and a short one none (its reply ends the wait first).
POLL_SECONDS = 0.25
#: The share of the time before the backstop (from the first look on) that the worker's main thread must have spent
#: waiting for a CPU for the backstop kill to be the server's fault: the machine's load starved the worker, its snippet
#: did not block it.
STARVED_SHARE = 0.5
CORES = max(len(os.sched_getaffinity(0)), 1)
#: How a limit message names what ran out of time, by request operation.
SUBJECTS = {"run": "the snippet", "unrestricted": "the snippet", "solution": "converting the answer"}


def backstop_seconds(settings: SandboxSettings, cpu_limit: float) -> float:
    """The wall-clock backstop of a request whose CPU limit is ``cpu_limit``: the setting, never below the limit."""
    return max(settings.wall_backstop_seconds, cpu_limit)


class _Watch:
    """Waits for a worker's reply to start while its CPU time stays under the limit and the backstop is ahead.

    Why the server watches and not only the worker: a snippet can swallow the worker's own soft timeout or sit in
    a C call that never returns to Python, so only a kill from outside is sure. The baseline is read before the
    request is sent, so the limit counts the request's own CPU time, not the worker's past; the wait for a CPU is first
    read at the first look, so a request answered before it (most are) costs one /proc read."""

    def __init__(self, worker: Worker, cpu_limit: float, backstop: float):
        self.worker, self.cpu_limit, self.backstop = worker, cpu_limit, backstop
        self.started = time.monotonic()
        self.cpu_start = worker.cpu_seconds() or 0.0
        self.delay_start: tuple[float, float | None] | None = None  # (when, run delay then), from the first look

    def until_readable(self) -> None:
        """Return once the reply's first byte (or EOF) is there; raise ``LimitReached`` past a limit."""
        fileno = self.worker.sock.fileno()
        if fileno < 0:
            raise OSError("the worker's socket is closed")
        poller = select.poll()
        poller.register(fileno, select.POLLIN)
        wait = min(POLL_SECONDS, self.cpu_limit / CORES, self.backstop)
        while not poller.poll(max(wait, 0.001) * 1000):
            now = self.worker.cpu_seconds()
            if now is None:
                return  # the process is gone: reading the socket finds EOF
            used = now - self.cpu_start
            if self.delay_start is None:
                self.delay_start = (time.monotonic(), self.worker.run_delay())
            if used > self.cpu_limit:
                raise LimitReached(
                    f"used more than {self.cpu_limit:g} s of CPU time (a CPU-time limit, not a wall-clock limit)"
                )
            elapsed = time.monotonic() - self.started
            if elapsed >= self.backstop:
                raise self._backstop()
            # a process uses at most CORES CPU seconds a second: the next look cannot come too late for the limit
            wait = min(POLL_SECONDS, (self.cpu_limit - used) / CORES, self.backstop - elapsed)

    def _backstop(self) -> LimitReached:
        """The backstop kill, the server's fault when the main thread mostly waited for a CPU (starved by load)."""
        since, before = self.delay_start or (self.started, None)
        delay = self.worker.run_delay()
        starved = None not in (delay, before) and delay - before > STARVED_SHARE * (time.monotonic() - since)
        if starved:
            return LimitReached(
                f"got too little CPU before the {self.backstop:g} s wall-clock backstop (the server was overloaded)",
                server_fault=True,
            )
        return LimitReached(f"ran past the {self.backstop:g} s wall-clock backstop (it waited, not using its CPU)")


def scrubbed_environment() -> dict[str, str]:
    """The zygote's environment: an allowlist, never tokens, keys or salts."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST or k.startswith("OPENBLAS_")}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    return env


class InvalidReply(Exception):
    """A reply frame that an honest worker never sends (wrong types, sizes, keys or sequence number)."""


def _text(reply: dict[str, Any], key: str, limit: int, optional: bool = False) -> str | None:
    value = reply.get(key)
    if value is None and optional:
        return None
    if type(value) is not str:
        raise InvalidReply(f"{key!r} is not a string")
    if len(value) > limit or len(value.encode("utf-8", "replace")) > limit:
        raise InvalidReply(f"{key!r} is longer than {limit} bytes")
    return value


def _keys(reply: dict[str, Any], allowed: set[str]) -> None:
    extra = set(reply) - allowed
    if extra:
        raise InvalidReply(f"unexpected keys {sorted(extra)[:3]}")


#: The longest error text a worker may send (errors are capped in the worker; policy messages run longer).
ERROR_SLACK = 4096


def check_reply(op: str, reply: dict[str, Any], settings: SandboxSettings) -> dict[str, Any]:
    """Validate one reply against what the worker's ``handle`` returns for ``op``; raise ``InvalidReply``.

    Why: the worker runs hostile code, so its replies are data from an adversary. The server re-checks
    every field an honest worker sets (the output cap included) rather than trusting the worker's caps.
    """
    error_limit = settings.error_cap + ERROR_SLACK
    if op == "run":
        _keys(reply, {"stdout", "error", "output_truncated", "seconds"})
        _text(reply, "stdout", settings.output_cap)
        _text(reply, "error", error_limit, optional=True)
        if type(reply.get("output_truncated")) is not bool:
            raise InvalidReply("'output_truncated' is not a boolean")
        seconds = reply.get("seconds")
        longest = backstop_seconds(settings, settings.wall_seconds) + 60.0
        if type(seconds) not in (int, float) or not 0.0 <= seconds <= longest:
            raise InvalidReply("'seconds' is not a number of seconds within the wall-clock backstop")
    elif op in ("load", "solution"):
        _keys(reply, {"error", "ok"} if op == "load" else {"error", "value"})
        if reply.get("error") is not None or ("value" not in reply and "ok" not in reply):
            _text(reply, "error", error_limit)
        elif op == "load" and reply.get("ok") is not True:
            raise InvalidReply("'ok' is not true")
    return reply


def sender_pid(sock: socket.socket) -> int:
    """The host pid of whoever sent the next pending message, from SCM_CREDENTIALS (peeked, not read).

    The receiving socket must have had SO_PASSCRED set before the message was sent.
    """
    _data, ancillary, _flags, _addr = sock.recvmsg(1, socket.CMSG_SPACE(12), socket.MSG_PEEK)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            pid = struct.unpack("i", data[:4])[0]
            if pid > 0:
                return pid
    raise OSError("the peer's credentials are missing")


def namespace_pid(pid: int, level: int = -1) -> int:
    """The pid a host process has in the PID namespace ``level`` deep (its NSpid field: 0 is the host's own namespace,
    -1 its innermost). In the jail each worker is PID 1 of a namespace of its own, one level below the zygote's, so
    the pool compares the pid at the zygote's level with what the zygote's fork returned."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[1:][level])
    raise OSError(f"process {pid} has no NSpid")


def namespace_depth(pid: int) -> int:
    """How deep a host process's PID namespace lies (0 = the host's own): the index of its last NSpid field."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return len(line.split()) - 2
    raise OSError(f"process {pid} has no NSpid")


class Worker:
    """One sandboxed worker process, as the server sees it: a host pid, a pidfd and a framed socket."""

    def __init__(self, pid: int, sock: socket.socket, slot: int, cgroup: jail.PidsCgroup | None = None):
        self.pid, self.sock, self.slot, self.cgroup = pid, sock, slot, cgroup
        self.pidfd: int | None = None
        self.pidfd_lock = threading.Lock()  # the watchdog polls the pidfd while a session may close it
        self.isolation: dict[str, str] = {}
        self.dead_reason: str | None = None
        self.server_fault = False  # with ``dead_reason``: the loss was the server's doing, not the snippet's (``kill``)
        self.seq = 0
        # between requests the watchdog compares the worker's CPU time with what it read at its first look at this
        # idle spell (``idle_mark``: the request count and the CPU seconds then); the count tells it whether a
        # request started and ended while it looked. Nothing of it is read on a request's path.
        self.state_lock = threading.Lock()
        self.busy = False
        self.requests = 0
        self.idle_mark: tuple[int, float] | None = None

    def cpu_seconds(self) -> float | None:
        """The process's user + system CPU time, all its threads (/proc/<pid>/stat); None once it is gone. Read with
        raw ``os`` calls (half the cost of ``open``): every request reads it once, a long one a few times a second."""
        try:
            fd = os.open(f"/proc/{self.pid}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
            fields = data.rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return None

    @property
    def alive(self) -> bool:
        return self.dead_reason is None

    def exited(self) -> bool:
        """True once the process is gone (its pidfd turns readable); never looks a pid up again. ``poll``, not
        ``select``: a server holding a few hundred sessions has descriptors past select's limit of 1024."""
        with self.pidfd_lock:
            if self.pidfd is None:
                return True
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            return bool(poller.poll(0))

    def handshake(self, timeout: float, reported_pid: int, level: int = -1) -> None:
        """Learn the worker's host pid from the kernel, pin it, then read its isolation report. ``level``: the
        depth of the zygote's PID namespace, where ``reported_pid`` (the zygote's fork) names the worker."""
        self.sock.settimeout(timeout)
        self.pid = sender_pid(self.sock)
        self.pidfd = os.pidfd_open(self.pid)
        if namespace_pid(self.pid, level) != reported_pid:  # checked after pinning: the pid cannot be reused now
            raise FrameError(f"process {self.pid} is not the worker the zygote forked")
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
        hello, _ = recv_frame(self.sock, MAX_REPLY, deadline=time.monotonic() + timeout)
        self.isolation = {k: str(v) for k, v in hello.get("isolation", {}).items()}

    def request(
        self,
        message: dict[str, Any],
        cpu_limit: float,
        settings: SandboxSettings,
        blob: bytes = b"",
        fd: int | None = None,
    ) -> dict[str, Any]:
        """Send one numbered request and return its validated reply; any doubt about the reply loses the worker.

        The worker is killed when it uses more than ``cpu_limit`` seconds of CPU (its own user + system time, all its
        threads, from /proc) before its reply starts, or when the reply has not started by the wall-clock backstop
        (``backstop_seconds``); once the reply's first byte is there, the whole frame must follow within
        ``REPLY_SECONDS`` (a deadline, not a timeout per read). Why CPU time: on a busy machine a snippet gets a
        slice of a core, so a wall-clock limit charged the agent for the machine's load (issue 52)."""
        if not self.alive:
            raise WorkerLost(self.dead_reason or "the worker is gone", self.server_fault)
        with self.state_lock:
            self.busy = True
            self.requests += 1
        try:
            return self._request(message, cpu_limit, settings, blob, fd)
        finally:
            with self.state_lock:
                self.busy = False

    def _request(
        self, message: dict[str, Any], cpu_limit: float, settings: SandboxSettings, blob: bytes, fd: int | None
    ) -> dict[str, Any]:
        backstop = backstop_seconds(settings, cpu_limit)
        op = str(message.get("op"))
        self.seq = (self.seq + 1) & 0xFFFFFFFF or 1
        try:
            if self._spoke_out_of_turn():
                raise InvalidReply("a frame arrived before the request was sent")
            watch = _Watch(self, cpu_limit, backstop)
            self.sock.settimeout(backstop)  # the worker waits on its socket: a send only waits for a large model
            send_frame(self.sock, message, blob, seq=self.seq, fd=fd)
            watch.until_readable()
            reply, _, seq = recv_numbered(self.sock, MAX_REPLY, deadline=time.monotonic() + REPLY_SECONDS)
            if seq != self.seq:
                raise InvalidReply(f"the reply answers request {seq}, not {self.seq}")
            retire = reply.pop("retire", None)  # the worker exits after this reply (threads outlived the snippet)
            if retire is not None and (type(retire) is not str or len(retire) > 200):
                raise InvalidReply("'retire' is not a short reason")
            checked = check_reply(op, reply, settings)
            if retire:
                self.kill(f"{retire}; namespace reset")
            return checked
        except LimitReached as exc:
            subject = SUBJECTS.get(op, f"the {op} request")
            self.kill(f"{subject} {exc.reason}", server_fault=exc.server_fault)
        except TimeoutError:
            self.kill(f"the worker's reply did not arrive within the {REPLY_SECONDS:g} s wall-clock limit on a reply")
        except (InvalidReply, MalformedFrame) as exc:
            log.warning("worker %d sent an invalid reply (%s); killing it", self.pid, exc)
            self.kill("the worker sent an invalid reply and was replaced")
        except (FrameError, OSError):
            self.kill("the worker process died (crash or forced exit)")
        raise WorkerLost(self.dead_reason or "the worker is gone", self.server_fault)

    def run_delay(self) -> float | None:
        """Seconds the worker's main thread (the one that runs snippets) has spent runnable but waiting for a CPU
        (/proc/<pid>/schedstat); None when unknown."""
        try:
            with open(f"/proc/{self.pid}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def _spoke_out_of_turn(self) -> bool:
        """True when bytes are already waiting: an honest worker only ever answers a request."""
        self.sock.setblocking(False)  # with a timeout set, recv would first wait for data
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            return False

    def kill(self, reason: str, *, server_fault: bool = False) -> None:
        """SIGKILL through the pidfd, then whatever is left in the slot's pids cgroup; close the socket.

        ``server_fault``: the worker is lost for a reason that is not its snippet's (the server shuts down, the zygote
        died, or the memory watchdog kills it while it is within its guarantee: the pool admitted more sessions than
        it can hold, see docs/SANDBOX.md, "Whose fault a lost worker is"). The first kill's reason and fault stand;
        both are recorded before the signal, so a request that sees the worker die reads them (``RunResult``)."""
        if self.dead_reason is None:
            self.server_fault = server_fault
            self.dead_reason = reason
        with self.pidfd_lock:
            if self.pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                if self.cgroup is not None:
                    self.cgroup.kill_slot(self.slot)
                os.close(self.pidfd)
                self.pidfd = None
        with contextlib.suppress(OSError):
            self.sock.close()


class ZygoteProcess:
    """The server's handle on the zygote (``zygote.py``, run in a child interpreter): the preloaded parent
    of every worker, started with fork+exec and a scrubbed environment."""

    def __init__(self, settings: SandboxSettings, workdir: str, cgroup: jail.PidsCgroup | None = None):
        self.settings, self.cgroup = settings, cgroup
        self.memory_cgroup: memory.MemoryCgroup | None = None
        self.memory_accounting = "not started"
        self.package_view: str | None = None  # the folder of guest code the jail shows as the package
        bwrap, self.namespaces = jail.probe() if settings.namespaces else (None, "skipped: disabled by configuration")
        if bwrap is not None:
            try:
                self._start(workdir, bwrap)
                return
            except SandboxUnavailable as exc:
                log.error("the jailed sandbox zygote did not start; starting it without namespaces: %s", exc)
                self.namespaces = f"failed: {exc}"
        self._start(workdir, None)

    def _start(self, workdir: str, bwrap: str | None) -> None:
        settings, cgroup = self.settings, self.cgroup
        self.lock = threading.Lock()
        control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        control.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the zygote's host pid, from the kernel
        pids_cgroup = "" if cgroup is None else jail.JAIL_PIDS if bwrap else cgroup.root
        if self.memory_cgroup is None:  # one per zygote: its workers' slots, read by the watchdog (memory.py)
            self.memory_cgroup, detail = memory.MemoryCgroup.create()
            self.memory_accounting = (
                f"memory cgroup ({detail}): anonymous, shared and SysV memory per worker"
                if self.memory_cgroup is not None
                else f"smaps_rollup (anonymous + proportional shared memory per worker): {detail}"
            )
        memcg = self.memory_cgroup
        memory_cgroup = "" if memcg is None else jail.JAIL_MEMORY if bwrap else memcg.root
        hardening = {
            "workdir": workdir,
            "address_space": 0,
            "cpu_seconds": settings.cpu_seconds,
            "uid_drop": settings.uid_drop,
            "landlock": settings.landlock,
            "seccomp": settings.seccomp,
            "rlimits": settings.rlimits,
            "pids_cgroup": pids_cgroup,
            "memory_cgroup": memory_cgroup,
            "max_pids": settings.max_pids,
        }
        config = {
            "fd": child_end.fileno(),
            "parent": None if bwrap else os.getpid(),
            "worker_namespaces": bwrap is not None,
            "hardening": hardening,
            "worker_memory": settings.worker_memory_mb * 1024 * 1024,
            "limits": {
                "output_cap": settings.output_cap,
                "error_cap": settings.error_cap,
                "test_unrestricted": settings.test_unrestricted,
                "snippet_nice": settings.snippet_nice,
            },
        }
        argv = [sys.executable, "-I", "-m", "mechsandbox.server.sandbox.guest.zygote", json.dumps(config)]
        if bwrap is not None:
            memory_dir = memcg.root if memcg else None
            package = guest_tree.package_dir()  # the jail shows only the code workers import (guest_tree.py)
            self.package_view = guest_tree.assemble(jail.nested_in_package(jail.interpreter_binds(), package))
            view = (package, self.package_view)
            pids_dir = cgroup.root if cgroup else None
            argv = jail.bwrap_argv(bwrap, workdir, pids_dir, memory_dir=memory_dir, package_view=view) + argv
        started = time.perf_counter()
        self.process = subprocess.Popen(
            argv,
            env=scrubbed_environment(),
            cwd=workdir,
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
        child_end.close()
        self.control = control
        control.settimeout(ZYGOTE_START_TIMEOUT)
        try:
            self.pid = sender_pid(control)  # the zygote's host pid (in the jail it calls itself 1)
            # how deep its PID namespace lies (0 = the host's): a worker's fork-reported pid is its NSpid there
            self.pid_level = namespace_depth(self.pid)
            ready = json.loads(control.recv(65536) or b"{}")
            control.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)  # or they crowd out SCM_RIGHTS
        except (OSError, ValueError) as exc:
            self.stop()
            raise SandboxUnavailable(f"the sandbox zygote did not start: {exc}") from None
        if not ready.get("ready"):
            self.stop()
            raise SandboxUnavailable(f"the sandbox zygote did not start (exit code {self.process.poll()})")
        control.settimeout(30.0)
        self.start_seconds = time.perf_counter() - started
        self.address_space = int(ready["address_space"])
        self.worker_namespaces = str(ready.get("worker_namespaces", "unknown"))
        if bwrap is not None and not self.worker_namespaces.startswith("active"):  # the jail is only whole with them
            self.namespaces = f"failed: a worker's own namespaces: {self.worker_namespaces}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, slot: int) -> Worker:
        with self.lock:
            try:
                if self.cgroup is not None:
                    self.cgroup.prepare_slot(slot)
                if self.memory_cgroup is not None:
                    self.memory_cgroup.prepare_slot(slot)
                self.control.send(json.dumps({"op": "spawn", "slot": slot}).encode())
                data, fds, _flags, _addr = socket.recv_fds(self.control, 65536, 1)
            except OSError as exc:
                raise SandboxUnavailable(f"the sandbox zygote is not answering: {exc}") from None
        if not data or not fds:
            raise SandboxUnavailable("the sandbox zygote closed its control socket")
        info = json.loads(data)
        worker = Worker(0, socket.socket(fileno=fds[0]), slot, self.cgroup)
        try:
            worker.handshake(timeout=30.0, reported_pid=int(info["pid"]), level=self.pid_level)
        except (FrameError, OSError):
            worker.kill("the worker failed to start")
            raise SandboxUnavailable("a sandbox worker failed to start") from None
        return worker

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.memory_cgroup is not None:  # its workers die with it (PID 1 of the jail, or the parent-death signal)
            self.memory_cgroup.remove(wait=2.0)
            self.memory_cgroup = None
        if self.package_view is not None:
            guest_tree.remove(self.package_view)
            self.package_view = None


@dataclass
class RunResult:
    """One snippet's outcome, as the environment layer needs it."""

    stdout: str
    error: str | None
    output_truncated: bool = False
    namespace_reset: bool = False
    seconds: float = 0.0
    notice: str | None = None  # e.g. why the namespace was reset before this snippet ran
    # True when the worker was lost during this snippet for a reason that is not the snippet's (``Worker.kill``): the
    # episode layer does not charge such a step. False for the snippet's own limits and crashes.
    server_fault: bool = False


class Solution(tuple):
    """``solution_from``'s ``(answer, error)`` pair, with ``server_fault`` as in ``RunResult``. A tuple, so callers
    that unpack the pair or compare it with one read it as before."""

    server_fault: bool

    def __new__(cls, value: Any, error: str | None, server_fault: bool = False) -> Solution:
        pair = super().__new__(cls, (value, error))
        pair.server_fault = server_fault
        return pair


def soft_timeout(cpu_limit: float) -> float:
    """CPU seconds after which the worker's own timer stops a snippet with a readable error, before the server's
    kill at ``cpu_limit``: a second before it, or at 80 % for a short limit."""
    return max(cpu_limit - 1.0, cpu_limit * 0.8)


def raise_descriptor_limit(wanted: int) -> int:
    """Raise this process's soft descriptor limit towards ``wanted`` (never past the hard limit); the soft limit now.

    Why: each live episode holds about three descriptors in the server (its worker's socket and pidfd, its client's
    connection), so 256 episodes use about 800 and the common default soft limit of 1024 capped a server at about 320
    (bench/capacity.py); the hard limit is usually far higher and raising the soft one needs no privilege."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class SandboxPool:
    """Zygote + warm pool + watchdog. Thread-safe; one instance per server."""

    def __init__(self, settings: SandboxSettings | None = None):
        self.settings = settings or SandboxSettings.from_env()
        self.workdir = tempfile.mkdtemp(prefix="mechsandbox-empty-")
        os.chmod(self.workdir, 0o555)
        self.zygote: ZygoteProcess | None = None
        self.warm: deque[Worker] = deque()
        self.workers: dict[int, Worker] = {}
        self.free_slots = list(range(self.settings.max_workers))
        self.lock = threading.Lock()
        self.refill_wanted = threading.Event()
        self.restart_lock = threading.Lock()
        self.starting = 0  # spawns under way for the warm pool (counted with it against pool_size)
        self.closed = threading.Event()
        self.isolation: dict[str, str] = {}
        self.memory_kills = 0
        self.idle_cpu_kills = 0
        self.zygote_restarts = 0
        self.threads: list[threading.Thread] = []
        self.pids_cgroup: jail.PidsCgroup | None = None
        self.max_loads_behind = MAX_LOADS_BEHIND
        self.loads_behind = 0  # under way now; guarded by behind_lock (not ``lock``: a load takes that)
        self.behind_lock = threading.Lock()
        self.warm_ready = threading.Condition(self.lock)  # notified when a refill spawn ends (``take_worker`` waits)
        # seconds ``take_worker`` waits, every slot taken, for a spawn the refill has under way (15-30 ms idle, far
        # longer on a machine busy with 256 sessions); past it the request fails as at the slot limit
        self.spawn_wait = 30.0

    def claim_load_behind(self) -> bool:
        """One of ``max_loads_behind`` places for a load behind a reset, or False when all are taken."""
        with self.behind_lock:
            if self.loads_behind >= self.max_loads_behind:
                return False
            self.loads_behind += 1
            return True

    def end_load_behind(self) -> None:
        with self.behind_lock:
            self.loads_behind -= 1

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> SandboxPool:
        self.pids_cgroup, pids_detail = jail.PidsCgroup.create(self.settings.max_pids, self.settings.max_workers)
        self.zygote = ZygoteProcess(self.settings, self.workdir, self.pids_cgroup)
        raise_descriptor_limit(4 * self.settings.max_workers + 256)  # after the zygote: workers keep their own limit
        first = self._spawn()
        self.isolation = {**first.isolation, "namespaces": self.zygote.namespaces, "pids_cgroup": pids_detail}
        missing = [layer for layer in self.settings.require if self.isolation.get(layer) != "active"]
        if missing:
            self.close()
            detail = "; ".join(f"{m}: {self.isolation.get(m, 'unknown')}" for m in missing)
            raise SandboxUnavailable(f"required isolation layers are not active ({detail})")
        self.warm.append(first)
        loops = [(self._refill_loop, f"sandbox-refill-{k}") for k in range(self.settings.spawn_parallel)]
        for target, name in (*loops, (self._watchdog_loop, "sandbox-watchdog")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        self.refill_wanted.set()
        return self

    def close(self) -> None:
        self.closed.set()
        self.refill_wanted.set()
        with self.lock:
            workers = list(self.workers.values())
            self.warm.clear()
        for worker in workers:
            worker.kill("the sandbox was shut down")
        with self.restart_lock:  # a refill thread restarting the zygote finishes first, then sees closed
            if self.zygote:
                self.zygote.stop()
        for thread in self.threads:
            thread.join(timeout=2)
        if self.pids_cgroup is not None:
            self.pids_cgroup.remove()
        with contextlib.suppress(OSError):
            os.rmdir(self.workdir)

    def __enter__(self) -> SandboxPool:
        return self.start() if self.zygote is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def healthy(self) -> bool:
        return self.zygote is not None and self.zygote.alive and not self.closed.is_set()

    def status(self) -> dict[str, Any]:
        layers = {layer: self.isolation.get(layer, "unknown") for layer in KNOWN_LAYERS}
        return {
            "healthy": self.healthy(),
            "layers": layers,
            "active": [k for k, v in layers.items() if v == "active"],
            "landlock_abi": self.isolation.get("landlock_abi"),
            "pids_cgroup": self.isolation.get("pids_cgroup"),
            # how the watchdog counts a worker's memory (a memory cgroup per slot, or smaps), and whether each jailed
            # worker has namespaces of its own (IPC, mount, PID): docs/SANDBOX.md, "The jail is the boundary"
            "memory_accounting": getattr(self.zygote, "memory_accounting", "not started"),
            "worker_namespaces": getattr(self.zygote, "worker_namespaces", "not started"),
            "warm_workers": len(self.warm),
            "workers": len(self.workers),
            "loads_behind": self.loads_behind,
            "memory_kills": self.memory_kills,
            "idle_cpu_kills": self.idle_cpu_kills,
            "zygote_restarts": self.zygote_restarts,
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "test_unrestricted"},
        }

    # --- workers -------------------------------------------------------------------------------

    def _spawn(self) -> Worker:
        if self.zygote is None or self.closed.is_set():
            raise SandboxUnavailable("the sandbox is not running")
        with self.lock:
            if not self.free_slots:
                raise SandboxUnavailable(f"all {self.settings.max_workers} sandbox workers are in use")
            slot = self.free_slots.pop(0)
        try:
            worker = self.zygote.spawn(slot)
        except SandboxUnavailable:
            with self.lock:
                self.free_slots.append(slot)
            raise
        with self.lock:
            if not self.closed.is_set():
                self.workers[worker.pid] = worker
                return worker
            self.free_slots.append(slot)
        worker.kill("the sandbox was shut down")  # close() ran during this spawn and did not see it
        raise SandboxUnavailable("the sandbox is not running")

    def take_worker(self) -> Worker:
        """A ready, hardened worker without a model (from the warm pool when one is there).

        When every slot is taken but the warm pool's refill has spawns under way, this waits for one of them (up to
        ``spawn_wait`` seconds) instead of failing: at the slot limit, the last resets of a burst found no free slot
        while the slots they needed held workers being made for the warm pool."""
        while True:
            with self.lock:
                if not self.warm and not self.free_slots and self.starting:
                    self.warm_ready.wait_for(lambda: self.warm or not self.starting or self.closed.is_set(),
                                             timeout=self.spawn_wait)  # fmt: skip
                worker = self.warm.popleft() if self.warm else None
            self.refill_wanted.set()
            if worker is None:
                worker = self._spawn()
                break
            if worker.alive and not worker.exited():
                break
            self.release(worker, worker.dead_reason or "the worker died in the warm pool")  # e.g. with its zygote
        return worker

    def release(self, worker: Worker, reason: str = "the session ended") -> None:
        worker.kill(reason)
        with self.lock:
            if self.workers.get(worker.pid) is worker:  # not a later worker that was given the same pid
                del self.workers[worker.pid]
                self.free_slots.append(worker.slot)
                freed = True
            else:
                freed = False
        if freed:  # a warm pool that stopped at the slot limit refills now rather than at its next timed look
            self.refill_wanted.set()

    def _restart_zygote(self) -> None:
        """A dead zygote takes its workers with it (parent-death signal); start a new one."""
        log.error("the sandbox zygote died (exit code %s); restarting it", self.zygote.process.poll())
        with self.lock:
            orphans = list(self.warm)
            self.warm.clear()
        for worker in orphans:  # they died with it (parent-death signal): free their slots and descriptors
            self.release(worker, "the sandbox zygote died")
        self.zygote.stop()
        try:
            self.zygote = ZygoteProcess(self.settings, self.workdir, self.pids_cgroup)
            self.zygote_restarts += 1
        except SandboxUnavailable as exc:
            log.error("sandbox zygote restart failed: %s", exc)
            time.sleep(1.0)

    def _refill_loop(self) -> None:
        """One of ``spawn_parallel`` refill threads. Why several: under load a spawn spends most of its time
        waiting for CPU (the zygote's fork, the new worker's hardening and warm-up), so one thread that waits for
        each spawn in turn fell behind 8 sessions playing short episodes (docs/PERFORMANCE.md, "RL load");
        spawns in flight count against ``pool_size`` with the warm workers, so the pool never overshoots."""
        while not self.closed.is_set():
            self.refill_wanted.wait(timeout=1.0)
            self.refill_wanted.clear()
            if self.zygote is not None and not self.zygote.alive and not self.closed.is_set():
                with self.restart_lock:  # one refill thread restarts it; the others find it alive after
                    if not self.zygote.alive and not self.closed.is_set():
                        self._restart_zygote()
            while not self.closed.is_set():
                with self.lock:
                    # every slot taken (live sessions hold them all): nothing to refill until one is released
                    if len(self.warm) + self.starting >= self.settings.pool_size or not self.free_slots:
                        break
                    self.starting += 1
                worker = None
                try:
                    worker = self._spawn()
                except SandboxUnavailable as exc:
                    if not self.closed.is_set():  # a spawn that races close() is expected to fail
                        log.warning("sandbox refill failed: %s", exc)
                finally:
                    with self.lock:  # the worker joins the pool as its spawn stops counting: a waiter sees one or other
                        self.starting -= 1
                        if worker is not None:
                            self.warm.append(worker)
                        self.warm_ready.notify_all()
                if worker is None:
                    time.sleep(0.5)
                    break

    def _watchdog_loop(self) -> None:
        """Every ``watchdog_interval``: count each worker's memory (its slot's memory cgroup, else its maps: shared
        memory included either way, ``memory.py``) and kill the largest while the pool is over its budget. A worker
        promises each session ``worker_memory_mb``: a worker killed below that was lost because the pool admitted more
        than the budget holds, so its kill is the server's fault (``server_fault``), not the snippet's."""
        budget = self.settings.budget_bytes()
        promised = self.settings.worker_memory_mb * 1024 * 1024
        while not self.closed.wait(self.settings.watchdog_interval):
            with self.lock:
                workers = list(self.workers.values())
            zygote = self.zygote
            memcg = zygote.memory_cgroup if zygote is not None else None
            usage = {w: memory.worker_memory(memcg, w.slot, w.pid, w.isolation) for w in workers if w.alive}
            for worker in workers:
                if worker.alive and worker.exited():
                    worker.dead_reason = "the worker process died (crash or forced exit)"
            if sum(usage.values()) > budget and usage:
                largest = max(usage, key=usage.__getitem__)
                self.memory_kills += 1
                log.warning("memory budget exceeded: killing worker %d (%d MiB)", largest.pid, usage[largest] >> 20)
                largest.kill("memory budget exceeded; namespace reset", server_fault=usage[largest] <= promised)
            for worker in workers:
                self._check_idle_cpu(worker)

    def _check_idle_cpu(self, worker: Worker) -> None:
        """Kill a worker that used more than ``IDLE_CPU_SECONDS`` of CPU while no request was in flight, counted from
        the watchdog's first look at this idle spell (so at most one poll interval after a reply goes uncounted)."""
        with worker.state_lock:
            if not worker.alive or worker.busy:
                return
            requests = worker.requests
        used = worker.cpu_seconds()
        if used is None:
            return
        with worker.state_lock:  # killed under the lock: a request cannot start in between and be the one killed
            if worker.busy or worker.requests != requests or not worker.alive:
                return
            if worker.idle_mark is None or worker.idle_mark[0] != requests:
                worker.idle_mark = (requests, used)  # a new idle spell: its baseline
                return
            spent = used - worker.idle_mark[1]
            if spent <= IDLE_CPU_SECONDS:
                return
            self.idle_cpu_kills += 1
            log.warning("worker %d used %.1f s of CPU between requests; killing it", worker.pid, spent)
            worker.kill("the worker ran code between requests; namespace reset")

    # --- sessions ------------------------------------------------------------------------------

    def open_session(self, payload: ModelPayload, behind: bool = False) -> SandboxSession:
        """A session holding ``payload``; with ``behind`` the worker is taken and loaded on a thread of its own
        while the caller goes on (the server's resets: see ``SandboxSession``)."""
        return SandboxSession(self, payload, behind)


class SandboxSession:
    """One episode's namespace: a worker holding the public model, replaced when it is lost.

    Loaded ``behind`` (what the server's resets do), the session returns at once and a thread of its own takes a
    worker and loads the model, holding the session's lock until it is done, so the first snippet or submission waits
    for the load and nothing ever sees a half-loaded session; a close does not wait (an episode that ends or is
    replaced before its first step): the loading thread frees the worker when its load ends. Why: a reset needs only
    the instance to answer (its prompt and schema); the load (5-13 ms idle, several times that while 8 sessions
    compute, and a spawn when no warm worker is left) then overlaps the client's own work, an agent's first generation
    in an RL loop (docs/PERFORMANCE.md, "Resets that load behind"). A load that fails behind is tried again by the
    first use, which reports it (``SandboxUnavailable``) if it fails again. At most ``MAX_LOADS_BEHIND`` are under way
    at once; past that a reset loads before it answers, as a counted episode's always does (``Service``).
    """

    def __init__(self, pool: SandboxPool, payload: ModelPayload, behind: bool = False):
        self.pool, self.payload = pool, payload
        self.worker: Worker | None = None
        self.lock = threading.Lock()
        self.resets = 0
        self.closed = False
        self.loading = False  # a load behind is under way; with ``closed``, guarded by ``_state``
        self._state = threading.Lock()
        if behind and pool.claim_load_behind():  # past MAX_LOADS_BEHIND a reset waits for its load
            try:
                self._start_load_behind()
                return
            except RuntimeError:  # no thread to be had: load here instead
                pass
        self._ensure_worker()

    def _start_load_behind(self) -> None:
        """Start the loading thread, which holds ``lock`` and the pool's claim until the load ends; if it cannot start,
        both are given back before the error goes on."""
        self.lock.acquire()  # released by the loading thread (a Lock may be released by any thread)
        self.loading = True
        try:
            threading.Thread(target=self._load_behind, name="sandbox-load", daemon=True).start()
        except BaseException:
            self.loading = False
            self.pool.end_load_behind()
            self.lock.release()
            raise

    def _load_behind(self) -> None:
        try:
            self._ensure_worker()
        except SandboxUnavailable as exc:  # the first use tries again and reports what it meets then
            if not self.closed and not self.pool.closed.is_set():  # not a session or a server that is stopping
                log.warning("a sandbox session's model could not be loaded ahead of its first use: %s", exc)
        except Exception:  # a thread of our own: log what nobody would see, the first use tries again
            log.exception("loading a sandbox session's model failed")
        finally:
            with self._state:
                self.loading = False
                closed = self.closed
            try:
                if closed:  # closed during the load, which left the worker to this thread
                    self._drop_worker_on_close()
            finally:
                try:
                    self.pool.end_load_behind()
                finally:
                    self.lock.release()

    def _ensure_worker(self) -> bool:
        """Give the session a loaded worker; True when a previous one was lost (namespace reset)."""
        if self.closed:
            raise SandboxUnavailable("this sandbox session is closed")
        if self.worker is not None and self.worker.alive:
            return False
        lost = self.worker is not None
        if lost:
            self.pool.release(self.worker, self.worker.dead_reason or "lost")
            self.resets += 1
        worker = self.pool.take_worker()
        if self.closed:  # closed while a load behind waited for its worker: no model for a session nobody uses
            self.pool.release(worker, "its session was closed")
            raise SandboxUnavailable("this sandbox session is closed")
        try:
            payload = self.payload
            fd = payload.reader()  # the sealed file goes as a read-only descriptor of its own
            try:
                blob = b"" if fd is not None else payload.blob
                reply = worker.request({"op": "load", **payload.header}, 60.0, self.pool.settings, blob, fd)
            finally:
                if fd is not None:
                    os.close(fd)
        except WorkerLost as exc:
            self.pool.release(worker)
            raise SandboxUnavailable(f"the model could not be loaded into a sandbox worker: {exc.reason}") from None
        except BaseException:  # anything else (the descriptor could not be opened...): the slot is not kept
            self.pool.release(worker, "its load failed")
            raise
        if reply.get("error"):
            self.pool.release(worker)
            raise SandboxUnavailable(f"the model could not be loaded: {reply['error']}")
        self.worker = worker
        return lost

    def _drop_worker(self) -> None:
        """Release a worker whose loss this step already reported (so the next step is not flagged again)."""
        if self.worker is not None:
            self.pool.release(self.worker, self.worker.dead_reason or "lost")
            self.worker = None
            self.resets += 1

    def run(self, code: str) -> RunResult:
        """Run one snippet under its CPU-time limit (``wall_seconds``, a historical name) and the wall-clock backstop:
        the worker's own timer stops it a little before the limit with a readable ``TimeoutError`` and the namespace
        kept; the server kills it at the limit (namespace reset)."""
        limit = self.pool.settings.wall_seconds
        with self.lock:
            self._notice_dead_worker()
            lost_reason = self.worker.dead_reason if self.worker is not None else None
            reset_before = self._ensure_worker()
            assert self.worker is not None
            zygote, restarts = self.pool.zygote, self.pool.zygote_restarts
            try:
                message = {"op": "run", "code": code, "soft_timeout": soft_timeout(limit)}
                reply = self.worker.request(message, limit, self.pool.settings)
            except WorkerLost as exc:
                self._drop_worker()
                loss = self._loss(exc, zygote, restarts)
                error = f"{loss.reason}; namespace reset"
                return RunResult(stdout="", error=error, namespace_reset=True, server_fault=loss.server_fault)
        return RunResult(
            stdout=str(reply.get("stdout", "")),
            error=reply.get("error"),
            output_truncated=bool(reply.get("output_truncated")),
            namespace_reset=reset_before,
            seconds=float(reply.get("seconds", 0.0)),
            notice=f"{lost_reason}; namespace reset before this snippet" if reset_before else None,
        )

    def _notice_dead_worker(self) -> None:
        """Mark a worker that died between requests (with its zygote, or killed before the watchdog's next look), so
        that the next request goes to a fresh worker (a namespace reset before it) instead of losing its step."""
        worker = self.worker
        if worker is not None and worker.alive and worker.exited():
            worker.kill("the worker process died (crash or forced exit)")

    def _loss(self, exc: WorkerLost, zygote: ZygoteProcess | None, restarts: int) -> WorkerLost:
        """What a worker lost during a request reports: the server's doing when its killer said so (``Worker.kill``)
        or when the pool shut down or the zygote died (its workers die with it) while the request ran."""
        pool = self.pool
        if exc.server_fault:
            return exc
        if pool.closed.is_set():
            return WorkerLost("the sandbox was shut down", server_fault=True)
        if pool.zygote is not zygote or pool.zygote_restarts != restarts or (zygote is not None and not zygote.alive):
            return WorkerLost("the sandbox's zygote died and took the worker with it", server_fault=True)
        return exc

    def solution_from(self, name: str) -> Solution:
        """(answer, None) or (None, error): the variable converted in the worker, re-validated here; the pair's
        ``server_fault`` says whether a lost worker was the server's doing (as ``RunResult.server_fault``)."""
        with self.lock:
            self._notice_dead_worker()
            self._ensure_worker()
            assert self.worker is not None
            zygote, restarts = self.pool.zygote, self.pool.zygote_restarts
            try:
                settings = self.pool.settings
                reply = self.worker.request({"op": "solution", "name": name}, settings.wall_seconds, settings)
            except WorkerLost as exc:
                self._drop_worker()
                loss = self._loss(exc, zygote, restarts)
                return Solution(None, f"{loss.reason}; namespace reset", loss.server_fault)
        if reply.get("error") or "value" not in reply:
            return Solution(None, str(reply.get("error") or "no value"))
        try:
            return Solution(check_json_value(reply["value"]), None)
        except AnswerError as exc:
            return Solution(None, str(exc))

    def unrestricted(self, code: str) -> dict[str, Any]:
        """Test-only (``test_unrestricted`` pools): plain Python in the hardened worker, under the snippets' limits
        but without the worker's own soft timer. A lost worker raises ``WorkerLost`` with its ``server_fault``."""
        with self.lock:
            self._ensure_worker()
            assert self.worker is not None
            settings = self.pool.settings
            zygote, restarts = self.pool.zygote, self.pool.zygote_restarts
            try:
                return self.worker.request({"op": "unrestricted", "code": code}, settings.wall_seconds, settings)
            except WorkerLost as exc:
                raise self._loss(exc, zygote, restarts) from None

    @property
    def pid(self) -> int | None:
        with self.lock:  # after a load under way behind
            return self.worker.pid if self.worker else None

    def close(self) -> None:
        with self._state:
            self.closed = True
            if self.loading:  # the loading thread frees the worker when its load ends (``_load_behind``)
                return
        with self.lock:
            self._drop_worker_on_close()

    def _drop_worker_on_close(self) -> None:
        """Free the worker of a closed session; the caller holds ``lock``."""
        if self.worker is not None:
            self.pool.release(self.worker)
            self.worker = None
