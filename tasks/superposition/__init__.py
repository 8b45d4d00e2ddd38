"""superposition (task12): which features a toy model represents, and which share dimensions."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from ..base import Family
from ..grading import Grade, Rejection, clamp, jaccard, parse_indices
from . import generator, reference


def kappa(predicted: set[int], true: set[int], n: int) -> float:
    """Cohen's kappa of two binary labellings of n items (0 for any constant labelling)."""
    agree = sum((i in predicted) == (i in true) for i in range(n)) / n
    p_pred, p_true = len(predicted) / n, len(true) / n
    chance = p_pred * p_true + (1 - p_pred) * (1 - p_true)
    return 0.0 if chance >= 1.0 else (agree - chance) / (1.0 - chance)


def same_group_pairs(groups: list[set[int]]) -> set[tuple[int, int]]:
    return {pair for g in groups for pair in combinations(sorted(g), 2)}


def grade(answer: Any, truth: dict) -> Grade:
    n = truth["n"]
    if not isinstance(answer, dict) or set(answer) != {"represented", "groups"}:
        raise Rejection('send {"represented": [feature indices], "groups": [[i, j], ...]}')
    represented = parse_indices(answer["represented"], n, "feature")
    if not isinstance(answer["groups"], list):
        raise Rejection('"groups" must be a list of lists of feature indices, e.g. [[0, 3], [1, 2, 5]]')
    groups = []
    for g in answer["groups"]:
        if not isinstance(g, list):
            raise Rejection(f"each group must be a list of feature indices, e.g. [0, 3]; got {str(g)[:40]}")
        groups.append(parse_indices(g, n, "feature"))
    k = kappa(represented, set(truth["represented"]), n)
    submitted, true_pairs = same_group_pairs(groups), same_group_pairs([set(g) for g in truth["groups"]])
    j = jaccard(submitted, true_pairs)
    raw = 0.5 * max(0.0, k) + 0.5 * j
    return Grade(
        score=clamp(raw),
        breakdown={"kappa": round(k, 6), "pair_jaccard": round(j, 6), "pairs_submitted": len(submitted)},
        message=f"represented: kappa {k:.3f}; same-group pairs: Jaccard {j:.3f}",
    )


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task12", "toy-superposition"),
    difficulty="hard",
    description=(
        "A toy model of superposition: find which sparse features it represents and which groups of them "
        "share dimensions (antipodal pairs, triangles, pentagons, tetrahedra)."
    ),
    answer_format='{"represented": [i, ...], "groups": [[i, j], ...]}',
    answer_example={"represented": [0, 1, 2], "groups": [[0, 1]]},
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
