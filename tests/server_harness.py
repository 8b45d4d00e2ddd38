"""Start a real MechSandbox server (``mechsandbox serve``) in a subprocess for wire-level tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from mechsandbox.evaluation.local_server import LocalServer, free_port
from mechsandbox.evaluation.procfs import children, cmdline, is_gone, zygote_of

__all__ = ["children", "cmdline", "free_port", "is_gone", "running_server"]


class RunningServer(LocalServer):
    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def zygote_pid(self) -> int:
        return zygote_of(self.process.pid)


@contextlib.contextmanager
def running_server(tmp_path, **env: str) -> Iterator[RunningServer]:
    server = RunningServer(env={"MECHSANDBOX_POOL_SIZE": "2", **env}, log_path=tmp_path / "server.log", startup_s=90)
    with server:
        yield server
