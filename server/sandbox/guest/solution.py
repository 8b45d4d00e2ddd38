"""Answers from the sandbox namespace (``solution_from``): tensors and arrays become JSON, then the
shared bounded-JSON check (``jsonvalue.py``) applies. Runs in the worker; the server checks the
result again with ``check_json_value`` alone, so neither side trusts the other's input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ....jsonvalue import NOT_CONVERTED, AnswerError, AnswerLimits, check_json_value

__all__ = ["AnswerError", "AnswerLimits", "to_json_answer"]

_NUMPY_SCALARS = (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.bool_,
)  # fmt: skip


def _numeric(v: Any, budget: int) -> Any:
    """Exact tensors, arrays and numpy scalars as builtin values (never subclasses)."""
    t = type(v)
    if t in _NUMPY_SCALARS:
        return v.item()
    if t not in (torch.Tensor, torch.nn.Parameter, np.ndarray):
        return NOT_CONVERTED
    size = v.size if t is np.ndarray else v.numel()
    if size > budget:
        raise AnswerError("the answer has more than the allowed number of items")
    if t is np.ndarray:
        if v.dtype.kind not in "biuf":
            raise AnswerError("arrays in the answer must hold numbers")
        return v.tolist()
    if v.is_meta:
        raise AnswerError("a meta tensor has a shape but no values; send a tensor made on the CPU")
    if v.is_complex() or v.is_sparse:
        raise AnswerError("tensors in the answer must be dense and real")
    return v.detach().cpu().tolist()


def to_json_answer(value: Any, limits: AnswerLimits | None = None) -> Any:
    return check_json_value(value, limits or AnswerLimits(), convert=_numeric)
