"""The package as the jail shows it: only the code a worker imports, copied into a folder of its own at start.

Why (issue 53): the repository root is the package, so binding the package folder into the jail bound the whole
checkout: ``.git``, ``tests/``, ``docs/``, ``bench/``, the artifacts and, under ``./dev.sh serve``, the results
database of every counted answer. An escaped worker could read them all. The zygote and its workers import only the
sandbox, the public model classes and three small modules they depend on (``tests/test_sandbox_contract.py`` checks
that import graph), so the pool copies exactly those sources, with their compiled bytecode, into a fresh folder and
the jail binds that folder where the package lives: imports resolve as before (the editable install's finder names
the same path) and nothing else of the checkout is there. The copy holds 60 files, 928 KiB, and took 21 ms (median of
5, on this 2-core machine at a load average of 8-12), once per zygote start.

Folders that must still appear beneath the package (the virtualenv, when it lives in the checkout) get an empty
mount point in the copy; the jail binds them on top (``jail.bwrap_argv``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile

from ..code_paths import GUEST_CODE


def package_dir() -> str:
    import mechsandbox

    return os.path.dirname(os.path.abspath(mechsandbox.__file__))


def _sources(package: str) -> list[str]:
    """The package-relative paths of every guest source file."""
    found = []
    for entry in GUEST_CODE:
        path = os.path.join(package, entry)
        if os.path.isfile(path):
            found.append(entry)
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            found += [os.path.relpath(os.path.join(folder, f), package) for f in files if f.endswith(".py")]
    return sorted(found)


def assemble(mount_points: list[str] = ()) -> str:
    """A fresh folder (world-readable, for the per-slot uids) holding the guest code of the package; the caller
    removes it (``remove``). ``mount_points``: absolute paths under the package to leave as empty folders."""
    package = package_dir()
    root = tempfile.mkdtemp(prefix="mechsandbox-code-")
    try:
        for relative in _sources(package):
            source = os.path.join(package, relative)
            target = os.path.join(root, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)  # the modification time too: the bytecode below stays valid
            compiled = importlib.util.cache_from_source(source)
            if os.path.exists(compiled):
                destination = importlib.util.cache_from_source(target)
                os.makedirs(os.path.dirname(destination), exist_ok=True)
                shutil.copy2(compiled, destination)
        for point in mount_points:
            os.makedirs(os.path.join(root, os.path.relpath(point, package)), exist_ok=True)
        for folder, _dirs, files in os.walk(root):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
    except BaseException:
        remove(root)
        raise
    return root


def remove(root: str) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(root)
