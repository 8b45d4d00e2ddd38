"""The OpenEnv names MechSandbox uses, imported without OpenEnv's Gradio interface.

Why a module of its own: ``openenv.core`` imports ``openenv.core.env_server``, whose ``__init__`` imports OpenEnv's
Gradio web interface whenever gradio is installed (and openenv-core requires gradio). MechSandbox never serves that
interface (its own pages are at /web, docs/WEB.md; the image sets ENABLE_WEB_INTERFACE=false), yet importing it
took 3.9 s of the typed client's 5.6 s import and 2-3 s of every server start (measured with
``python -c "import mechsandbox.client"``, docs/PERFORMANCE.md, "Start-up"). OpenEnv guards that import with
``except ModuleNotFoundError`` and then leaves the interface out, which is the path it takes where gradio is absent;
this module takes that same path by marking gradio absent while OpenEnv's core is first imported, and only then.
A program that imported gradio before (or imports OpenEnv's interface module itself later) gets it as usual.

Every MechSandbox module takes its OpenEnv names from here, so the first import, whichever it is, is this one.
"""

from __future__ import annotations

import importlib
import sys


def _import_core_without_gradio() -> None:
    if "openenv.core" in sys.modules or "gradio" in sys.modules:
        return  # already imported (with or without the interface), or the host program uses gradio itself
    sys.modules["gradio"] = None  # type: ignore[assignment]  # import gradio -> ModuleNotFoundError, while this runs
    try:
        importlib.import_module("openenv.core")
    finally:
        if sys.modules.get("gradio", False) is None:  # our marker, not a gradio OpenEnv imported regardless
            del sys.modules["gradio"]


_import_core_without_gradio()

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.exceptions import SessionCapacityError  # noqa: E402
from openenv.core.env_server.http_server import HTTPEnvServer  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.serialization import serialize_observation  # noqa: E402
from openenv.core.env_server.types import (  # noqa: E402
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)

__all__ = [
    "Action",
    "ConcurrencyConfig",
    "EnvClient",
    "Environment",
    "EnvironmentMetadata",
    "HTTPEnvServer",
    "Observation",
    "SessionCapacityError",
    "State",
    "StepResult",
    "serialize_observation",
]
