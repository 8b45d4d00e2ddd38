"""Answer values: conversion of a sandbox variable to bounded JSON, and the same check on JSON.

Why: a grader that compares live objects can be fooled (a snippet class whose ``__eq__`` is always
True, NaN, self-referential lists, a list of ten million items). ``to_json_answer`` accepts only
exact builtin types (plus exact tensors and arrays, converted by us with ``tolist``), bounded in size
and depth, with finite numbers. The worker converts ``solution_from`` with it and the server runs it
again on what crosses the pipe, so neither side trusts the other's input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class AnswerLimits:
    max_items: int = 100_000
    max_depth: int = 8
    max_string: int = 1024


class AnswerError(ValueError):
    """The value cannot be an answer; the message says why, in one line."""


_NUMPY_SCALARS = (
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
)


def to_json_answer(value: Any, limits: AnswerLimits = AnswerLimits()) -> Any:
    """A JSON-safe copy of ``value`` or ``AnswerError``."""
    budget = [limits.max_items]

    def convert(v: Any, depth: int) -> Any:
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
        if t in _NUMPY_SCALARS:
            return convert(v.item(), depth)
        if t in (list, tuple):
            return [convert(x, depth + 1) for x in v]
        if t is dict:
            out = {}
            for k, x in v.items():
                if type(k) is not str:
                    raise AnswerError("dictionary keys in the answer must be strings")
                out[convert(k, depth + 1)] = convert(x, depth + 1)
            return out
        if t in (torch.Tensor, torch.nn.Parameter, np.ndarray):
            size = v.numel() if t is not np.ndarray else v.size
            if size > budget[0]:
                raise AnswerError(f"the answer has more than {limits.max_items} items")
            if t is np.ndarray and v.dtype.kind not in "biuf":
                raise AnswerError("arrays in the answer must hold numbers")
            if t is not np.ndarray and (v.is_complex() or v.is_sparse):
                raise AnswerError("tensors in the answer must be dense and real")
            data = v.detach().cpu().tolist() if t is not np.ndarray else v.tolist()
            budget[0] += 1
            return convert(data, depth)
        raise AnswerError(
            f"an answer cannot contain a {t.__name__!r}: use ints, floats, strings, lists, dicts, tensors or arrays"
        )

    return convert(value, 0)
