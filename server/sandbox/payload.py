"""What a worker receives for a session: the architecture record, JSON probe values, helper names and
safetensors bytes.

Built in the server from an instance; the truth, the seed and the prompt are left behind. The
sandbox's contract with the rest of the package is this payload and ``mechsandbox.arch`` (model
classes, records, helper objects): nothing under ``server/sandbox/`` imports the task framework or the
artifact code (tests/test_sandbox_contract.py checks the import graph), so a hardened worker never
loads a generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from safetensors.torch import save
from torch import nn

from ...arch import describe, helpers_for, public_tensors


class PublicParts(Protocol):
    """The public fields of a task instance that a session gets (``tasks.Instance`` has them)."""

    model: nn.Module
    probe: dict[str, Any]


@dataclass(frozen=True)
class ModelPayload:
    header: dict[str, Any]  # {"arch": record, "probe": {...}, "helpers": [names in arch.HELPERS]}
    blob: bytes  # safetensors of model.* and probe.* tensors

    @classmethod
    def from_instance(cls, inst: PublicParts) -> ModelPayload:
        tensors, other = public_tensors(inst.model, inst.probe)
        header = {"arch": describe(inst.model), "probe": other, "helpers": helpers_for(inst.model)}
        return cls(header, save(tensors))
