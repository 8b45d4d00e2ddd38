"""copy-head (task5): find the attention head that copies the marked token to the output."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, grade_index_set, parse_heads
from . import generator, reference


def grade(answer: Any, truth: dict) -> Grade:
    heads = parse_heads(answer, truth["n_layers"], truth["n_heads"])
    return grade_index_set(heads, {tuple(h) for h in truth["heads"]})


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task5", "copy_head", "head-identification"),
    difficulty="easy",
    description=(
        "A 2-layer attention-only transformer copies the one token from a marked vocabulary subset "
        "to the output; find the copy head among heads with other real jobs."
    ),
    answer_format="list of [layer, head] pairs",
    answer_example=[[0, 0]],
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
