"""Task families: ``families()``, ``generate(task, seed, level)``, ``grade(task, answer, truth)``.

This is the notebook API as well as what the server uses::

    from mechsandbox.tasks import families, generate, grade
    inst = generate("copy-head", seed=7, level="easy")
    grade("copy-head", [[1, 3]], inst.truth).score
"""

from __future__ import annotations

from typing import Any

from .base import LEVELS, Family, Instance
from .grading import Grade


def _order(fam: Family) -> tuple[int, str]:
    """Canonical order: the number of the family's ``taskN`` alias, then families without one by id."""
    numbers = [int(a[4:]) for a in fam.aliases if a.startswith("task") and a[4:].isdigit()]
    return (numbers[0] if numbers else 1_000_000, fam.id)


def _load() -> dict[str, Family]:
    """Every family package under ``tasks/``: a sub-package that defines ``FAMILY``.

    Why discovered rather than listed: a second hand-kept list drifts, and a family missing from it
    vanished silently. A family package that fails to import is an error here, never skipped, and
    so is a clash of ids or aliases.
    """
    import importlib
    import pkgutil

    found: list[Family] = []
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        fam = getattr(module, "FAMILY", None)
        if not isinstance(fam, Family):
            raise ImportError(f"{module.__name__} is a package under tasks/ but defines no FAMILY = Family(...)")
        found.append(fam)
    out: dict[str, Family] = {}
    names: dict[str, str] = {}
    for fam in sorted(found, key=_order):
        for name in (fam.id, *fam.aliases):
            if names.setdefault(name, fam.id) != fam.id:
                raise ImportError(f"families {names[name]!r} and {fam.id!r} both claim the name {name!r}")
        out[fam.id] = fam
    return out


_FAMILIES = _load()
_ALIASES = {name: fam.id for fam in _FAMILIES.values() for name in (fam.id, *fam.aliases)}


def families() -> list[Family]:
    """All families, in their canonical order (task1, task2, ...)."""
    return list(_FAMILIES.values())


def get_family(task_id: str) -> Family:
    """A family by slug or alias (``"copy-head"``, ``"task5"``)."""
    try:
        return _FAMILIES[_ALIASES[task_id]]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_FAMILIES))
        raise KeyError(f"unknown task {task_id!r}: use one of {known} (or task1..task{len(_FAMILIES)})") from None


def generate(task_id: str, seed: int, level: str = "easy") -> Instance:
    return get_family(task_id).generate(seed, level)


def grade(task_id: str, answer: Any, truth: dict, instance: Instance | None = None) -> Grade:
    return get_family(task_id).grade(answer, truth, instance)


__all__ = ["LEVELS", "Family", "Grade", "Instance", "families", "generate", "get_family", "grade"]
