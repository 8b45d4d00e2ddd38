"""Public model architectures as plain JSON, so a sandbox worker can rebuild a model from bytes.

Why: a worker must get the public model without pickle and without the generator (which would
also compute the truth). ``describe(model)`` turns each family's model class into a small JSON
record of its shapes; ``build(record)`` makes an untrained model of the same class, into which the
worker loads the safetensors weights. Only shapes and public config travel; no seed, no truth.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .bilinear import GatedMLP
from .causal_subspace.generator import SubspaceMLP
from .fourier_frequencies.generator import EmbedMLP
from .hooked import HookedConfig, HookedTransformer
from .modular_addition.generator import ModAddMLP
from .superposition.generator import ToySuperposition


def describe(model: nn.Module) -> dict[str, Any]:
    """The JSON architecture record of a family's public model."""
    if isinstance(model, HookedTransformer):
        return {"class": "HookedTransformer", "cfg": model.cfg.to_dict()}
    if isinstance(model, SubspaceMLP):
        return {
            "class": "SubspaceMLP",
            "n_in": model.enc.in_features,
            "d_hidden": model.enc.out_features,
            "d_mlp": model.mlp_in.out_features,
            "n_classes": model.out.out_features,
        }
    if isinstance(model, ToySuperposition):
        return {"class": "ToySuperposition", "n_features": model.W.shape[1], "d_hidden": model.W.shape[0]}
    if isinstance(model, ModAddMLP):
        return {
            "class": "ModAddMLP",
            "p": model.embed.num_embeddings,
            "d_model": model.embed.embedding_dim,
            "d_mlp": model.mlp.left.out_features,
        }
    if isinstance(model, GatedMLP):
        return {
            "class": "GatedMLP",
            "n_in": model.left.in_features,
            "d_hidden": model.left.out_features,
            "n_out": model.out.out_features,
        }
    if isinstance(model, EmbedMLP):
        return {
            "class": "EmbedMLP",
            "p": model.embed.num_embeddings,
            "d_model": model.embed.embedding_dim,
            "d_mlp": model.mlp[0].out_features,
        }
    if isinstance(model, nn.Sequential) and [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]:
        return {"class": "ReluMLP", "sizes": [model[0].in_features, model[0].out_features, model[2].out_features]}
    raise TypeError(f"no architecture record for {type(model).__name__}")


def build(record: dict[str, Any]) -> nn.Module:
    """An untrained model of the recorded class and shapes (weights are loaded afterwards)."""
    kind = record.get("class")
    if kind == "HookedTransformer":
        return HookedTransformer(HookedConfig(**record["cfg"]))
    if kind == "GatedMLP":
        return GatedMLP(int(record["n_in"]), int(record["d_hidden"]), int(record["n_out"]))
    if kind == "SubspaceMLP":
        sizes = (int(record[k]) for k in ("n_in", "d_hidden", "d_mlp", "n_classes"))
        return SubspaceMLP(*sizes)
    if kind == "ToySuperposition":
        return ToySuperposition(int(record["n_features"]), int(record["d_hidden"]))
    if kind == "ModAddMLP":
        return ModAddMLP(int(record["p"]), int(record["d_model"]), int(record["d_mlp"]))
    if kind == "EmbedMLP":
        return EmbedMLP(int(record["p"]), int(record["d_model"]), int(record["d_mlp"]))
    if kind == "ReluMLP":
        n_in, hidden, n_out = (int(v) for v in record["sizes"])
        return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
    raise ValueError(f"unknown architecture {kind!r}")
