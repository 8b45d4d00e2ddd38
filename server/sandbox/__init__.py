"""The sandbox: language policy, module facades and hardened worker processes (three layers), in two sides.

``host/`` runs in the server (the pool, the jail's command line and cgroups, the watchdog); ``guest/`` runs in the
zygote and its workers, behind the jail, and may be reached by a snippet that escaped layers 1-2. Between them: the
frame format (``frames``), the model payload and its sealed file (``payload``, ``sealed``), the settings and the list
of guest code (``code_paths``). The guest never imports the host side (tests/test_sandbox_contract.py).

Server code uses ``SandboxPool`` (start once), ``pool.open_session(ModelPayload.from_instance(inst))``
and ``session.run(code)`` / ``session.solution_from(name)``. See docs/SANDBOX.md.

The names below are loaded on first use, so that importing the guest side (``mechsandbox.server.sandbox.guest``,
which imports this package first) never loads host code, which the jail does not even show.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelPayload": ".payload",
    "RunResult": ".host.pool",
    "SandboxPool": ".host.pool",
    "SandboxSession": ".host.pool",
    "SandboxSettings": ".settings",
    "SandboxUnavailable": ".host.pool",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
