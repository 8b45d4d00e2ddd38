"""head-roles (task9): label every attention head with its role (detection-score definitions)."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, Rejection, chance_corrected, clamp, head_name, parse_roles
from . import generator, reference


def grade(answer: Any, truth: dict) -> Grade:
    """Chance-corrected accuracy over every graded head (a head left out counts as wrong). Versions 3-4's block 0
    has its attention switched off: its heads may be labelled "none" (they are) and are not graded."""
    given = parse_roles(answer, generator.ROLES, truth["n_layers"], truth["n_heads"])
    first = truth.get("first_layer", 0)
    for (layer, head), role in list(given.items()):
        if layer < first:
            if role != "none":
                raise Rejection(f"L{layer}H{head}: block {layer}'s attention is switched off (its heads are none)")
            del given[(layer, head)]
    true = truth["roles"]
    correct = sum(1 for head, role in given.items() if true[head_name(*head)] == role)
    accuracy = correct / len(true)
    raw = max(0.0, chance_corrected(accuracy, len(generator.ROLES)))
    return Grade(
        score=clamp(raw),
        breakdown={"accuracy": round(accuracy, 6), "labelled": len(given), "heads": len(true)},
        message=f"{correct} of {len(true)} heads labelled correctly ({len(given)} labelled)",
    )


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task9", "head_roles", "role-identification"),
    difficulty="medium",
    description=(
        "Label every head of blocks 1-2 of a 3-block transformer (block 0 only an MLP re-encoding tokens and "
        "positions) with its role (previous-token, duplicate-token, induction, attend-to-first, local, none), "
        "each defined by an attention detection score."
    ),
    answer_format='{"L1H0": "previous-token", "L1H1": "none", ...} (every head of blocks 1 and 2)',
    answer_example={"L1H0": "previous-token", "L2H0": "induction"},
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
