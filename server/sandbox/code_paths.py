"""Which files of the package the guest side runs: the jail shows exactly these (``host/guest_tree.py`` copies them)
and, where there is no jail, Landlock lets a worker read exactly these (``guest/hardening.py``).

Why a module of its own, on neither side: both sides need the list, and the guest must never import host code (the
import contract in ``tests/test_sandbox_contract.py``)."""

from __future__ import annotations

#: Files, or folders whose ``.py`` files are taken, relative to the package: the package's and the server's
#: ``__init__`` (imports resolve through them), what the guest imports from the package's root (settings, jsonvalue,
#: the public model classes), the sandbox's shared modules (its package ``__init__``, settings, the frame format, the
#: model payload and its sealed file) and the guest side. Never ``server/sandbox/host``.
GUEST_CODE = (
    "__init__.py",
    "settings.py",
    "jsonvalue.py",
    "arch",
    "server/__init__.py",
    "server/sandbox/__init__.py",
    "server/sandbox/settings.py",
    "server/sandbox/frames.py",
    "server/sandbox/payload.py",
    "server/sandbox/sealed.py",
    "server/sandbox/code_paths.py",
    "server/sandbox/guest",
)
