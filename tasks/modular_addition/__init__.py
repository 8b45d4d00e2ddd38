"""modular-addition (task8): find the key frequencies a Fourier-algorithm modular adder really uses."""

from __future__ import annotations

from ..base import Family
from ..grading import grade_frequencies
from . import generator, reference

FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task8", "modular_addition", "grokking"),
    difficulty="hard",
    description=(
        "A network computes (a + b) mod p by the Fourier algorithm; find the key frequencies it uses, "
        "among distractor frequencies as strong in the embedding but unused downstream."
    ),
    answer_format="list of integer frequencies in 1..(p-1)/2",
    answer_example=[1, 2],
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade_frequencies,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
