"""JSON-schema fragments for answers, with ``x-`` keys that the random baseline reads.

``x-kind`` says how the grader reads the answer, ``x-universe`` the number of candidates and
``x-k-max`` the family's largest possible truth size at that level (a family-level bound, not the
instance's |G|, which no prompt states).
"""

from __future__ import annotations

from typing import Any

from ..answer_kind import AnswerKind


def index_schema(
    n: int, k_max: int, description: str, kind: AnswerKind = AnswerKind.INDICES, first: int = 0
) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "integer", "minimum": first, "maximum": first + n - 1},
        "uniqueItems": True,
        "description": description,
        "x-kind": kind,
        "x-universe": n,
        "x-k-max": k_max,
    }


def frequency_schema(p: int, k_max: int, what: str = "key frequencies") -> dict[str, Any]:
    """Frequencies k in 1..(p-1)/2 of a prime p (k and p-k are the same real frequency)."""
    half = (p - 1) // 2
    return index_schema(
        half, k_max, f"{what} k in 1..{half} (k and p-k are the same)", kind=AnswerKind.FREQUENCIES, first=1
    )


def head_schema(
    n_layers: int, n_heads: int, k_max: int, description: str, roles: tuple[str, ...] = ()
) -> dict[str, Any]:
    head = {
        "type": "array",
        "items": [
            {"type": "integer", "minimum": 0, "maximum": n_layers - 1},
            {"type": "integer", "minimum": 0, "maximum": n_heads - 1},
        ],
        "minItems": 2,
        "maxItems": 2,
    }
    schema: dict[str, Any] = {
        "description": description,
        "x-kind": AnswerKind.HEADS_ROLES if roles else AnswerKind.HEADS,
        "x-universe": n_layers * n_heads,
        "x-k-max": k_max,
        "x-n-layers": n_layers,
        "x-n-heads": n_heads,
    }
    if roles:
        schema.update(
            {
                "type": "object",
                "properties": {
                    "heads": {"type": "array", "items": head, "uniqueItems": True},
                    "roles": {"type": "object", "additionalProperties": {"enum": list(roles)}},
                },
                "required": ["heads"],
                "x-roles": list(roles),
            }
        )
    else:
        schema.update({"type": "array", "items": head, "uniqueItems": True})
    return schema
