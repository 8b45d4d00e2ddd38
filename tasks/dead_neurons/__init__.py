"""dead-neurons (task1): find the inputs (or hidden units) that can never affect the output."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, grade_index_set, parse_indices
from . import generator, reference


def grade(answer: Any, truth: dict) -> Grade:
    return grade_index_set(parse_indices(answer, truth["n"], "index"), set(truth["indices"]))


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task1", "dead_neurons"),
    difficulty="easy",
    description=(
        "Find the dead inputs of an MLP (easy/medium) or the hidden units that never fire on the input box (hard)."
    ),
    answer_format="list of integer indices",
    answer_example=[0, 1],
    max_steps={"easy": 10, "medium": 12, "hard": 16},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
