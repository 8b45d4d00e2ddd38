"""The model registry: every public architecture by name, as a JSON record of shapes and back.

Why: a sandbox worker must rebuild the public model without pickle and without the generator (which
would also compute the truth, and would pull all twelve families into the hardened process).
``describe(model)`` turns a model into a small record (``{"class": name, ...shapes}``); ``build``
makes an untrained model of that record, into which the worker loads the safetensors weights. Only
shapes and public config travel; no seed, no truth.

Each entry also carries a *tiny* record and a sample input, so the zygote can warm up every
architecture through the real load path before it forks workers, and the names of the helper
objects a session gets besides the model (``utils`` for the hooked transformer). A worker resolves
helper names here only, so a payload can never name an arbitrary object.

Adding an architecture: put the class in ``networks.py`` (or its own module), add an entry below;
``tests/test_sandbox_contract.py`` checks that it round-trips and that the zygote warms it up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .hooked import HookedConfig, HookedTransformer, utils
from .networks import EmbedMLP, GatedMLP, ModAddMLP, SubspaceMLP, ToySuperposition, relu_mlp

Record = dict[str, Any]

HELPERS: dict[str, Any] = {"utils": utils}
"""Every helper object a session may get, by the name it has in the sandbox namespace."""


@dataclass(frozen=True)
class Architecture:
    """One public model class as the sandbox sees it."""

    name: str  # the record's "class"
    matches: Callable[[nn.Module], bool]
    shapes: Callable[[Any], Record]  # model -> the record's fields besides "class"
    make: Callable[[Record], nn.Module]  # record -> untrained model
    tiny: Record  # shapes of a small model, for the zygote's warm-up
    sample: Callable[[Record], torch.Tensor]  # a small input batch for a model of the given record
    helpers: tuple[str, ...] = ()

    def record(self, shapes: Record) -> Record:
        return {"class": self.name, **shapes}

    def tiny_record(self) -> Record:
        return self.record(self.tiny)


def _of_type(cls: type[nn.Module]) -> Callable[[nn.Module], bool]:
    return lambda model: isinstance(model, cls)


def _is_relu_mlp(model: nn.Module) -> bool:
    return isinstance(model, nn.Sequential) and [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]


def _ints(record: Record, *keys: str) -> list[int]:
    return [int(record[k]) for k in keys]


def _token_pairs(record: Record) -> torch.Tensor:
    return torch.randint(0, int(record["p"]), (3, 2))


_EMBED_SHAPES = ("p", "d_model", "d_mlp")

_ENTRIES = (
    Architecture(
        name="HookedTransformer",
        matches=_of_type(HookedTransformer),
        shapes=lambda m: {"cfg": m.cfg.to_dict()},
        make=lambda r: HookedTransformer(HookedConfig(**r["cfg"])),
        tiny={"cfg": dict(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=10, n_ctx=5, d_mlp=6, attn_only=False)},
        sample=lambda r: torch.randint(0, int(r["cfg"]["d_vocab"]), (2, int(r["cfg"]["n_ctx"]))),
        helpers=("utils",),
    ),
    Architecture(
        name="SubspaceMLP",
        matches=_of_type(SubspaceMLP),
        shapes=lambda m: {
            "n_in": m.enc.in_features,
            "d_hidden": m.enc.out_features,
            "d_mlp": m.mlp_in.out_features,
            "n_classes": m.out.out_features,
        },
        make=lambda r: SubspaceMLP(*_ints(r, "n_in", "d_hidden", "d_mlp", "n_classes")),
        tiny={"n_in": 4, "d_hidden": 6, "d_mlp": 4, "n_classes": 2},
        sample=lambda r: torch.rand(3, int(r["n_in"])),
    ),
    Architecture(
        name="ToySuperposition",
        matches=_of_type(ToySuperposition),
        shapes=lambda m: {"n_features": m.W.shape[1], "d_hidden": m.W.shape[0]},
        make=lambda r: ToySuperposition(*_ints(r, "n_features", "d_hidden")),
        tiny={"n_features": 5, "d_hidden": 2},
        sample=lambda r: torch.rand(3, int(r["n_features"])),
    ),
    Architecture(
        name="ModAddMLP",
        matches=_of_type(ModAddMLP),
        shapes=lambda m: {
            "p": m.embed.num_embeddings,
            "d_model": m.embed.embedding_dim,
            "d_mlp": m.mlp.left.out_features,
        },
        make=lambda r: ModAddMLP(*_ints(r, *_EMBED_SHAPES)),
        tiny={"p": 5, "d_model": 4, "d_mlp": 6},
        sample=_token_pairs,
    ),
    Architecture(
        name="GatedMLP",
        matches=_of_type(GatedMLP),
        shapes=lambda m: {"n_in": m.left.in_features, "d_hidden": m.left.out_features, "n_out": m.out.out_features},
        make=lambda r: GatedMLP(*_ints(r, "n_in", "d_hidden", "n_out")),
        tiny={"n_in": 4, "d_hidden": 6, "n_out": 2},
        sample=lambda r: torch.rand(3, int(r["n_in"])),
    ),
    Architecture(
        name="EmbedMLP",
        matches=_of_type(EmbedMLP),
        shapes=lambda m: {
            "p": m.embed.num_embeddings,
            "d_model": m.embed.embedding_dim,
            "d_mlp": m.mlp[0].out_features,
        },
        make=lambda r: EmbedMLP(*_ints(r, *_EMBED_SHAPES)),
        tiny={"p": 5, "d_model": 4, "d_mlp": 6},
        sample=_token_pairs,
    ),
    Architecture(
        name="ReluMLP",  # dead-neurons: a plain nn.Sequential, so its state_dict keys are 0.* and 2.*
        matches=_is_relu_mlp,
        shapes=lambda m: {"sizes": [m[0].in_features, m[0].out_features, m[2].out_features]},
        make=lambda r: relu_mlp(*(int(v) for v in r["sizes"])),
        tiny={"sizes": [4, 6, 2]},
        sample=lambda r: torch.rand(3, int(r["sizes"][0])),
    ),
)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in _ENTRIES}
"""Every public architecture by record name, in the order ``describe`` tries them."""


def architecture_of(model: nn.Module) -> Architecture:
    for arch in ARCHITECTURES.values():
        if arch.matches(model):
            return arch
    raise TypeError(f"no architecture record for {type(model).__name__}")


def describe(model: nn.Module) -> Record:
    """The JSON architecture record of a family's public model."""
    arch = architecture_of(model)
    return arch.record(arch.shapes(model))


def build(record: Record) -> nn.Module:
    """An untrained model of the recorded class and shapes (weights are loaded afterwards)."""
    name = record.get("class")
    if not isinstance(name, str) or name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}")
    return ARCHITECTURES[name].make(record)


def build_with(record: Record, state: dict[str, torch.Tensor]) -> nn.Module:
    """A model of the recorded class whose parameters *are* ``state``'s tensors (assigned, not copied).

    Why: a sandbox worker's weights are a copy-on-write mapping of the model file; building the model first would
    allocate and zero-fill every parameter only to drop it (37 MB of page faults for head-roles hard, most of a
    warm reset). So the modules are made on the meta device, the tensors assigned, and what the weights do not
    carry (the causal mask) is rebuilt by the module that owns it (``rebuild_buffers``)."""
    with torch.device("meta"):
        model = build(record)
    model.load_state_dict(state, assign=True)
    for module in model.modules():
        rebuild = getattr(module, "rebuild_buffers", None)
        if callable(rebuild):
            rebuild()
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the model file leaves {left[:3]} unset")
    return model


def helpers_for(model: nn.Module) -> list[str]:
    """The names of the helper objects a session on this model gets (e.g. ``["utils"]``)."""
    return list(architecture_of(model).helpers)


def helper_namespace(names: Iterable[Any]) -> dict[str, Any]:
    """Helper objects by name, from ``HELPERS`` only: an unknown or non-string name is an error."""
    names = list(names)
    unknown = [n for n in names if not isinstance(n, str) or n not in HELPERS]
    if unknown:
        raise ValueError(f"unknown sandbox helpers {unknown!r}; known: {sorted(HELPERS)}")
    return {n: HELPERS[n] for n in names}
