"""The task framework's records: what a family declares and what one instance holds.

Why: every consumer (server, sandbox, eval, notebooks) needs the same few things from a family --
its public description, a generator, a grader and a reference solution -- and must never see more
of an instance than it is entitled to. :class:`Instance` keeps the truth apart from the public
parts, so the server can hand ``public_namespace()`` to a sandbox worker and keep ``truth``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..arch import helper_namespace, helpers_for
from .grading import Grade, safe_grade

LEVELS = ("easy", "medium", "hard")


@dataclass
class Instance:
    """One generated task instance.

    ``model`` and ``probe`` are public (they go to the sandbox); ``config`` is the public
    architecture description saved beside the weights; ``truth`` is plain JSON and stays with
    the server and the grader.
    """

    task_id: str
    level: str
    seed: int
    family_version: str
    model: nn.Module
    probe: dict[str, Any]
    config: dict[str, Any]
    prompt: str
    answer_schema: dict[str, Any]
    truth: dict[str, Any]

    def public_namespace(self) -> dict[str, Any]:
        """What a snippet sees besides the library facades: the model, the probe data and the
        architecture's helper objects (TransformerLens' ``utils`` subset for the hooked transformers)."""
        return {"model": self.model, **self.probe, **helper_namespace(helpers_for(self.model))}

    def to_transformer_lens(self, device: str = "cpu") -> Any:
        """The model as a real TransformerLens ``HookedTransformer`` (optional extra ``[tl]``), for notebook work
        outside the sandbox: the public weights only, never the truth (``arch/tl_export.py``)."""
        from ..arch.tl_export import to_transformer_lens

        return to_transformer_lens(self.model, device=device)


@dataclass(frozen=True)
class Family:
    """A task family: its public card plus generate / grade / reference."""

    id: str
    aliases: tuple[str, ...]
    difficulty: str
    description: str
    answer_format: str
    answer_example: Any
    max_steps: dict[str, int]
    family_version: str
    generate_fn: Callable[[int, str], Instance]
    grade_fn: Callable[[Any, dict], Grade]
    reference: tuple[str, ...]
    answer_schema_fn: Callable[[str], dict[str, Any]] = field(repr=False)
    levels: tuple[str, ...] = LEVELS
    grades_with_model: bool = False  # grade_fn(answer, truth, instance): it measures the submission on the model

    def generate(self, seed: int, level: str = "easy") -> Instance:
        if level not in self.levels:
            raise ValueError(f"unknown level {level!r}: use one of {list(self.levels)}")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        return self.generate_fn(seed, level)

    def grade(self, answer: Any, truth: dict, instance: Instance | None = None) -> Grade:
        """Pure and total: any JSON value gives a Grade (rejected when malformed), never an exception.

        Families that measure the submission on the model (``grades_with_model``) use ``instance`` when
        the caller has it (the server does) and otherwise regenerate it from the truth's seed and level,
        so ``grade(answer, truth)`` stays a pure function of its arguments."""
        if not self.grades_with_model:
            return safe_grade(self.grade_fn, answer, truth)
        inst = instance if instance is not None else _regenerated(self, truth["seed"], truth["level"])
        return safe_grade(lambda a, t: self.grade_fn(a, t, inst), answer, truth)

    def card(self) -> dict[str, Any]:
        """The public description listed by ``mechsandbox tasks --json`` and ``/tasks``."""
        return {
            "id": self.id,
            "aliases": list(self.aliases),
            "difficulty": self.difficulty,
            "levels": list(self.levels),
            "answer_format": self.answer_format,
            "answer_schema": self.answer_schema_fn("medium"),
            "answer_schema_by_level": {lvl: self.answer_schema_fn(lvl) for lvl in self.levels},
            "answer_example": self.answer_example,
            "max_steps": dict(self.max_steps),
            "family_version": self.family_version,
            "description": self.description,
        }


_REGENERATED: OrderedDict[tuple[str, str, int, str], Instance] = OrderedDict()
_REGENERATED_LOCK = threading.Lock()


def _regenerated(family: Family, seed: int, level: str) -> Instance:
    """The instance a model-measuring grader needs, regenerated from the truth's seed and level.

    Why cached: a caller without the instance (the eval harness, notebooks, property tests that grade
    hundreds of answers against one truth) would otherwise regenerate it on every call (causal-subspace
    takes about 0.1-0.3 s). A few recent instances are kept; graders only read the model.
    """
    key = (family.id, family.family_version, seed, level)
    with _REGENERATED_LOCK:
        if key in _REGENERATED:
            _REGENERATED.move_to_end(key)
            return _REGENERATED[key]
    inst = family.generate(seed, level)
    with _REGENERATED_LOCK:
        _REGENERATED[key] = inst
        while len(_REGENERATED) > 4:
            _REGENERATED.popitem(last=False)
    return inst
