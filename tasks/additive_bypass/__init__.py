"""additive-bypass (task4): find the hidden unit that passes one stated input straight through."""

from __future__ import annotations

from ..base import Family
from ..gated_family import answer_schema, grade
from . import generator, reference

FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task4", "additive_bypass"),
    difficulty="medium",
    description=(
        "The gated MLP of multiplication-neuron (own seed stream); find the unit computing c * x_k, "
        "among pass-throughs of other inputs and mixtures with products."
    ),
    answer_format="list with one integer unit index",
    answer_example=[0],
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=answer_schema,
)
