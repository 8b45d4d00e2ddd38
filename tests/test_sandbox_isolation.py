"""The process layer on its own: unrestricted Python inside a hardened worker, layer by layer.

Each attack runs as plain Python (real ``open``, ``os``, ``socket``, ``ctypes``) in a worker, as if
the language policy and the facades had both failed. ``EXPECTED`` is the measured table of which
configuration stops what on this machine (root, Landlock ABI >= 6, libseccomp, bubblewrap; the
interpreter lives under a 0700 /root, so without the jail the automatic uid drop is skipped and "uid
only" forces it; inside the jail the 0700 folder is not there and the drop is active). With every
layer on, everything is denied; the "no-*" columns switch the jail off too and show which of the
older layers is responsible, "jail-only" shows what the namespaces, the uid and the pids cgroup stop
alone (the "if layers 1-2 fell and so did Landlock and seccomp" case), and the "none" column shows
the attacks are real (they succeed without hardening), so these tests can fail.
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

NO_JAIL = {"namespaces": False}
CONFIGS = {
    "all": {},
    "no-jail": NO_JAIL,
    "no-landlock": {**NO_JAIL, "landlock": False},
    "no-seccomp": {**NO_JAIL, "seccomp": False},
    "no-rlimits": {**NO_JAIL, "rlimits": False},
    "uid-only": {**NO_JAIL, "uid_drop": "force", "landlock": False, "seccomp": False, "rlimits": False},
    "jail-only": {"landlock": False, "seccomp": False, "rlimits": False},
    "none": {**NO_JAIL, "uid_drop": "off", "landlock": False, "seccomp": False, "rlimits": False},
}
D, A = "denied", "escaped"
# "jail-only" is bubblewrap's namespaces, the per-slot uid (which the jail makes possible here) and
# the pids cgroup, without Landlock, seccomp or rlimits. Its "escaped" rows stay inside the jail:
# list-proc lists the jail's own /proc, open-socket gets a socket in a network namespace without
# interfaces, fork is capped by the pids cgroup, and memfd/inotify/prctl touch only the jail.
#                          all no-jail no-landlock no-seccomp no-rlimits uid-only jail-only none
EXPECTED = {
    "read-etc-passwd": (D, D, A, D, D, A, D, A),
    "read-0600-canary": (D, D, A, D, D, D, D, A),
    "list-proc": (D, D, A, D, D, A, A, A),
    "read-server-environ": (D, D, D, D, D, D, D, D),  # Landlock, another uid, the capability drop, the jail
    "write-cwd": (D, D, D, D, D, D, D, D),  # Landlock, and the empty directory is mode 0555 (read-only in the jail)
    "create-file-in-tmp": (D, D, A, D, D, A, D, A),
    "write-dev-shm": (D, D, D, D, D, A, D, A),  # without Landlock, RLIMIT_FSIZE=0 still stops the content
    "open-socket": (D, D, D, A, D, A, A, A),
    "tcp-connect-loopback": (D, D, D, D, D, A, D, A),  # Landlock's TCP rule; in the jail, no network at all
    "fork": (D, D, D, A, D, A, A, A),
    "exec": (D, D, D, D, D, A, D, A),  # Landlock allows no execute outside the library paths; the jail has no /bin
    "signal-server": (D, D, D, D, D, D, D, A),  # Landlock's signal scope, seccomp, another uid, or the PID namespace
    "signal-zygote": (D, D, D, D, D, D, D, A),
    "process-vm-readv-server": (D, D, D, D, D, D, D, D),  # also the capability drop: a capless root cannot ptrace
    "memfd-create": (D, D, D, A, D, A, A, A),
    "raise-rlimit": (D, D, D, D, A, A, A, A),
    "chmod-host-file": (D, D, D, A, D, D, D, A),  # Landlock has no metadata right: seccomp, another uid or the jail
    "stat-host-file": (D, A, A, A, A, D, D, A),  # only the jail (or a uid that cannot traverse the folder)
    "see-host-pid": (D, A, A, A, A, A, D, A),  # only the jail's PID namespace
    "inotify-watch": (D, D, D, A, D, A, A, A),
    "clear-pdeathsig": (D, D, D, A, D, A, A, A),  # harmless in the jail: the zygote is PID 1 there
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
            "if r < 0 and ctypes.get_errno() != 14:  # EFAULT would mean the read was allowed\n"
            "    raise OSError(ctypes.get_errno(), 'refused')"
        ),
        "memfd-create": "import os\nos.memfd_create('x')",
        "raise-rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        "chmod-host-file": f"import os\nos.chmod({canary + '-victim'!r}, 0o4777)",
        "stat-host-file": f"import os\nos.stat({canary!r})",
        "see-host-pid": f"import os\nos.stat('/proc/{server}')",
        "inotify-watch": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.inotify_init1(0)\n"
            "if fd < 0 or libc.inotify_add_watch(fd, b'/', 0xFFF) < 0:\n    raise OSError('refused')"
        ),
        "clear-pdeathsig": (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.prctl(1, 0, 0, 0, 0) != 0:\n    raise OSError('refused')"
        ),
    }


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("iso") / "canary"
    path.write_text(secrets.token_hex(8))
    os.chmod(path, 0o600)
    victim = path.with_name("canary-victim")  # chmod-host-file's target; its mode is reset after each attack
    victim.write_text("")
    os.chmod(victim, 0o600)
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
                        os.chmod(canary + "-victim", 0o600)
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
    """CI: every layer is active by default (as root with bubblewrap); without the jail, the uid drop says why not."""
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        layers = pool.status()["layers"]
    assert all(state == "active" for state in layers.values()), layers  # the jail makes the uid drop possible
    with SandboxPool(SandboxSettings(pool_size=1, namespaces=False)) as pool:
        layers = pool.status()["layers"]
    assert layers["rlimits"] == layers["landlock"] == layers["seccomp"] == layers["pids"] == "active"
    assert layers["uid"] == "active" or layers["uid"].startswith("skipped: uid 20000 cannot read the interpreter")
    assert layers["namespaces"] == "skipped: disabled by configuration"
    with SandboxPool(SandboxSettings(pool_size=1, uid_drop="force", namespaces=False)) as pool:
        assert pool.status()["active"] == ["rlimits", "uid", "landlock", "seccomp", "pids"]
