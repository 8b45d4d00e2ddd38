"""fact-storage (task11): causal tracing -- find the (layer, position) where the facts are stored."""

from __future__ import annotations

from typing import Any

from ..base import Family
from ..grading import Grade, Rejection, as_int, clamp, short_repr
from . import generator, reference

# docs/CONTRACT.md, "Grading": a neighbouring cell earns partial credit only for a nearness that means
# something. Since version 2 none does: a neighbouring cell recovers nothing in the trace (the facts
# live in one layer's MLP, at one of several subject positions), and crediting neighbours (0.3 for an
# adjacent cell, version 1) let a constant layer with a subject-span position rule farm 0.40.
ADJACENT = 0.0


def parse_cell(answer: Any, n_layers: int, n_positions: int) -> tuple[int, int]:
    """{"layer": L, "position": t} or [L, t]; out-of-range values are rejected, not clamped."""
    if isinstance(answer, dict):
        unknown = set(answer) - {"layer", "position"}
        if unknown or len(answer) != 2:
            raise Rejection('send {"layer": L, "position": t}')
        layer, pos = answer["layer"], answer["position"]
    elif isinstance(answer, list) and len(answer) == 2:
        layer, pos = answer
    else:
        raise Rejection('send {"layer": L, "position": t} (or [L, t])')
    layer, pos = as_int(layer, "layer"), as_int(pos, "position")
    if not 0 <= layer < n_layers or not 0 <= pos < n_positions:
        raise Rejection(
            f"cell ({short_repr(layer)}, {short_repr(pos)}) is out of range: "
            f"layers 0..{n_layers - 1}, positions 0..{n_positions - 1}"
        )
    return layer, pos


def grade(answer: Any, truth: dict) -> Grade:
    """Full credit for the peak cell only: neighbouring cells earn nothing (see ADJACENT)."""
    layer, pos = parse_cell(answer, truth["n_layers"], truth["n_positions"])
    distance = abs(layer - truth["layer"]) + abs(pos - truth["position"])
    raw = 1.0 if distance == 0 else ADJACENT
    verdict = "the peak cell" if distance == 0 else "not the peak"
    return Grade(score=clamp(raw), breakdown={"distance": distance}, message=f"({layer}, {pos}) is {verdict}")


FAMILY = Family(
    id=generator.TASK_ID,
    aliases=("task11", "fact_storage", "causal-tracing"),
    difficulty="medium",
    description=(
        "Facts subject -> attribute are written into one layer's MLP at one of the subject's positions "
        "(ROME-style); find that (layer, position) cell by causal tracing."
    ),
    answer_format='{"layer": L, "position": t}',
    answer_example={"layer": 1, "position": 2},
    max_steps={"easy": 10, "medium": 12, "hard": 14},
    family_version=generator.VERSION,
    generate_fn=generator.generate,
    grade_fn=grade,
    reference=reference.SNIPPETS,
    answer_schema_fn=generator.answer_schema,
)
