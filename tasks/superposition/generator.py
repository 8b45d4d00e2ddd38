"""Generator for superposition: a toy model of superposition (Elhage et al. 2022) with its geometry
set by construction.

The model: h = W x (n sparse features into m < n dimensions), x' = ReLU(W^T h + b). Represented
features are arranged in groups that share dimensions -- antipodal pairs (2 features in 1 dim),
triangles and pentagons (3 or 5 in 2 dims), tetrahedra (4 in 3 dims), each polytope slightly
irregular -- plus features with a dedicated dimension; the groups' subspaces are orthogonal to each
other. Unrepresented features are tiny columns, or columns as large as the represented ones whose
bias switches them off (so column norms alone mislead). Dense noise on every weight blurs all
thresholds a little.

Operational definitions (stated in the prompt, checked here with margins on the final weights):
- feature i is represented iff model(e_i)[i] - model(0)[i] >= 0.5;
- two represented features share dimensions iff |cos(W[:, i], W[:, j])| >= 0.2; groups are the
  connected components of that relation with at least 2 features.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import ToySuperposition
from ..base import Instance
from ..rng import Stream, quantise
from . import prompt

TASK_ID = "superposition"
VERSION = "1"
SHAPES = {  # name: (features, dims)
    "pair": (2, 1),
    "triangle": (3, 2),
    "pentagon": (5, 2),
    "tetrahedron": (4, 3),
}
LEVELS = {  # features, hidden dims, groups (lo, hi), shapes, dedicated (lo, hi), noise
    "easy": (20, 12, (2, 3), ("pair", "triangle"), (2, 3), 0.005),
    "medium": (28, 15, (3, 4), ("pair", "triangle", "pentagon"), (2, 4), 0.01),
    "hard": (36, 22, (4, 5), ("pair", "triangle", "pentagon", "tetrahedron"), (2, 4), 0.015),
}  # hidden dims: enough for the largest plan plus spare dimensions, the same for every seed
REPRESENTED, SHARED = 0.5, 0.2  # the prompt's thresholds
N_PROBE, DENSITY = 512, 0.05


def answer_schema(level: str) -> dict:
    n = LEVELS[level][0]
    feature = {"type": "integer", "minimum": 0, "maximum": n - 1}
    return {
        "type": "object",
        "properties": {
            "represented": {"type": "array", "items": feature, "uniqueItems": True},
            "groups": {"type": "array", "items": {"type": "array", "items": feature, "minItems": 2}},
        },
        "required": ["represented", "groups"],
        "description": "the represented features, and the groups of represented features that share dimensions",
        "x-kind": AnswerKind.FEATURES_GROUPS,
        "x-universe": n,
        "x-k-max": n,
    }


def _polytope(s: Stream, shape: str) -> np.ndarray:
    """Unit vectors [k, dims] of a slightly irregular polytope."""
    if shape == "pair":
        return np.array([[1.0], [-1.0]])
    if shape in ("triangle", "pentagon"):
        k = SHAPES[shape][0]
        angles = [2 * math.pi * i / k + math.radians(s.fraction(-6.0, 6.0)) for i in range(k)]
        return np.array([[math.cos(a), math.sin(a)] for a in angles])
    vertices = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=float)
    vertices += s.normal(4, 3, scale=0.05)
    return vertices / np.linalg.norm(vertices, axis=1, keepdims=True)


def behaviour(model: ToySuperposition) -> tuple[np.ndarray, np.ndarray]:
    """(increase of each feature's own output from 0 to its one-hot input, cosine matrix of W's columns)."""
    n = model.W.shape[1]
    with torch.no_grad():
        increase = (model(torch.eye(n)).diagonal() - model(torch.zeros(1, n))[0]).double().numpy()
        w = model.W.double()
        unit = w / w.norm(dim=0, keepdim=True).clamp_min(1e-12)
        cos = (unit.T @ unit).numpy()
    return increase, cos


def groups_of(represented: list[int], cos: np.ndarray) -> list[list[int]]:
    """Connected components (size >= 2) of |cos| >= SHARED among the represented features."""
    left, out = set(represented), []
    while left:
        stack, comp = [min(left)], set()
        while stack:
            i = stack.pop()
            if i in comp:
                continue
            comp.add(i)
            stack.extend(j for j in left if j not in comp and abs(cos[i, j]) >= SHARED)
        left -= comp
        if len(comp) >= 2:
            out.append(sorted(comp))
    return sorted(out)


def _build(s: Stream, level: str) -> tuple[ToySuperposition, list[int], list[list[int]]]:
    n, m, (g_lo, g_hi), shapes, (d_lo, d_hi), noise = LEVELS[level]
    plan = [s.pick(shapes) for _ in range(s.between(g_lo, g_hi))]
    dedicated = s.between(d_lo, d_hi)
    used = sum(SHAPES[p][0] for p in plan) + dedicated
    n_dead = n - used
    n_killed = (2 * n_dead) // 3  # most dead features are large columns switched off by their bias
    basis = s.orthogonal(m)
    order = s.permutation(n)  # feature index of each planted slot
    w, b = np.zeros((m, n)), np.zeros(n)
    slot, dim = 0, 0
    groups = []
    for shape in plan:
        k, d = SHAPES[shape]
        vectors = _polytope(s, shape)
        members = []
        for v in vectors:
            f = order[slot]
            w[:, f] = (basis[:, dim : dim + d] @ v) * s.fraction(1.0, 1.15)
            members.append(f)
            slot += 1
        dots = w[:, members].T @ w[:, members]
        for i, f in enumerate(members):
            worst = max(0.0, max(dots[i, j] for j in range(k) if j != i))
            b[f] = -worst - s.fraction(0.02, 0.08)
        groups.append(sorted(members))
        dim += d
    for _ in range(dedicated):
        f = order[slot]
        w[:, f] = basis[:, dim] * s.fraction(0.85, 1.15)
        b[f] = -s.fraction(0.0, 0.1)
        slot, dim = slot + 1, dim + 1
    for i in range(n_dead):  # dead: tiny, or moderate but switched off by the bias
        f = order[slot + i]
        direction = s.normal(m)
        direction /= np.linalg.norm(direction)
        if i < n_killed:
            norm = s.fraction(0.85, 1.15)  # as large as a represented column
            w[:, f], b[f] = direction * norm, -(norm**2) - s.fraction(0.1, 0.3)
        else:
            w[:, f], b[f] = direction * s.fraction(0.05, 0.3), s.fraction(-0.05, 0.05)
    model = ToySuperposition(n, m)
    with torch.no_grad():
        model.W.copy_(torch.from_numpy(quantise(w + s.normal(m, n, scale=noise))))
        model.b.copy_(torch.from_numpy(quantise(b + s.normal(n, scale=noise))))
    represented = sorted(order[:used])
    return model.eval(), represented, sorted(groups)


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n, m = LEVELS[level][:2]
    while True:  # deterministic rejection sampling until the stated rules hold with a margin
        model, represented, groups = _build(s, level)
        increase, cos = behaviour(model)
        dead = [i for i in range(n) if i not in represented]
        rep_ok = min(increase[represented]) >= 0.6 and max(increase[dead]) <= 0.35
        inside = [abs(cos[i, j]) for g in groups for i in g for j in g if i < j]
        member = {i: gi for gi, g in enumerate(groups) for i in g}
        across = [abs(cos[i, j]) for i in represented for j in represented
                  if i < j and not (i in member and j in member and member[i] == member[j])]  # fmt: skip
        if rep_ok and min(inside) >= 0.28 and max(across) <= 0.12 and groups_of(represented, cos) == groups:
            break
    x = torch.from_numpy(quantise(s.uniform(N_PROBE, n) * (s.uniform(N_PROBE, n) < DENSITY)))
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model,
        probe={"x": x},
        config={"kind": "toy-superposition", "n_features": n, "d_hidden": m},
        prompt=prompt.TEXT.format(n=n, m=m, n_probe=N_PROBE, last=n - 1, rep=REPRESENTED, shared=SHARED),
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.FEATURES_GROUPS, "n": n, "represented": represented, "groups": groups},
    )
