"""Bounded JSON values: the one check every answer passes, on either side of the wire.

Why: a grader that compares live objects can be fooled (an ``__eq__`` that is always True, NaN,
self-referential lists, ten million items). ``check_json_value`` accepts only exact builtin types,
bounded in size and depth, with finite numbers and valid Unicode, and returns a fresh copy. It has
no dependencies, so the wire models (and the client) can use it; the sandbox worker adds a hook for
tensors and arrays (``server/sandbox/guest/solution.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AnswerLimits:
    max_items: int = 100_000
    max_depth: int = 8
    max_string: int = 1024


class AnswerError(ValueError):
    """The value cannot be an answer; the message says why, in one line."""


NOT_CONVERTED = object()


def check_json_value(
    value: Any, limits: AnswerLimits | None = None, convert: Callable[[Any, int], Any] | None = None
) -> Any:
    """A JSON-safe copy of ``value`` or ``AnswerError``.

    ``convert(v)`` may turn a non-builtin value into builtin ones (or return ``NOT_CONVERTED``).
    """
    limits = limits or AnswerLimits()
    budget = [limits.max_items]

    def walk(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise AnswerError(f"the answer has more than {limits.max_items} items")
        if depth > limits.max_depth:
            raise AnswerError(f"the answer is nested deeper than {limits.max_depth} levels")
        t = type(v)
        if v is None or t is bool:
            return v
        if t is int:
            if abs(v) >= 2**53:
                raise AnswerError("integers in the answer must be smaller than 2**53")
            return v
        if t is float:
            if not math.isfinite(v):
                raise AnswerError("numbers in the answer must be finite")
            return v
        if t is str:
            if len(v) > limits.max_string:
                raise AnswerError(f"strings in the answer must be at most {limits.max_string} characters")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise AnswerError("strings in the answer must be valid Unicode text") from None
            return v
        if t in (list, tuple):
            return [walk(x, depth + 1) for x in v]
        if t is dict:
            out = {}
            for k, x in v.items():
                if type(k) is not str:
                    raise AnswerError("dictionary keys in the answer must be strings")
                out[walk(k, depth + 1)] = walk(x, depth + 1)
            return out
        if convert is not None:
            converted = convert(v, budget[0])
            if converted is not NOT_CONVERTED:
                budget[0] += 1
                return walk(converted, depth)
        raise AnswerError(
            f"an answer cannot contain a {t.__name__!r}: use ints, floats, strings, lists, dicts, tensors or arrays"
        )

    return walk(value, 0)
