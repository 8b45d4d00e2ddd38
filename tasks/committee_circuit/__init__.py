"""committee-circuit (task7): find the primaries and their backups (with roles) in a 4-layer model."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, grade_heads_with_roles
from . import generator, reference


def grade(answer: Any, truth: dict) -> Grade:
    return grade_heads_with_roles(answer, truth, generator.ROLES)


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task7", "committee_circuit", "full-hypothesis"),
    difficulty="hard",
    description=(
        "A 4-layer model copies a marked token through a committee of primary heads and backups "
        "that take over when their primary is ablated; find every member with its role."
    ),
    answer_format='{"heads": [[layer, head], ...], "roles": {"L0H3": "primary", ...}}',
    answer_example={"heads": [[0, 0], [2, 0]], "roles": {"L0H0": "primary", "L2H0": "backup"}},
    max_steps={"easy": 14, "medium": 16, "hard": 20},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
