"""The sandbox's settings, declared in ``mechsandbox.settings`` with every other deployment setting.

Why this module remains: the pool, tests and outside checks import ``SandboxSettings`` and
``KNOWN_LAYERS`` from here, so the declarations could move to the one registry without changing
any of those imports.
"""

from ...settings import KNOWN_LAYERS, SandboxSettings

__all__ = ["KNOWN_LAYERS", "SandboxSettings"]
