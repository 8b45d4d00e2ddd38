"""The public model layer: the classes agents probe, their JSON records, and the session helpers.

Why a package of its own: the sandbox worker needs the model classes to rebuild a public model,
but must not import the task framework (generators compute the truth, and importing them all would
load twelve families into every hardened process). Families and the sandbox both depend on this
layer; it depends on neither (torch and numpy only).

- ``hooked``: the TransformerLens-style ``HookedTransformer``, ``HookedConfig``, ``ActivationCache``
  and the ``utils`` helper object.
- ``networks``: the small networks (``GatedMLP``, ``SubspaceMLP``, ``ToySuperposition``,
  ``ModAddMLP``, ``EmbedMLP``, and ``relu_mlp`` for the plain ``nn.Sequential`` of dead-neurons).
- ``registry``: architecture name -> how to describe, build and warm up a model, and the helper
  objects (``HELPERS``) a session may get.
- ``tensors``: the ``model.*`` / ``probe.*`` tensor naming shared by artifacts and sandbox payloads.
"""

from .hooked import ActivationCache, FactoredMatrix, HookedConfig, HookedTransformer, Tokenizer, utils
from .networks import EmbedMLP, GatedMLP, ModAddMLP, SubspaceMLP, ToySuperposition, relu_mlp
from .registry import (
    ARCHITECTURES,
    HELPERS,
    Architecture,
    architecture_of,
    build,
    build_with,
    describe,
    helper_namespace,
    helpers_for,
)
from .tensors import json_safe, public_tensors, split_public_tensors

__all__ = [
    "ARCHITECTURES",
    "HELPERS",
    "ActivationCache",
    "Architecture",
    "EmbedMLP",
    "FactoredMatrix",
    "GatedMLP",
    "HookedConfig",
    "HookedTransformer",
    "ModAddMLP",
    "SubspaceMLP",
    "Tokenizer",
    "ToySuperposition",
    "architecture_of",
    "build",
    "build_with",
    "describe",
    "helper_namespace",
    "helpers_for",
    "json_safe",
    "public_tensors",
    "relu_mlp",
    "split_public_tensors",
    "utils",
]
