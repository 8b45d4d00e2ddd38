"""Start a MechSandbox server in a subprocess on a free local port (for ``inference.py`` and
``mechsandbox eval`` when no URL is given, and for the tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``with LocalServer() as server: ... server.url``; SIGTERM (graceful) on exit."""

    def __init__(self, env: dict[str, str] | None = None, log_path: str | Path | None = None, startup_s: float = 120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.log_path = Path(log_path) if log_path else None
        self.startup_s = startup_s
        self.process: subprocess.Popen | None = None
        self._log: IO | int = subprocess.DEVNULL

    def start(self) -> LocalServer:
        environ = {**os.environ, "MECHSANDBOX_HOST": "127.0.0.1", "MECHSANDBOX_PORT": str(self.port),
                   "MECHSANDBOX_LOG_LEVEL": "warning", **self.extra_env}  # fmt: skip
        if self.log_path:
            self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([sys.executable, "-m", "mechsandbox.cli", "serve"], env=environ,
                                        stdout=self._log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.time() + self.startup_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the local server exited with status {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the local server did not become healthy within {self.startup_s:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not isinstance(self._log, int):
            self._log.close()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
