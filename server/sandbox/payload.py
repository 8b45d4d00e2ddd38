"""What a worker receives for a session: the architecture record, JSON probe values, helper names and
safetensors bytes.

Built in the server from an instance; the truth, the seed and the prompt are left behind. The
sandbox's contract with the rest of the package is this payload and ``mechsandbox.arch`` (model
classes, records, helper objects): nothing under ``server/sandbox/`` imports the task framework or the
artifact code (tests/test_sandbox_contract.py checks the import graph), so a hardened worker never
loads a generator.

A payload keeps its bytes in a sealed memory file (``sealed.SealedBlob``): a reset hands the worker a
descriptor instead of pushing the bytes through its socket. The zygote's warm-up payloads keep plain bytes
(``sealed=False``: every worker would inherit their descriptors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from safetensors.torch import save
from torch import nn

from ...arch import describe, helpers_for, public_tensors
from .sealed import SealedBlob


class PublicParts(Protocol):
    """The public fields of a task instance that a session gets (``tasks.Instance`` has them)."""

    model: nn.Module
    probe: dict[str, Any]


@dataclass(frozen=True)
class ModelPayload:
    header: dict[str, Any]  # {"arch": record, "probe": {...}, "helpers": [names in arch.HELPERS]}
    data: bytes | SealedBlob  # safetensors of model.* and probe.* tensors, as bytes or in a sealed memory file

    @classmethod
    def from_instance(cls, inst: PublicParts, sealed: bool = True) -> ModelPayload:
        """``sealed``: keep the bytes in a sealed memory file (plain bytes where the system has none)."""
        tensors, other = public_tensors(inst.model, inst.probe)
        header = {"arch": describe(inst.model), "probe": other, "helpers": helpers_for(inst.model)}
        blob = save(tensors)
        return cls(header, (SealedBlob.create(blob) if sealed else None) or blob)

    @property
    def blob(self) -> bytes:
        """The safetensors bytes (read back from the memory file when sealed)."""
        return self.data.read() if isinstance(self.data, SealedBlob) else self.data

    @property
    def fd(self) -> int | None:
        """The sealed memory file's descriptor, or None when the payload holds plain bytes."""
        return self.data.fd if isinstance(self.data, SealedBlob) else None

    def reader(self) -> int | None:
        """A read-only descriptor of the sealed file for one worker (``SealedBlob.reader``; the caller closes it), or
        None: then the bytes go through the socket."""
        return self.data.reader() if isinstance(self.data, SealedBlob) else None
