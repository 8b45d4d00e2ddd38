"""The process layer on its own: unrestricted Python inside a hardened worker, layer by layer.

Each attack runs as plain Python (real ``open``, ``os``, ``socket``, ``ctypes``) in a worker, as if
the language policy and the facades had both failed. ``EXPECTED`` (tests/escape_attacks.py, which the
container image's probe shares) is the measured table of which
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
from escape_attacks import CONFIGS, EXPECTED, D, attack_outcomes, make_canary
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.server.sandbox.guest import landlock, seccomp

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or landlock.abi_version() < 6 or not seccomp.available(),
    reason="the isolation table is measured as root with Landlock ABI >= 6 and libseccomp",
)


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> str:
    return make_canary(str(tmp_path_factory.mktemp("iso")))


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
    for name, overrides in CONFIGS.items():
        settings = SandboxSettings(pool_size=1, wall_seconds=10.0, test_unrestricted=True, **overrides)
        with SandboxPool(settings) as pool:
            for attack, outcome in attack_outcomes(pool, payload, canary, os.getpid(), listener, tag).items():
                table.setdefault(attack, {})[name] = outcome
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
