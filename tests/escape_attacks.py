"""The "assume escaped" attacks: plain Python (real ``open``, ``os``, ``socket``, ``ctypes``) for a hardened worker,
as if the language policy and the facades had both failed, with the table of which layer stops what.

A module without pytest or the test helpers, because it runs in two places: the test process on this host
(tests/test_sandbox_isolation.py, tests/test_sandbox_jail.py) and inside the container image, where only the
package is installed (tests/escape_probe.py, run by tests/test_container_image.py with this folder mounted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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
        # in the jail a worker is PID 1 of its own PID namespace: its parent is outside it and getppid() is 0 (kill(0)
        # would signal the worker's own group); -1 then tries every process the worker could see, and there is none
        "signal-zygote": "import os\nos.kill(os.getppid() or -1, 0)",
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


def make_canary(folder: str) -> str:
    """A 0600 file the worker must not read or stat, and its "-victim" twin for chmod-host-file."""
    path = os.path.join(folder, "canary")
    with open(path, "w") as f:
        f.write(os.urandom(8).hex())
    os.chmod(path, 0o600)
    with open(path + "-victim", "w"):
        pass
    os.chmod(path + "-victim", 0o600)
    return path


def attack_outcomes(pool, payload, canary: str, server: int, port: int, tag: str) -> dict[str, str]:
    """Every attack in a fresh session of ``pool`` (a ``test_unrestricted`` pool): "denied" or "escaped"."""
    from mechsandbox.server.sandbox.host.pool import WorkerLost

    table: dict[str, str] = {}
    try:
        for attack, code in attacks(canary, server, port, tag).items():
            session = pool.open_session(payload)
            try:
                reply = session.unrestricted(code)
                table[attack] = A if reply.get("error") is None else D
            except WorkerLost:  # exec replaced the worker's program: the attack got through
                table[attack] = A
            finally:
                session.close()
                os.chmod(canary + "-victim", 0o600)
    finally:
        for folder in ("/tmp", "/dev/shm"):
            for leftover in os.listdir(folder):
                if leftover.startswith(f"ms-{tag}-"):
                    os.unlink(os.path.join(folder, leftover))
    return table


# A pool owner whose worker clears its parent-death signal, ignores the usual signals and disables its own exit
# (the audit saw such a worker outlive a SIGKILLed server).
STUCK_WORKER = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 0, 0, 0, 0)  # clear the parent-death signal
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
os._exit = sys.exit = lambda *a: None  # and disable its own exit: the worker loop falls through
import atexit, time
atexit.register(time.sleep, 3600)  # to interpreter shutdown, which then never ends
result = "stuck"
"""
ORPHAN = f"""
import json, sys, time
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.tasks import generate
pool = SandboxPool(SandboxSettings(pool_size=0, test_unrestricted=True)).start()
session = pool.open_session(ModelPayload.from_instance(generate("dead-neurons", 0, "easy")))
reply = session.unrestricted({STUCK_WORKER!r})
print(json.dumps({{"worker": session.pid, "zygote": pool.zygote.pid, "reply": reply}}), flush=True)
time.sleep(600)
"""


def survivors_of_a_killed_owner(grace: float = 2.0) -> tuple[dict, list[int]]:
    """Starts ORPHAN, SIGKILLs it once its worker is stuck; returns what it printed and which of its worker and
    zygote are still alive ``grace`` seconds later."""
    owner = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=5)
        killed = time.monotonic()
        pids = [info["worker"], info["zygote"]]
        while any(alive(p) for p in pids) and time.monotonic() - killed < grace:
            time.sleep(0.02)
        return info, [p for p in pids if alive(p)]
    finally:
        if owner.poll() is None:
            owner.kill()


def alive(pid: int) -> bool:
    """A process that runs (a zombie or a dead one does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
