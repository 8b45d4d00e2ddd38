"""The worker loop: harden, announce the isolation report, then serve frames until the pipe closes.

A worker is forked from the zygote, so torch, numpy, the facades and the public model classes
(``mechsandbox.arch``) are already in memory (copy-on-write) and spawning costs milliseconds. It
holds one session's namespace. It never writes to fds 1 and 2 (both are /dev/null) and it exits with
``os._exit`` so that nothing inherited from the zygote (atexit handlers, buffered files) runs.

Threads a snippet starts must not outlive its step (issue #13: one worker had 800 threads alive at
the next step). Python cannot stop a thread, so after each snippet the worker counts its OS threads
(the link count of ``/proc/self/task`` is 2 plus the threads; Landlock does not govern ``stat``)
against the count it had when it became ready; if some are still there after a short grace period,
the reply carries ``retire``, the worker exits, and the session continues in a fresh worker
(``namespace_reset``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any

from ..frames import MAX_REPLY, recv_frame_fd, send_frame
from ..payload import ModelPayload
from .facade import Facade
from .hardening import HardeningConfig, harden
from .runtime import Runtime
from .warmup import warm_up

MAX_REQUEST_JSON = 1024 * 1024
MAX_MODEL_BYTES = 512 * 1024 * 1024
THREAD_GRACE_SECONDS = 0.05  # a joined thread may take a moment to leave the kernel's task list


def _reply(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False)
    if len(data) > MAX_REPLY:
        message = {"error": f"the result is larger than the {MAX_REPLY}-byte frame limit"}
    send_frame(sock, message)


def serve(
    sock: socket.socket,
    slot: int,
    cfg: HardeningConfig,
    parent: int,
    facades: dict[str, Facade],
    limits: dict[str, Any],
    warm_up_payloads: list[ModelPayload] | None = None,
) -> None:
    """Never returns: hardens this process, then answers requests until EOF."""
    try:
        report = harden(cfg, slot, sock.fileno(), parent)
        runtime = Runtime(facades, output_cap=limits["output_cap"], error_cap=limits["error_cap"])
        warm_up(facades, warm_up_payloads or [], None)  # pre-fault a first load while waiting in the pool
        own_threads = _threads()
        send_frame(sock, {"isolation": report})
        while True:
            message, blob, fd = recv_frame_fd(sock, MAX_REQUEST_JSON, MAX_MODEL_BYTES)
            reply = handle(runtime, message, blob, limits, fd)
            extra = _extra_threads(own_threads) if message.get("op") in ("run", "unrestricted") else 0
            if extra:
                reply["retire"] = f"the snippet left {extra} thread(s) running"
            _reply(sock, reply)
            if extra:
                break
    except BaseException:  # EOF, a broken pipe or anything else: never fall back into zygote code
        pass
    os._exit(0)


def _threads() -> int:
    return os.stat("/proc/self/task").st_nlink - 2


def _extra_threads(own: int) -> int:
    """OS threads beyond the worker's own, after a short grace period for threads that are ending."""
    deadline = time.monotonic() + THREAD_GRACE_SECONDS
    while True:
        extra = _threads() - own
        if extra <= 0 or time.monotonic() > deadline:
            return max(extra, 0)
        time.sleep(0.002)


def handle(
    runtime: Runtime, message: dict[str, Any], blob: bytes, limits: dict[str, Any], fd: int | None = None
) -> dict[str, Any]:
    """One request's reply. ``fd``: a sealed model file sent with a load (the runtime keeps it); with any other
    request it is closed unread."""
    op = message.get("op")
    if fd is not None and op != "load":
        os.close(fd)
        fd = None
    if op == "run":
        code = message.get("code")
        if not isinstance(code, str):
            return {"error": "python_code must be a string"}
        return runtime.run(code, soft_timeout=message.get("soft_timeout"))
    if op == "load":
        try:
            runtime.load(message, blob, fd)
        except (KeyError, TypeError, ValueError, RuntimeError, OSError) as exc:  # a malformed record or state dict
            return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        _yield_priority(limits.get("snippet_nice", 0))
        return {"ok": True}
    if op == "solution":
        return runtime.solution(message.get("name"))
    if op == "unrestricted" and limits.get("test_unrestricted"):
        return _unrestricted(message.get("code", ""))
    return {"error": f"unknown operation {op!r}"}


def _yield_priority(nice: int) -> None:
    """From its first load on, the worker's main thread, which runs the snippets (threads a snippet starts inherit
    it), runs at ``nice`` (never back: raising one's own priority needs a capability the worker does not have; Linux
    sets it per thread, and the worker has no other busy thread). Why: on a machine busy with snippets, a reset is
    the server's request handling plus a load into a fresh worker, all at nice 0, against every session's snippets;
    the scheduler then gives the reset's work about four times the snippets' weight (nice 5), while snippets still
    share the CPU fairly among themselves. The load itself, which a reset waits for, ran before this."""
    if nice > 0:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))


def _unrestricted(code: str) -> dict[str, Any]:
    """Plain ``exec`` with real builtins: only for the escape test suite (a pool flag servers never set).

    It shows what the process layer alone stops, as if the language and facade layers had both failed.
    """
    namespace: dict[str, Any] = {}
    try:
        exec(code, namespace)
    except BaseException as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "result": None}
    result = namespace.get("result")
    return {
        "error": None,
        "result": result if isinstance(result, str | int | float | bool | list | dict) else repr(result),
    }
