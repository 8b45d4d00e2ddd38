"""Shared grading: the Grade record, answer parsing, Jaccard and chance-corrected scores.

Why one module: every family grades one of a few answer shapes (indices, frequencies, heads,
heads with role labels). Parsing them in one place keeps the accepted and rejected shapes, and
their one-line messages, identical across families (docs/CONTRACT.md, "Grading"). Nothing here raises on
any JSON value: a bad answer is a :class:`Rejection`, turned into a rejected :class:`Grade`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import FLOOR, clamp, one_line

MAX_ITEMS = 4096
MAX_MESSAGE = 240  # characters of a rejection message


@dataclass(frozen=True)
class Grade:
    """A grader's verdict. ``rejected`` answers are malformed: the episode does not end on them."""

    score: float
    breakdown: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    rejected: bool = False


class Rejection(ValueError):
    """A malformed answer; the message is one line that says what to send instead."""


def jaccard(answer: set, truth: set) -> float:
    if not answer and not truth:
        return 1.0
    return len(answer & truth) / len(answer | truth)


def chance_corrected(accuracy: float, n_labels: int) -> float:
    """(accuracy - 1/K) / (1 - 1/K): 0 for guessing, 1 for perfect."""
    chance = 1.0 / n_labels
    return (accuracy - chance) / (1.0 - chance)


def safe_grade(fn: Callable[[Any, dict], Grade], answer: Any, truth: dict) -> Grade:
    """Run a grader and turn any malformed-answer condition into a rejected Grade."""
    try:
        return fn(answer, truth)
    except Rejection as exc:
        # one short line whatever the grader put in it (an answer's huge number must not flood the message)
        return Grade(score=FLOOR, breakdown={}, message=one_line(exc, MAX_MESSAGE), rejected=True)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        return Grade(score=FLOOR, breakdown={}, message=f"malformed answer ({type(exc).__name__})", rejected=True)


# ---------------------------------------------------------------------------------------
# integers
# ---------------------------------------------------------------------------------------
def as_int(value: Any, what: str) -> int:
    """An int from an int or an integral float; bools and strings are rejected."""
    if isinstance(value, bool):
        raise Rejection(f"{what} must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise Rejection(f"{what} must be an integer, got {type(value).__name__} {short_repr(value)}")


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _unwrap(answer: Any, keys: tuple[str, ...]) -> Any:
    """Accept ``{"<key>": value}`` for a few documented key names as well as the bare value."""
    if isinstance(answer, dict):
        for key in keys:
            if key in answer:
                return answer[key]
        raise Rejection(f"expected a list, or an object with one of the keys {list(keys)}")
    return answer


def parse_indices(answer: Any, n: int, what: str = "index", keys: tuple[str, ...] = ("indices",)) -> set[int]:
    """An int or a list of ints in [0, n); duplicates are ignored; out of range is rejected."""
    value = _unwrap(answer, keys)
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_ITEMS:
        raise Rejection(f"too many items ({len(items)}); at most {n} are possible")
    out: set[int] = set()
    for item in items:
        i = as_int(item, what)
        if not 0 <= i < n:
            raise Rejection(f"{what} {short_repr(i)} is out of range: valid values are 0..{n - 1}")
        out.add(i)
    return out


def parse_frequencies(answer: Any, p: int) -> set[int]:
    """Frequencies k in 1..p-1 folded to min(k, p-k) (k and p-k are the same real frequency)."""
    value = _unwrap(answer, ("frequencies", "freqs"))
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_ITEMS:
        raise Rejection(f"too many items ({len(items)})")
    out: set[int] = set()
    for item in items:
        k = as_int(item, "frequency")
        if not 1 <= k <= p - 1:
            raise Rejection(
                f"frequency {short_repr(k)} is out of range: "
                f"valid values are 1..{(p - 1) // 2} (k and {p}-k are the same)"
            )
        out.add(min(k, p - k))
    return out


# ---------------------------------------------------------------------------------------
# heads
# ---------------------------------------------------------------------------------------
_HEAD_STR = re.compile(r"^\s*[Ll](\d+)\s*[Hh](\d+)\s*$")
_HEAD_TUPLE_STR = re.compile(r"^\s*[\(\[]\s*(\d+)\s*,\s*(\d+)\s*[\)\]]\s*$")
FLAT_HINT = 'write heads as a list of [layer, head] pairs, e.g. [[0, 2]] (or "L0H2")'


def parse_head(item: Any) -> tuple[int, int]:
    if isinstance(item, str):
        m = _HEAD_STR.match(item) or _HEAD_TUPLE_STR.match(item)
        if not m:
            raise Rejection(f"cannot read head {short_repr(item)}: {FLAT_HINT}")
        return int(m.group(1)), int(m.group(2))
    if isinstance(item, (list, tuple)) and len(item) == 2:
        return as_int(item[0], "layer"), as_int(item[1], "head")
    raise Rejection(f"cannot read head {short_repr(item)}: {FLAT_HINT}")


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def parse_heads(value: Any, n_layers: int, n_heads: int) -> set[tuple[int, int]]:
    """Heads as [[l, h], ...], ["L0H2", ...], or the earlier project's {"(0, 2)": 1.0}.

    A bare int or a flat [0, 2] is rejected: it is ambiguous between one head and two indices.
    """
    if isinstance(value, dict):
        items = [
            k for k, v in value.items() if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0)
        ]
    elif isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        if value and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            raise Rejection(f"a flat list of numbers is ambiguous: {FLAT_HINT}")
        items = value
    else:
        raise Rejection(f"expected a list of heads: {FLAT_HINT}")
    if len(items) > MAX_ITEMS:
        raise Rejection(f"too many heads ({len(items)})")
    out: set[tuple[int, int]] = set()
    for item in items:
        layer, head = parse_head(item)
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise Rejection(
                f"head [{short_repr(layer)}, {short_repr(head)}] is out of range: "
                f"layers 0..{n_layers - 1}, heads 0..{n_heads - 1}"
            )
        out.add((layer, head))
    return out


def parse_roles(value: Any, allowed: tuple[str, ...], n_layers: int, n_heads: int) -> dict[tuple[int, int], str]:
    """Role labels as {"L0H2": "previous-token", ...} (head keys in any accepted head form)."""
    if not isinstance(value, dict):
        raise Rejection('roles must be an object such as {"L0H2": "' + allowed[0] + '"}')
    out: dict[tuple[int, int], str] = {}
    for key, role in value.items():
        (head,) = parse_heads([key], n_layers, n_heads)
        if role not in allowed:
            raise Rejection(f"unknown role {short_repr(role)}: use one of {list(allowed)}")
        out[head] = role
    return out


def grade_index_set(answer_set: set, truth_set: set) -> Grade:
    """Jaccard, clamped: the all-components answer on a >=4x universe scores <= 0.25."""
    j = jaccard(answer_set, truth_set)
    hits = len(answer_set & truth_set)
    return Grade(
        score=clamp(j),
        breakdown={"jaccard": round(j, 6), "submitted": len(answer_set), "correct": hits},
        message=f"{hits} of {len(answer_set)} submitted items are correct; Jaccard {j:.3f}",
    )


def grade_frequencies(answer: Any, truth: dict) -> Grade:
    """Jaccard over frequencies folded k ~ p-k (fourier-frequencies, modular-addition)."""
    return grade_index_set(parse_frequencies(answer, truth["p"]), set(truth["frequencies"]))


def grade_heads_with_roles(answer: Any, truth: dict, allowed_roles: tuple[str, ...]) -> Grade:
    """Heads by Jaccard; when role labels are given, Jaccard * (0.8 + 0.2 * chance-corrected role accuracy over the
    true heads) (a true head left unlabelled counts as wrong). The role part is scaled by the Jaccard so that
    labels earn only as much as the head set is right: with a flat 0.2, an answer listing every head a weight
    reading could name, each labelled by its layer, collected the whole role part (issue 16's red team: 0.40 for
    the union of induction-circuit's out-writers and their sources, at Jaccard 0.25).

    Accepted: a list of heads, or {"heads": [...], "roles": {...}}.
    """
    n_layers, n_heads = truth["n_layers"], truth["n_heads"]
    true_roles = {parse_head(k): v for k, v in truth["roles"].items()}
    roles: dict[tuple[int, int], str] | None = None
    if isinstance(answer, dict) and ("heads" in answer or "roles" in answer):
        unknown = set(answer) - {"heads", "roles"}
        if unknown:
            raise Rejection(f'unknown keys {sorted(unknown)}: send {{"heads": [...], "roles": {{...}}}}')
        if "roles" in answer:
            roles = parse_roles(answer["roles"], allowed_roles, n_layers, n_heads)
        heads = parse_heads(answer["heads"], n_layers, n_heads) if "heads" in answer else set(roles or {})
        if roles:
            heads |= set(roles)
    else:
        heads = parse_heads(answer, n_layers, n_heads)
    base = grade_index_set(heads, set(true_roles))
    if roles is None:
        return base
    correct = sum(1 for h, r in true_roles.items() if roles.get(h) == r)
    role_score = max(0.0, chance_corrected(correct / len(true_roles), len(allowed_roles)))
    j = base.breakdown["jaccard"]
    raw = j * (0.8 + 0.2 * role_score)
    return Grade(
        score=clamp(raw),
        breakdown={
            **base.breakdown,
            "role_accuracy": round(correct / len(true_roles), 6),
            "role_score": round(role_score, 6),
        },
        message=base.message + f"; {correct} of {len(true_roles)} role labels correct",
    )
