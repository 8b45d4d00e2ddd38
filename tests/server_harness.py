"""Start a real MechSandbox server (``mechsandbox serve``) in a subprocess for wire-level tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, process: subprocess.Popen, port: int, log_path: str):
        self.process, self.port, self.log_path = process, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def zygote_pid(self) -> int:
        health_children = children(self.process.pid)
        return next(pid for pid in health_children if b"sandbox.zygote" in cmdline(pid))


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def children(pid: int) -> list[int]:
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
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    environ = {**os.environ, "MECHSANDBOX_HOST": "127.0.0.1", "MECHSANDBOX_PORT": str(port),
               "MECHSANDBOX_POOL_SIZE": "2", "MECHSANDBOX_LOG_LEVEL": "warning", **env}  # fmt: skip
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mechsandbox.cli", "serve"], env=environ, stdout=log, stderr=subprocess.STDOUT
        )
    server = RunningServer(process, port, log_path)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {server.log()[-2000:]}")
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"server did not become healthy: {server.log()[-2000:]}")
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
