"""The server's settings, declared in ``mechsandbox.settings`` with every other deployment setting.

Why this module remains: server code, tests and outside checks import ``ServerSettings`` from here,
so the declarations could move to the one registry without changing any of those imports.
"""

from ..settings import ServerSettings

__all__ = ["ServerSettings"]
