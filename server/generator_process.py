"""Instances generated ahead in a child process, so that generation never holds the server's interpreter.

Why: the prefetcher (``prefetch.py``) keeps pools of fresh instances full while sessions step. Generation is
mostly Python around small torch calls, and in the server process it holds the GIL for up to 5 ms at a time
(Python's switch interval) against the threads that answer resets and steps: on 2 cores with 8 sessions playing,
every hand-off of a request between the event loop and its worker thread could wait that long. A child process has
its own interpreter; the kernel shares the CPU, and the prefetcher's duty cycle (``prefetch_cpu_share``) still
bounds how much it takes.

What crosses the pipe is what a reset needs and nothing the child could not make: the instance without its model
(pickled: truth, probe, prompt, answer schema), the payload header and the model's safetensors bytes. The server
writes the bytes once into the sealed file a reset hands to workers (``sandbox/sealed.py``) and builds its own copy
of the model over a private mapping of that same file (``arch.build_with``): the instance is the on-demand one,
bit for bit (tests/test_prefetch.py compares bytes, truth and every weight).

The child is started at the first job (``python -I -m mechsandbox.server.generator_process`` with an allowlisted
environment: torch and the families import in a few seconds) with the server's torch thread count, so the bytes do
not depend on where an instance was generated. If it dies, the call raises ``BuilderGone`` and the prefetcher
stops with one log line; seedless resets then generate on demand. The cache misses' children
(``generator_pool.py``) are the same class, started ahead with ``start`` and used once ``ready`` (the child says so
when its imports are done), so that no miss waits for one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import safetensors.torch
import torch

from ..arch import build_with, split_public_tensors
from .instance_cache import CachedInstance
from .prefetch import BuilderGone
from .sandbox.payload import ModelPayload
from .sandbox.sealed import SealedBlob, map_tensors

IDLE_TRIM_S = 1.0  # a child with no job for this long trims its heap


def _serve(conn: Connection, threads: int) -> None:
    """The child: say it is ready (torch and the families imported), then generate each (task, seed, level) it is
    sent, until the pipe closes."""
    torch.set_num_threads(threads)
    from ..tasks import get_family

    trim = _malloc_trim()
    conn.send(("ready",))
    while True:
        try:
            if not conn.poll(IDLE_TRIM_S):
                trim()  # idle: hand the last generations' heap back, then wait
            task_id, seed, level = conn.recv()
        except (EOFError, OSError):
            return
        try:
            inst = get_family(task_id).generate(seed, level)
            payload = ModelPayload.from_instance(inst, sealed=False)
            bare = pickle.dumps(dataclasses.replace(inst, model=None), protocol=pickle.HIGHEST_PROTOCOL)
            reply: tuple[Any, ...] = ("ok", bare, payload.header, payload.blob)
            del inst, payload, bare
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)
        del reply


def _malloc_trim() -> Callable[[], object]:
    """Give the heap the last generations left behind back to the kernel (called once the child is idle).

    Why: glibc keeps freed memory for reuse, so a child that generated a few hard transformers held about 365 MiB
    private where it holds 175 after a trim (torch and the families imported: about 150); a server runs up to three
    children (``generators`` and the prefetcher's). Trimmed after every job, each next generation would pay tens of
    ms of page faults for its temporaries, so a busy child keeps its heap and one idle for ``IDLE_TRIM_S`` trims.
    A libc without ``malloc_trim`` (musl) keeps its memory."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class GeneratorProcess:
    """A ``Prefetcher`` build function that generates in one child process (started on first use)."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or torch.get_num_threads()
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._process: subprocess.Popen | None = None
        self._hello = False  # started, its ("ready",) not read yet
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __call__(self, task_id: str, seed: int, level: str) -> CachedInstance:
        with self._lock:
            if self._closed:
                raise BuilderGone("the generator process was closed")
            if self._conn is None:
                self._start()
            assert self._conn is not None
            try:
                if self._hello:
                    self._conn.recv()  # waits for the imports of a child just started
                    self._hello = False
                self._conn.send((task_id, seed, level))
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                code = self._process.poll() if self._process is not None else None
                self._close()
                raise BuilderGone(f"the generator process ended (exit code {code}): {type(exc).__name__}") from None
        if reply[0] != "ok":
            raise RuntimeError(reply[1])
        _, bare, header, blob = reply
        return rebuild(pickle.loads(bare), header, blob)

    def start(self) -> None:
        """Start the child now without waiting for it (``ready`` says when it has imported everything)."""
        with self._lock:
            if self._conn is None and not self._closed:
                self._start()

    def ready(self) -> bool:
        """Started and done importing, so a job sent now is generated at once. Raises ``BuilderGone`` if the child
        ended before it was ready; call it only while no job is under way."""
        with self._lock:
            if self._conn is None:
                return False
            if self._hello:
                try:
                    if not self._conn.poll(0):
                        return False
                    self._conn.recv()
                except (EOFError, OSError) as exc:
                    code = self._process.poll() if self._process is not None else None
                    self._close()
                    raise BuilderGone(f"the generator process ended before it was ready (exit code {code}): "
                                      f"{type(exc).__name__}") from None  # fmt: skip
                self._hello = False
            return True

    def _start(self) -> None:
        # a fresh interpreter (never a fork of the server: its threads, sockets and secrets stay behind), started
        # as a module rather than through multiprocessing's spawn, which would re-import the server's __main__
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with child:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-m", "mechsandbox.server.generator_process", str(child.fileno()),
                 str(self.threads)],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=child_environment(),
            )  # fmt: skip
        self._conn = Connection(parent.detach())
        self._hello = True

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:  # it exits when its pipe closes; a generation under way is not waited for
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def close(self) -> None:
        """End the child now, even mid-generation (the call waiting on it raises ``BuilderGone``); none starts again.
        Killed before the lock is taken, so a server stopping never waits for an instance it will not serve."""
        self._closed = True
        process = self._process
        if process is not None:
            process.kill()
        with self._lock:
            self._close()


ENV_KEPT = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "ATEN_CPU_CAPABILITY")
# the CPU's BLAS settings, thread counts and torch's own switches: what torch loads and which kernels it picks must be
# the server's, or the bytes could depend on where an instance was generated
ENV_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "KMP_", "TORCH_", "PYTORCH_")


def child_environment() -> dict[str, str]:
    """The child's environment: an allowlist. It never needs the server's tokens, salt or database URL, so it never
    holds them; ``-I`` keeps ``PYTHON*`` variables and the current folder out of its imports."""
    return {k: v for k, v in os.environ.items() if k in ENV_KEPT or k.startswith(ENV_PREFIXES)}


def rebuild(bare: Any, header: dict[str, Any], blob: bytes) -> CachedInstance:
    """The instance and payload from what the child sent: the bytes go into the sealed file once, and the server's
    model is built over a private mapping of it (eval mode, as every generator returns it)."""
    sealed = SealedBlob.create(blob)
    payload = ModelPayload(header, sealed or blob)
    state, _ = split_public_tensors(map_tensors(sealed.fd) if sealed is not None else safetensors.torch.load(blob))
    model = build_with(header["arch"], state).eval()
    return CachedInstance(dataclasses.replace(bare, model=model), payload)


if __name__ == "__main__":  # python -m mechsandbox.server.generator_process <socket fd> <torch threads>
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
