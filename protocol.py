"""The facts of the episode protocol that several layers share: the score range, the kinds of action,
and how a message is made one line.

Why a module of its own: each of these used to be kept equal by hand in two or three places (the
graders, the episode rules, the wire models, ``inference.py``, the app's error handlers). It imports
nothing beyond the standard library, so the light client and ``inference.py`` can use it without
loading torch or the task families.
"""

from __future__ import annotations

import math
from typing import Any

FLOOR, CEIL = 0.01, 0.99  # every score and every reward lies in [FLOOR, CEIL]
ACTION_FIELDS = ("python_code", "solution_target", "solution_from")  # an action has exactly one


def clamp(x: Any) -> float:
    """A raw score mapped into [FLOOR, CEIL]; NaN and non-numbers become the floor."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
        return FLOOR
    return float(min(CEIL, max(FLOOR, x)))


def clip(text: str, keep: int) -> str:
    """``text`` cut to ``keep`` characters, saying how many were dropped (trajectories keep outputs this way)."""
    return text if len(text) <= keep else text[:keep] + f" ... [{len(text) - keep} more chars]"


def one_line(text: Any, cap: int = 2000) -> str:
    """``text`` with every run of whitespace made one space, cut to ``cap`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= cap else flat[: cap - 3] + "..."
