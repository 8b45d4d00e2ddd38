"""causal-subspace (task10): find the subspace of a hidden layer that carries the causal variable."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import Family, Instance
from ..grading import Grade, Rejection, clamp
from . import generator, reference


def parse_basis(answer: Any, d: int) -> np.ndarray:
    """A list of vectors (or one vector) of d finite numbers -> an orthonormal basis [d, r]."""
    if isinstance(answer, list) and answer and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in answer):  # fmt: skip
        answer = [answer]
    if not isinstance(answer, list) or not answer or len(answer) > d:
        raise Rejection(f"send a list of 1..{d} vectors, each a list of {d} numbers")
    rows = []
    for v in answer:
        if not isinstance(v, list) or len(v) != d:
            raise Rejection(f"each basis vector must be a list of {d} numbers")
        if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in v):
            raise Rejection("basis vectors must hold finite numbers only")
        rows.append([float(a) for a in v])
    m = np.array(rows, dtype=np.float64)
    big = float(np.abs(m).max())
    if big > 1e100:  # the SVD would overflow to inf/nan and drop every vector; the span is scale-free
        m = m / big
    q = generator.orthonormal(m)
    if q.shape[1] == 0:
        raise Rejection("the basis vectors are all zero")
    return q


def grade(answer: Any, truth: dict, instance: Instance) -> Grade:
    q = parse_basis(answer, truth["d"])
    true_q = generator.orthonormal(np.array(truth["basis"], dtype=np.float64))
    acc, null = generator.interchange_accuracy(instance.model, instance.probe["x"], q, true_q)
    iia = max(0.0, (acc - null) / (1.0 - null))
    overlap = float(np.sum((true_q.T @ q) ** 2)) / max(true_q.shape[1], q.shape[1])
    return Grade(
        score=clamp(iia * overlap),
        breakdown={
            "iia": round(acc, 6),
            "iia_chance_corrected": round(iia, 6),
            "overlap": round(overlap, 6),
            "rank": int(q.shape[1]),
        },
        message=f"interchange accuracy {acc:.3f} (chance-corrected {iia:.3f}); subspace overlap {overlap:.3f}",
    )


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task10", "causal_subspace", "das"),
    difficulty="hard",
    description=(
        "The output depends on a variable stored in a low-dimensional rotated subspace of a hidden layer, among "
        "directions that are read but causally inert; find the subspace (scored by interchange interventions)."
    ),
    answer_format="list of basis vectors (lists of d numbers), usually via solution_from",
    answer_example=[[1.0] + [0.0] * 15],
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
    grades_with_model=True,
)
