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


# --- infrastructure failures: a named outcome, never a score (docs/CONTRACT.md, "When the infrastructure fails") ---

INFRA_CODE = "INFRASTRUCTURE_ERROR"  # the WebSocket error code, the HTTP body's "code", MCP's error data "code"
INFRA_RPC_CODE = -32050  # the JSON-RPC error code of an infrastructure failure on /mcp (implementation-defined range)
INFRA_PREFIX = "infrastructure error"  # every such message starts "infrastructure error (<side>): ..."
INFRA_SIDES = {
    "generation": "the server could not make the instance in time",
    "sandbox": "no sandbox worker could take or keep the episode (a load, a worker the server lost)",
    "database": "the results database is unavailable",
    "capacity": "the server is full right now",
    "draining": "the server is stopping or restarting",
    "connection": "the connection to the server dropped or stalled and the episode could not be resumed",
    "server": "an unexpected fault in the server",
}


def infra_message(side: str, detail: Any) -> str:
    """The one-line message of an infrastructure failure on ``side`` (one of ``INFRA_SIDES``)."""
    if side not in INFRA_SIDES:
        raise ValueError(f"unknown infrastructure side {side!r}")
    return one_line(f"{INFRA_PREFIX} ({side}): {detail}")


def infra_side(message: Any) -> str | None:
    """The side named by an ``infra_message``, or None when ``message`` is not one (an agent's or client's error)."""
    text = str(message)
    if not text.startswith(INFRA_PREFIX + " ("):
        return None
    side = text[len(INFRA_PREFIX) + 2 :].partition(")")[0]
    return side if side in INFRA_SIDES else None


class InfrastructureError(RuntimeError):
    """An episode (or a step) failed for a reason that is not the agent's: the server, its sandbox, its database, a
    full or draining server, or the connection. Harnesses record it as an infrastructure error, never as a score: they
    retry it where that is safe and leave it out of every mean (docs/CONTRACT.md).

    ``side`` is one of ``INFRA_SIDES``; ``started`` says whether the agent had seen the episode's first observation
    (an episode lost before that is voided and may be reset again, even in a counted run)."""

    def __init__(self, side: str, message: str, *, started: bool = False):
        super().__init__(message if infra_side(message) else infra_message(side, message))
        self.side = side if side in INFRA_SIDES else "server"
        self.started = started
