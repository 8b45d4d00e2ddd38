"""induction-circuit (task6): find the previous-token and induction heads, with their roles."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, grade_heads_with_roles
from . import generator, reference


def grade(answer: Any, truth: dict) -> Grade:
    return grade_heads_with_roles(answer, truth, generator.ROLES)


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task6", "induction_circuit", "circuit-localization"),
    difficulty="medium",
    description=(
        "A previous-token head in layer 0 K-composes with an induction head in layer 1; find both "
        "(with roles) among look-alike distractors in both layers."
    ),
    answer_format='{"heads": [[layer, head], ...], "roles": {"L0H1": "previous-token", ...}}',
    answer_example={"heads": [[0, 0], [1, 0]], "roles": {"L0H0": "previous-token", "L1H0": "induction"}},
    max_steps={"easy": 12, "medium": 14, "hard": 16},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
