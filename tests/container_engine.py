"""The container engine the image tests use, and whether this machine has what building the image needs.

Shared by tests/test_container_image.py (which builds and runs the real image) and tests/test_container.py (which
replays the image's install and start steps in a virtualenv only where the real image cannot be built).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ENGINE = os.environ.get("ENGINE") or shutil.which("podman") or shutil.which("docker") or "podman"
MISSING = [tool for tool in (ENGINE, "mmdebstrap") if not shutil.which(tool)]
INSTALL = "apt-get install podman mmdebstrap runc catatonit (.ci/run)"
IMAGE_TEST = "test_container_image.py"


def builds_the_real_image(session: pytest.Session) -> bool:
    """True when this pytest session also builds and runs the image itself: the engine and mmdebstrap are here and
    tests/test_container_image.py was selected (not left out with ``-m 'not container'`` or by naming files)."""
    return not MISSING and any(Path(str(item.path)).name == IMAGE_TEST for item in session.items)
