"""The process layer on its own: unrestricted Python inside a hardened worker, layer by layer.

Each attack runs as plain Python (real ``open``, ``os``, ``socket``, ``ctypes``) in a worker, as if
the language policy and the facades had both failed. ``EXPECTED`` is the measured table of which
configuration stops what on this machine (root, Landlock ABI >= 6, libseccomp; the interpreter lives
under a 0700 /root, so the automatic uid drop is skipped and "uid only" forces it). With every layer
on, everything is denied; the other columns show which layer is responsible, and the "none" column
shows the attacks are real (they succeed without hardening), so these tests can fail.
"""

from __future__ import annotations

import os
import secrets
import socket

import pytest
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings, landlock, seccomp
from mechsandbox.server.sandbox.pool import WorkerLost

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or landlock.abi_version() < 6 or not seccomp.available(),
    reason="the isolation table is measured as root with Landlock ABI >= 6 and libseccomp",
)

CONFIGS = {
    "all": {},
    "no-landlock": {"landlock": False},
    "no-seccomp": {"seccomp": False},
    "no-rlimits": {"rlimits": False},
    "uid-only": {"uid_drop": "force", "landlock": False, "seccomp": False, "rlimits": False},
    "none": {"uid_drop": "off", "landlock": False, "seccomp": False, "rlimits": False},
}
D, A = "denied", "escaped"
#                          all no-landlock no-seccomp no-rlimits uid-only none
EXPECTED = {
    "read-etc-passwd": (D, A, D, D, A, A),
    "read-0600-canary": (D, A, D, D, D, A),
    "list-proc": (D, A, D, D, A, A),
    "read-server-environ": (D, D, D, D, D, D),  # Landlock, another uid, or the dropped capabilities
    "write-cwd": (D, D, D, D, D, D),  # Landlock, and the empty directory is mode 0555
    "create-file-in-tmp": (D, A, D, D, A, A),
    "write-dev-shm": (D, D, D, D, A, A),  # without Landlock, RLIMIT_FSIZE=0 still stops the content
    "open-socket": (D, D, A, D, A, A),
    "tcp-connect-loopback": (D, D, D, D, A, A),  # Landlock's TCP rule stops it when seccomp is off
    "fork": (D, D, A, D, A, A),
    "exec": (D, D, D, D, A, A),  # Landlock allows no execute outside the library paths
    "signal-server": (D, D, D, D, D, A),  # Landlock's signal scope, seccomp, or another uid
    "signal-zygote": (D, D, D, D, D, A),
    "process-vm-readv-server": (D, D, D, D, D, D),  # also the capability drop: a capless root cannot ptrace
    "memfd-create": (D, D, A, D, A, A),
    "raise-rlimit": (D, D, D, A, A, A),
}


def attacks(canary: str, server: int, port: int, tag: str) -> dict[str, str]:
    return {
        "read-etc-passwd": "result = open('/etc/passwd').read()[:8]",
        "read-0600-canary": f"result = open({canary!r}).read()",
        "list-proc": "import os\nresult = os.listdir('/proc')[:3]",
        "read-server-environ": f"result = open('/proc/{server}/environ', 'rb').read()[:8]",
        "write-cwd": "f = open('escape.txt', 'w')\nf.write('x')\nf.close()",
        "create-file-in-tmp": (
            f"import os\nos.close(os.open('/tmp/ms-{tag}-' + str(os.getpid()), os.O_CREAT | os.O_WRONLY))"
        ),
        "write-dev-shm": f"import os\nf = open('/dev/shm/ms-{tag}-' + str(os.getpid()), 'w')\nf.write('x')\nf.close()",
        "open-socket": "import socket\nsocket.socket()",
        "tcp-connect-loopback": (
            f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))"
        ),
        "fork": "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)",
        "exec": "import os\nos.execv('/bin/true', ['true'])",
        "signal-server": f"import os\nos.kill({server}, 0)",
        "signal-zygote": "import os\nos.kill(os.getppid(), 0)",
        "process-vm-readv-server": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "class IOV(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
            "buf = ctypes.create_string_buffer(8)\nlocal = IOV(ctypes.cast(buf, ctypes.c_void_p), 8)\n"
            "remote = IOV(4096, 8)\n"
            f"r = libc.process_vm_readv({server}, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
            "if r < 0 and ctypes.get_errno() == 1:\n    raise PermissionError('EPERM')"
        ),
        "memfd-create": "import os\nos.memfd_create('x')",
        "raise-rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
    }


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("iso") / "canary"
    path.write_text(secrets.token_hex(8))
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture(scope="module")
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(scope="module")
def outcomes(canary, listener) -> dict[str, dict[str, str]]:
    payload = ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))
    tag = secrets.token_hex(4)
    table: dict[str, dict[str, str]] = {}
    try:
        for name, overrides in CONFIGS.items():
            settings = SandboxSettings(pool_size=1, wall_seconds=10.0, test_unrestricted=True, **overrides)
            with SandboxPool(settings) as pool:
                for attack, code in attacks(canary, os.getpid(), listener, tag).items():
                    session = pool.open_session(payload)
                    try:
                        reply = session.unrestricted(code)
                        table.setdefault(attack, {})[name] = A if reply.get("error") is None else D
                    except WorkerLost:  # exec replaced the worker's program: the attack got through
                        table.setdefault(attack, {})[name] = A
                    finally:
                        session.close()
    finally:
        for folder in ("/tmp", "/dev/shm"):
            for leftover in os.listdir(folder):
                if leftover.startswith(f"ms-{tag}-"):
                    os.unlink(os.path.join(folder, leftover))
    return table


@pytest.mark.parametrize("attack", sorted(EXPECTED))
def test_which_layer_stops_what(outcomes, attack: str) -> None:
    expected = dict(zip(CONFIGS, EXPECTED[attack], strict=True))
    assert outcomes[attack] == expected


def test_every_attack_is_denied_with_all_layers_on(outcomes) -> None:
    assert all(row["all"] == D for row in outcomes.values())


def test_every_layer_is_active_on_this_machine() -> None:
    """CI: rlimits, Landlock and seccomp are active by default; the uid drop is active or says why not."""
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        layers = pool.status()["layers"]
    assert layers["rlimits"] == layers["landlock"] == layers["seccomp"] == "active"
    assert layers["uid"] == "active" or layers["uid"].startswith("skipped: uid 20000 cannot read the interpreter")
    with SandboxPool(SandboxSettings(pool_size=1, uid_drop="force")) as pool:
        assert pool.status()["active"] == ["rlimits", "uid", "landlock", "seccomp"]
