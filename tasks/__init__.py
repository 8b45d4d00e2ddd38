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

_MODULES = (
    "dead_neurons",
    "multiplication_neuron",
    "fourier_frequencies",
    "additive_bypass",
    "copy_head",
    "induction_circuit",
    "committee_circuit",
    "modular_addition",
    "head_roles",
    "causal_subspace",
    "fact_storage",
    "superposition",
)


def _load() -> dict[str, Family]:
    import importlib

    out: dict[str, Family] = {}
    for name in _MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a family not built yet
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        fam: Family = module.FAMILY
        out[fam.id] = fam
    return out


_FAMILIES = _load()
_ALIASES = {alias: fam.id for fam in _FAMILIES.values() for alias in (fam.id, *fam.aliases)}


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
