"""multiplication-neuron (task2): find the hidden unit that multiplies two stated inputs."""

from __future__ import annotations

from ..base import Family
from ..gated_family import answer_schema, grade
from . import generator, reference

FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task2", "multiplication_neuron", "causal-ablation"),
    difficulty="medium",
    description=(
        "A gated MLP; find the hidden unit whose activation is c * x_a * x_b (a, b stated), among "
        "products, squares and near-products."
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
