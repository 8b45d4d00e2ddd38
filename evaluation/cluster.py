"""Replicas behind HAProxy on loopback: ``mechsandbox serve`` processes and Debian's ``haproxy`` running the
configuration ``deploy/`` ships (``loadbalancer.haproxy_config``), for tests/test_scale_out.py and
bench/scale_out.py.

Why real processes: what scale-out must get right (an HTTP ``/step`` reaching the replica that holds its
episode, a dead replica failing only its own sessions, the health check taking it out) lives in the balancer
and in the network between processes, which an in-process fake would not exercise.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from ..loadbalancer import Replica, haproxy_config
from .local_server import LocalServer, free_port


class LocalCluster:
    """``with LocalCluster(2, env) as cluster: cluster.url`` (the balancer), ``cluster.servers[k]`` (replica
    ``r{k+1}``). ``env`` goes to every replica (a shared ``MECHSANDBOX_DATABASE_URL`` and ``MECHSANDBOX_TEST_SALT``
    are what make them one deployment)."""

    def __init__(self, replicas: int, env: dict[str, str] | None = None, check_s: float = 0.5,
                 log_dir: str | Path | None = None):  # fmt: skip
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(haproxy).exists():
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
        self.haproxy_bin = haproxy
        self.folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="mechsandbox-cluster-"))
        self.servers = [LocalServer(env={**(env or {}), "MECHSANDBOX_REPLICA_ID": f"r{k + 1}"},
                                    log_path=self.folder / f"r{k + 1}.log") for k in range(replicas)]  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.check_s = check_s
        self.balancer: subprocess.Popen | None = None

    def config(self) -> str:
        replicas = [Replica(f"r{k + 1}", f"127.0.0.1:{s.port}") for k, s in enumerate(self.servers)]
        return haproxy_config(replicas, bind=f"127.0.0.1:{self.port}", check_s=self.check_s)

    def start(self) -> LocalCluster:
        try:
            for server in self.servers:
                server.start()
            path = self.folder / "haproxy.cfg"
            path.write_text(self.config())
            log = open(self.folder / "haproxy.log", "w")  # noqa: SIM115 - the child keeps it; closed with the folder
            self.balancer = subprocess.Popen([self.haproxy_bin, "-db", "-f", str(path)], stdout=log,
                                             stderr=subprocess.STDOUT)  # fmt: skip
            self.wait_routable(len(self.servers))
        except BaseException:
            self.stop()
            raise
        return self

    def wait_routable(self, replicas: int, limit_s: float = 30.0) -> None:
        """Until the balancer answers and has seen ``replicas`` distinct replicas answer ``/health``."""
        seen: set[str] = set()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.balancer is not None and self.balancer.poll() is not None:
                raise RuntimeError(f"haproxy exited ({self.balancer.returncode}); see {self.folder}/haproxy.log")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    seen.add(response.headers.get("set-cookie", "").partition(";")[0])
            except OSError:
                pass
            if len(seen) >= replicas:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the balancer did not reach {replicas} replicas within {limit_s:.0f} s (saw {seen})")

    def stop(self) -> None:
        if self.balancer is not None and self.balancer.poll() is None:
            self.balancer.terminate()
            try:
                self.balancer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.balancer.kill()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
