"""A real, throwaway PostgreSQL server for the results-database tests.

Why a real one: the unique constraint that makes "one counted attempt per instance" hold across replicas, the
migrations and the driver are what is under test; a fake would test nothing of them. Debian's ``postgresql``
package provides the binaries (``.ci/run`` installs it); ``initdb`` refuses to run as root, so as root the cluster
is created and run as ``nobody`` in a folder it owns. Where the binaries are missing, ``postgres_or_skip`` skips
with that reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mechsandbox.evaluation.local_server import free_port


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Postgres:
    port: int
    folder: Path
    bin: Path
    user: str | None  # the unprivileged user the server runs as (None: the current user)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def command(self, *args: str) -> list[str]:
        return ["runuser", "-u", self.user, "--", *args] if self.user else list(args)

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(self.command(str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), *args),
                       check=True, capture_output=True, timeout=60)  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.pg_ctl("-o", options, "-l", str(self.folder / "log"), "-w", "start")

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "-w", "stop")


@contextlib.contextmanager
def postgres_or_skip() -> Iterator[Postgres]:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does it)")
    user = None
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as an unprivileged user")
        user = "nobody"
        pwd.getpwnam(user)
    folder = Path(tempfile.mkdtemp(prefix="mechsandbox-pg-", dir="/tmp"))
    try:
        if user:
            entry = pwd.getpwnam(user)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        folder.chmod(0o755)
        init = subprocess.run(
            [*(["runuser", "-u", user, "--"] if user else []), str(bin_dir / "initdb"), "-D", str(folder / "data"),
             "-U", "postgres", "-A", "trust", "--no-sync"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if init.returncode != 0:
            pytest.skip(f"initdb failed: {' '.join(init.stderr.split())[:200]}")
        server = Postgres(free_port(), folder, bin_dir, user)
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
