"""Planting the gated (bilinear) MLP shared by multiplication-neuron and additive-bypass.

Each hidden unit computes h_j(x) = (l_j . x + p_j) * (r_j . x + q_j), a bilinear "GLU without the
nonlinearity", so one unit can be an exact product x_a * x_b, a square, a linear pass-through
(r_j = 0, q_j != 0) or a mixture of these. Every unit gets a planted job drawn from the same
catalogue with the same scales, so weight norms and sparsity do not single out the answer; medium
and hard add dense noise to every weight. A family plants its truth unit and its confusable
distractors; this module fills the rest, shuffles, checks the separation margin and builds the model
(the class itself, :class:`mechsandbox.arch.GatedMLP`, lives in the public model layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..arch import GatedMLP
from .rng import Stream, quantise

LO, HI = -1.0, 1.0
SIZES = {"easy": (8, 32, 4, 0.0), "medium": (10, 40, 5, 0.01), "hard": (12, 48, 6, 0.015)}  # n_in, d, n_out, noise
N_PROBE = 512


@dataclass
class Unit:
    """One planted unit: left/right weight vectors and biases (float64, before noise)."""

    left: np.ndarray
    right: np.ndarray
    p: float = 0.0
    q: float = 0.0


class Catalogue:
    """Planted unit jobs with random signed scales in [0.6, 1.4]."""

    def __init__(self, s: Stream, n_in: int):
        self.s, self.n = s, n_in

    def scale(self) -> float:
        return self.s.fraction(0.6, 1.4) * (1 if self.s.below(2) else -1)

    def e(self, i: int) -> np.ndarray:
        v = np.zeros(self.n)
        v[i] = 1.0
        return v

    def product(self, a: int, b: int) -> Unit:
        return Unit(self.e(a) * self.scale(), self.e(b) * self.scale())

    def square(self, a: int) -> Unit:
        return self.product(a, a)

    def linear(self, c: int) -> Unit:
        return Unit(self.e(c) * self.scale(), np.zeros(self.n), 0.0, self.scale())

    def near_product(self, a: int, b: int, d: int) -> Unit:
        """(x_a + eps x_d) * x_b with eps in [0.4, 0.7]: a product of inputs, but not of a and b."""
        eps = self.s.fraction(0.4, 0.7) * (1 if self.s.below(2) else -1)
        return Unit((self.e(a) + eps * self.e(d)) * self.scale(), self.e(b) * self.scale())

    def near_linear(self, c: int, d: int) -> Unit:
        """Linear in x_c plus a comparable share of another input."""
        eps = self.s.fraction(0.4, 0.7) * (1 if self.s.below(2) else -1)
        return Unit((self.e(c) + eps * self.e(d)) * self.scale(), np.zeros(self.n), 0.0, self.scale())

    def linear_times(self, c: int, e: int) -> Unit:
        """x_c * (beta + gamma x_e): pass-through of x_c mixed with the product x_c x_e."""
        gamma = self.scale()
        beta = gamma * self.s.fraction(0.5, 1.0)
        return Unit(self.e(c) * self.scale(), self.e(e) * gamma, 0.0, beta)

    def dense(self) -> Unit:
        k = 1.0 / np.sqrt(self.n)
        return Unit(
            self.s.normal(self.n, scale=k),
            self.s.normal(self.n, scale=k),
            self.s.fraction(-0.5, 0.5),
            self.s.fraction(-0.5, 0.5),
        )

    def random_job(self) -> Unit:
        """A filler unit with a real job: a random product, square, pass-through or dense mix."""
        kind = self.s.below(4)
        a, b = self.s.sample(self.n, 2)
        return [lambda: self.product(a, b), lambda: self.square(a), lambda: self.linear(a), self.dense][kind]()


def fit_r2(h: np.ndarray, feature: np.ndarray) -> np.ndarray:
    """Squared correlation of each column of h with one feature (the share one term explains)."""
    hc = h - h.mean(axis=0)
    fc = feature - feature.mean()
    num = (hc * fc[:, None]).sum(axis=0) ** 2
    den = (hc**2).sum(axis=0) * (fc**2).sum() + 1e-30
    return num / den


def build(
    s: Stream,
    level: str,
    planted: Callable[[Catalogue], tuple[Unit, list[Unit]]],
    feature: Callable[[np.ndarray], np.ndarray],
) -> tuple[GatedMLP, int, torch.Tensor]:
    """Plant (truth, distractors), fill, shuffle and add noise until the truth unit explains the
    target feature with R^2 >= 0.95 and no other unit exceeds 0.9 (deterministic rejection). The noise
    is small enough that the truth passes at any of its scales, so acceptance does not bias them.

    Returns the model, the truth unit's index and the probe inputs.
    """
    n_in, d, n_out, noise = SIZES[level]
    cat = Catalogue(s, n_in)
    check = s.uniform(4096, n_in, lo=LO, hi=HI)
    while True:
        truth, distractors = planted(cat)
        units = [truth, *distractors]
        units += [cat.random_job() for _ in range(d - len(units))]
        order = s.permutation(d)  # order[k] = position of planted unit k
        slots: list[Unit] = [units[0]] * d
        for k, pos in enumerate(order):
            slots[pos] = units[k]
        wl = np.stack([u.left for u in slots]) + s.normal(d, n_in, scale=noise)
        wr = np.stack([u.right for u in slots]) + s.normal(d, n_in, scale=noise)
        bl = np.array([u.p for u in slots]) + s.normal(d, scale=noise)
        br = np.array([u.q for u in slots]) + s.normal(d, scale=noise)
        wl, wr, bl, br = (quantise(a).astype(np.float64) for a in (wl, wr, bl, br))
        h = (check @ wl.T + bl) * (check @ wr.T + br)
        r2 = fit_r2(h, feature(check))
        j = order[0]
        if r2[j] >= 0.95 and np.delete(r2, j).max() <= 0.9:
            break
    model = GatedMLP(n_in, d, n_out)
    w_out = s.normal(n_out, d, scale=1.0 / np.sqrt(d))
    b_out = s.normal(n_out, scale=0.1)
    with torch.no_grad():
        for param, value in (
            (model.left.weight, wl),
            (model.left.bias, bl),
            (model.right.weight, wr),
            (model.right.bias, br),
            (model.out.weight, w_out),
            (model.out.bias, b_out),
        ):
            param.copy_(torch.from_numpy(quantise(value)))
    x = torch.from_numpy(quantise(s.uniform(N_PROBE, n_in, lo=LO, hi=HI)))
    return model.eval(), j, x


def config(level: str) -> dict:
    n_in, d, n_out, _ = SIZES[level]
    return {"kind": "gated-mlp", "n_in": n_in, "d_hidden": d, "n_out": n_out, "box": [LO, HI]}
