"""The zygote: a clean, secret-free process that preloads everything and forks workers on request.

The server starts it with ``subprocess`` (fork+exec of a fresh interpreter, never a fork of the
server), with a scrubbed environment, and talks to it over a SOCK_SEQPACKET control socket. It
imports torch, numpy, RestrictedPython, the facades and the public model classes
(``mechsandbox.arch``; never a task family), warms up every registered architecture (``warmup.py``)
so lazy imports and first-call initialisation happen before any worker is sandboxed, calls
``gc.freeze()`` (so copy-on-write pages stay shared), and then answers ``spawn`` requests: for each
it makes a socketpair, forks, hands the worker one end and passes the other end back to the server
with SCM_RIGHTS. It never sees a seed, a truth or a test salt.

In the jail (``jail.py``) the zygote is PID 1 of its own PID namespace and the pids it sees mean
nothing on the host. The server's end of each worker socket therefore has SO_PASSCRED set here,
before the fork, so the kernel attaches the worker's pid, translated into the server's namespace,
to everything the worker sends: the server learns host pids from the kernel, never from this
process or the worker. The pid in the spawn reply is informational (checked against NSpid at the zygote's level).

Each worker is born in a PID namespace of its own (PID 1 there, alone: ``worker_ns.spawn_child``) and enters IPC and
mount namespaces of its own right after the fork (``worker_ns.enter_private_namespaces``), so an escaped worker sees no
other session's process, shared memory or files, and everything it made dies with it.

Run as ``python -I -m mechsandbox.server.sandbox.guest.zygote '<json config>'``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    from .hardening import HardeningConfig, library_paths, set_parent_death_signal

    if config["parent"] is not None:  # in the jail, bwrap's --die-with-parent and PID 1 do this job
        set_parent_death_signal(int(config["parent"]))
    control = socket.socket(fileno=int(config["fd"]))

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from . import seccomp, worker, worker_ns
    from .facade import build_facades
    from .warmup import WARM_UP, warm_up, warm_up_payloads

    seccomp.available()  # resolve libseccomp now: a hardened worker cannot run find_library's helpers
    facades = build_facades()
    payloads = warm_up_payloads()
    warm_up(facades, payloads, WARM_UP)
    baseline = _vm_size()
    # in the jail each worker gets IPC and mount namespaces of its own (worker_ns.py); a throwaway child checks once
    # that the kernel allows them here (before SIGCHLD is ignored below: the probe waits for its child)
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # each worker closes it first thing
    own_namespaces = (
        worker_ns.probe(own_pid_namespace, config["hardening"]["workdir"])
        if config["worker_namespaces"]
        else "skipped: the zygote is not jailed"
    )
    private = own_namespaces.startswith("active")  # IPC and mount namespaces of its own (and a PID one, if "active")
    own_pid = own_namespaces == "active"
    hard = dict(config["hardening"])
    if private:
        hard["own_namespaces"] = True
    hard["address_space"] = baseline + int(config["worker_memory"])
    hard["read_paths"] = tuple(library_paths())
    cfg = HardeningConfig(**hard)
    limits = config["limits"]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    gc.collect()
    gc.freeze()
    ready = {"ready": True, "pid": os.getpid(), "address_space": cfg.address_space, "worker_namespaces": own_namespaces}
    control.send(json.dumps(ready).encode())
    while True:
        try:
            request = control.recv(65536)
        except OSError:
            break
        if not request:
            break
        message = json.loads(request)
        if message.get("op") != "spawn":
            continue
        slot = int(message["slot"])
        server_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        pid = worker_ns.spawn_child(own_pid, own_pid_namespace)
        if pid == 0:
            control.close()
            server_end.close()
            if private:
                try:
                    worker_ns.enter_private_namespaces(cfg.workdir, own_pid)  # its own /tmp keeps an empty workdir
                except OSError:
                    os._exit(70)  # never a worker that shares what it should not: the spawn fails instead
            worker.serve(worker_end, slot, cfg, os.getppid(), facades, limits, payloads)
            os._exit(0)
        worker_end.close()
        socket.send_fds(control, [json.dumps({"pid": pid, "slot": slot}).encode()], [server_end.fileno()])
        server_end.close()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
