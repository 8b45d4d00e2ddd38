"""The sandbox: language policy, module facades and hardened worker processes (three layers).

Server code uses ``SandboxPool`` (start once), ``pool.open_session(ModelPayload.from_instance(inst))``
and ``session.run(code)`` / ``session.solution_from(name)``. See docs/SANDBOX.md.
"""

from .payload import ModelPayload
from .pool import RunResult, SandboxPool, SandboxSession, SandboxUnavailable
from .settings import SandboxSettings

__all__ = ["ModelPayload", "RunResult", "SandboxPool", "SandboxSession", "SandboxSettings", "SandboxUnavailable"]
