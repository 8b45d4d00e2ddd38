"""fourier-frequencies (task3): find the key frequencies planted in a prime-vocabulary embedding."""

from __future__ import annotations

from ..base import Family
from ..grading import grade_frequencies
from . import generator, reference

FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task3", "fourier_frequencies", "fourier-analysis"),
    difficulty="hard",
    description=(
        "Find the key frequencies planted (in a random rotation, with noise and weaker distractor "
        "frequencies) in the embedding of a prime vocabulary."
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
