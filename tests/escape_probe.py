"""The "assume escaped" attacks, run where only the package is installed: inside the container image.

    python tests/escape_probe.py   -> one JSON line: the sandbox's layers, each attack's outcome with every layer
                                      the container allows, and which workers outlived their SIGKILLed owner

tests/test_container_image.py mounts this folder into the image and compares the outcomes with the columns of
``escape_attacks.EXPECTED`` that match the layers the container allows (docs/DEPLOY.md, "The sandbox inside the
image"). It runs as the image's user, so the "host" of these attacks is the container: its files, its processes.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def past_small_pids(floor: int = 1000) -> None:
    """Forks until this process runs with a pid above ``floor``.

    Why: the container's PID namespace starts at 1, as the jail's does, so a probe with pid 1 would find its own
    number among the jail's processes (see-host-pid would read "escaped" for the jail's zygote, not the probe). Above
    ``floor`` no jail pid can match: a jail holds one zygote and the workers of one pool.
    """
    while os.getpid() <= floor:
        child = os.fork()
        if child == 0:
            if os.getpid() > floor:
                return  # the child carries on as the probe
            os._exit(0)
        _, status = os.waitpid(child, 0)
        if os.getpid() <= floor and child > floor:
            os._exit(os.waitstatus_to_exitcode(status))  # the probe ran in the child; pass its exit status on


if __name__ == "__main__":
    past_small_pids()  # before torch is imported: a fork of the bare interpreter costs well under a millisecond

from escape_attacks import attack_outcomes, make_canary, survivors_of_a_killed_owner  # noqa: E402
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings  # noqa: E402
from mechsandbox.tasks import generate  # noqa: E402


def main() -> None:
    payload = ModelPayload.from_instance(generate("dead-neurons", 0, "easy"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    with tempfile.TemporaryDirectory() as folder:
        canary = make_canary(folder)
        with SandboxPool(SandboxSettings(pool_size=1, wall_seconds=10.0, test_unrestricted=True)) as pool:
            layers = pool.status()["layers"]
            outcomes = attack_outcomes(
                pool, payload, canary, os.getpid(), listener.getsockname()[1], secrets.token_hex(4)
            )
    info, survivors = survivors_of_a_killed_owner(grace=2.0)
    print(json.dumps({"layers": layers, "attacks": outcomes, "stuck": info["reply"], "survivors": survivors}))


if __name__ == "__main__":
    main()
