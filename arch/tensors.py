"""The public tensors of a model and its probe data, under the names artifacts and payloads share.

Why here: the canonical artifacts (``export.py``) and the sandbox payload (``server/sandbox/
payload.py``) store the same thing -- ``model.*`` weights and ``probe.*`` inputs in one safetensors
file, other probe values as JSON -- and the sandbox worker reads it back. Keeping the naming in the
model layer lets both sides use it without the artifact code depending on the server or the sandbox
depending on the task framework.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

MODEL_PREFIX = "model."
PROBE_PREFIX = "probe."


def json_safe(value: Any) -> Any:
    """Tuples become lists, recursively through tuples and dicts (lists are kept as they are)."""
    if isinstance(value, tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value


def public_tensors(model: nn.Module, probe: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's weights (``model.*``) and the probe's tensors (``probe.*``), and the other probe values."""
    tensors = {MODEL_PREFIX + k: v.detach().contiguous() for k, v in model.state_dict().items()}
    other: dict[str, Any] = {}
    for key, value in probe.items():
        if isinstance(value, torch.Tensor):
            tensors[PROBE_PREFIX + key] = value.detach().contiguous()
        else:
            other[key] = json_safe(value)
    return tensors, other


def split_public_tensors(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The inverse of :func:`public_tensors` for tensors: (the model's state dict, the probe's tensors)."""
    state = {k.removeprefix(MODEL_PREFIX): v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    probe = {k.removeprefix(PROBE_PREFIX): v for k, v in tensors.items() if k.startswith(PROBE_PREFIX)}
    return state, probe


#: Values that are array data by themselves: Python numbers, strings, None (numpy scalars are checked by class).
PLAIN_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
_ARRAYS = (torch.Tensor, np.ndarray, np.generic)
_SEQUENCES = frozenset({list, tuple, torch.Size})
MAX_NESTING = 32  # numpy's own limit on dimensions


def is_plain_array_data(value: Any, depth: int = 0) -> bool:
    """A tensor, an ndarray, a number, a string or a plain (nested) list/tuple of them.

    Why: array constructors honour interface protocols (``__array_interface__``, ``__array_struct__``,
    ``__array__``, ``__dlpack__``, the buffer protocol) on any other object, and an object that answers them with a
    chosen address gives raw reads and writes of the process's memory. The sandbox hands array constructors only
    values this accepts; exact types (never subclasses of the containers or numbers), so nothing user-defined
    can answer a protocol on the way. A flat list of numbers is checked by type at C speed (10,000 floats: about
    0.1-0.4 ms, against 0.5 ms for ``np.array`` itself)."""
    kind = type(value)
    if kind in PLAIN_SCALARS or kind is range or isinstance(value, _ARRAYS):
        return True
    if kind not in _SEQUENCES or depth >= MAX_NESTING:
        return False
    if PLAIN_SCALARS.issuperset(map(type, value)):  # the common case (numbers), at C speed
        return True
    return all(type(item) in PLAIN_SCALARS or is_plain_array_data(item, depth + 1) for item in value)
