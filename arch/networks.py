"""The small non-transformer networks that families plant their mechanisms in.

Why here and not beside each generator: a sandbox worker rebuilds the public model from its shapes
(``registry.py``), so it needs these classes, and importing them from a family's ``generator.py``
would pull the generator (and the task framework with it) into the hardened worker. Only the
forward pass and the parameter layout live here; how weights are planted stays in ``tasks/``.

Parameter names are part of the artifacts (they are the safetensors keys), so renaming a submodule
changes every artifact's bytes.
"""

from __future__ import annotations

import torch
from torch import nn


def relu_mlp(n_in: int, d_hidden: int, n_out: int) -> nn.Sequential:
    """Linear-ReLU-Linear as a plain ``nn.Sequential`` (keys ``0.weight`` ... ``2.bias``; dead-neurons)."""
    return nn.Sequential(nn.Linear(n_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_out))


class GatedMLP(nn.Module):
    """y = out((left(x) * right(x))); ``hidden`` is an identity hook point on the product."""

    def __init__(self, n_in: int, d_hidden: int, n_out: int):
        super().__init__()
        self.left = nn.Linear(n_in, d_hidden)
        self.right = nn.Linear(n_in, d_hidden)
        self.hidden = nn.Identity()
        self.out = nn.Linear(d_hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(self.left(x) * self.right(x)))


class SubspaceMLP(nn.Module):
    """logits = out(relu(mlp_in(hidden(enc(x))))); ``hidden`` is an identity hook point on h."""

    def __init__(self, n_in: int, d_hidden: int, d_mlp: int, n_classes: int):
        super().__init__()
        self.enc = nn.Linear(n_in, d_hidden)
        self.hidden = nn.Identity()
        self.mlp_in = nn.Linear(d_hidden, d_mlp)
        self.out = nn.Linear(d_mlp, n_classes)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The part after the hidden layer: logits from hidden states h [batch, d_hidden]."""
        return self.out(torch.relu(self.mlp_in(h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.enc(x)))


class ToySuperposition(nn.Module):
    """x' = ReLU(W^T W x + b): n features through m hidden dimensions and back (tied weights)."""

    def __init__(self, n_features: int, d_hidden: int):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(d_hidden, n_features))
        self.b = nn.Parameter(torch.zeros(n_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [batch, n_features] -> reconstruction [batch, n_features]."""
        return torch.relu((x @ self.W.T) @ self.W + self.b)


class ModAddMLP(nn.Module):
    """logits(a, b) = unembed(mlp([embed(a), embed(b)])): a one-hidden-layer modular adder."""

    def __init__(self, p: int, d_model: int, d_mlp: int):
        super().__init__()
        self.embed = nn.Embedding(p, d_model)
        self.mlp = GatedMLP(2 * d_model, d_mlp, d_model)
        self.unembed = nn.Linear(d_model, p, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [batch, 2] integer pairs (a, b) -> logits [batch, p] over c = (a + b) mod p."""
        return self.unembed(self.mlp(self.embed(tokens).flatten(-2)))


class EmbedMLP(nn.Module):
    """logits(a, b) = unembed(mlp(embed(a) + embed(b))): a modular-arithmetic-shaped network."""

    def __init__(self, p: int, d_model: int, d_mlp: int):
        super().__init__()
        self.embed = nn.Embedding(p, d_model)
        self.mlp = relu_mlp(d_model, d_mlp, d_model)
        self.unembed = nn.Linear(d_model, p, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [batch, 2] integer pairs (a, b) -> logits [batch, p]."""
        resid = self.embed(tokens).sum(dim=-2)
        return self.unembed(resid + self.mlp(resid))
