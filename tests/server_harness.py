"""Start a real MechSandbox server (``mechsandbox serve``) in a subprocess for wire-level tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import httpx
from mechsandbox.evaluation.local_server import LocalServer, free_port

__all__ = ["children", "cmdline", "free_port", "running_server"]


class RunningServer(LocalServer):
    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def zygote_pid(self) -> int:
        return next(pid for pid in children(self.process.pid) if b"sandbox.zygote" in cmdline(pid))


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def children(pid: int) -> list[int]:
    """Live (non-zombie) children of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid and not fields.get("State", "").startswith("Z"):
            out.append(int(entry))
    return out


@contextlib.contextmanager
def running_server(tmp_path, **env: str) -> Iterator[RunningServer]:
    server = RunningServer(env={"MECHSANDBOX_POOL_SIZE": "2", **env}, log_path=tmp_path / "server.log", startup_s=90)
    with server:
        yield server
