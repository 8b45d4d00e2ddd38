"""What a worker receives for a session: the architecture record, JSON probe values, safetensors bytes.

Built in the server from an ``Instance``; the truth, the seed and the prompt are left behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from safetensors.torch import save

from ...arch import describe, public_tensors
from ...tasks import Instance


@dataclass(frozen=True)
class ModelPayload:
    header: dict[str, Any]  # {"arch": ..., "probe": {...}}
    blob: bytes  # safetensors of model.* and probe.* tensors

    @classmethod
    def from_instance(cls, inst: Instance) -> ModelPayload:
        tensors, other = public_tensors(inst.model, inst.probe)
        return cls({"arch": describe(inst.model), "probe": other}, save(tensors))
