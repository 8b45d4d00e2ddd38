"""Generator for dead-neurons: an MLP with exactly dead inputs (easy/medium) or dead hidden units (hard).

Easy/medium: 2-6 input columns of the first layer are exactly zero; medium adds inputs whose
weights are 30-60x smaller than typical but nonzero (tiny-but-live distractors) and dense noise on
every live weight. Hard: 2-6 hidden units whose bias sits below minus the unit's largest possible
pre-activation on the box (dead by a margin), distractor units that fire on 1-6% of the box
(checked on a deterministic Monte-Carlo sample), unit scales that vary so neither bias nor norm
alone tells dead from rare.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...answer_kind import AnswerKind
from ...arch import relu_mlp
from ..base import Instance
from ..rng import Stream, quantise
from ..schemas import index_schema
from . import prompt

TASK_ID = "dead-neurons"
VERSION = "1"
K_MAX = 6
SIZES = {  # n_in, n_hidden, n_out, n_distractors (range)
    "easy": (32, 48, 4, (0, 0)),
    "medium": (40, 48, 4, (2, 6)),
    "hard": (16, 48, 4, (4, 8)),
}
LO, HI = -1.0, 1.0
N_PROBE = 256


def universe(level: str) -> int:
    n_in, n_hidden, _, _ = SIZES[level]
    return n_hidden if level == "hard" else n_in


def answer_schema(level: str) -> dict:
    what = "dead hidden units" if level == "hard" else "dead inputs"
    return index_schema(universe(level), K_MAX, f"indices of the {what}")


def _mlp(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> nn.Sequential:
    model = relu_mlp(w1.shape[1], w1.shape[0], w2.shape[0])
    with torch.no_grad():
        for layer, w, b in ((model[0], w1, b1), (model[2], w2, b2)):
            layer.weight.copy_(torch.from_numpy(quantise(w)))
            layer.bias.copy_(torch.from_numpy(quantise(b)))
    return model.eval()


def _upper_bound(w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Largest pre-activation of each unit over the box (exact for a linear map)."""
    return b + np.maximum(w * LO, w * HI).sum(axis=1)


def _dead_inputs(s: Stream, level: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    n_in, n_hidden, _, (d_lo, d_hi) = SIZES[level]
    k = s.between(2, K_MAX)
    order = s.permutation(n_in)
    dead = sorted(order[:k])
    tiny = order[k : k + s.between(d_lo, d_hi)] if d_hi else []
    w1 = s.normal(n_hidden, n_in, scale=0.5)
    if level == "medium":
        w1 += s.normal(n_hidden, n_in, scale=0.01)  # dense noise on every live weight
    for i in tiny:
        w1[:, i] *= s.fraction(1 / 60, 1 / 30)
    w1 = quantise(w1).astype(np.float64)
    w1[:, dead] = 0.0
    b1 = s.normal(n_hidden, scale=0.1)
    return w1, b1, dead


def _dead_hidden(s: Stream) -> tuple[np.ndarray, np.ndarray, list[int]]:
    n_in, n_hidden, _, (d_lo, d_hi) = SIZES["hard"]
    probe = s.uniform(20000, n_in, lo=LO, hi=HI)
    while True:  # deterministic rejection sampling from the seed's own stream
        k = s.between(2, K_MAX)
        order = s.permutation(n_hidden)
        dead, rare = order[:k], order[k : k + s.between(d_lo, d_hi)]
        # log-uniform unit scales over ~13x, the same for every kind of unit, so neither the norm nor
        # the bias alone tells a dead unit from a rarely firing one
        scales = np.exp(np.array([s.fraction(np.log(0.15), np.log(2.0)) for _ in range(n_hidden)]))
        for j in rare:  # rarely firing units lean large, so the most negative biases are not all dead
            scales[j] = np.exp(s.fraction(np.log(0.8), np.log(2.5)))
        for j in dead:
            scales[j] = np.exp(s.fraction(np.log(0.15), np.log(1.0)))
        w1 = quantise(s.normal(n_hidden, n_in) * 0.5 * scales[:, None]).astype(np.float64)
        reach = np.maximum(w1 * LO, w1 * HI).sum(axis=1)
        b1 = s.normal(n_hidden, scale=0.2) * reach
        sd = np.sqrt((w1**2).sum(axis=1) / 3.0)
        for j in order[k:]:  # a third of the live units are quiet (fire on roughly 3-15% of the box)
            if s.below(3) == 0:
                b1[j] = -s.fraction(1.0, 1.9) * sd[j]
        for j in dead:
            b1[j] = -reach[j] * (1.0 + s.fraction(0.05, 0.3))
        for j in rare:
            b1[j] = -s.fraction(2.0, 2.4) * sd[j]
        b1 = quantise(b1).astype(np.float64)
        bound = _upper_bound(w1, b1)
        active = ((probe @ w1.T + b1) > 0).mean(axis=0)
        dead_ok = sorted(j for j in range(n_hidden) if bound[j] < 0) == sorted(dead)
        margin_ok = all(bound[j] <= -0.05 * reach[j] for j in dead)
        rare_ok = all(0.01 <= active[j] <= 0.06 for j in rare)
        live_ok = all(active[j] >= 0.01 for j in range(n_hidden) if j not in dead)
        if dead_ok and margin_ok and rare_ok and live_ok:
            return w1, b1, sorted(dead)


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_in, n_hidden, n_out, _ = SIZES[level]
    w1, b1, dead = _dead_hidden(s) if level == "hard" else _dead_inputs(s, level)
    w2 = s.normal(n_out, n_hidden, scale=1.0 / np.sqrt(n_hidden))
    b2 = s.normal(n_out, scale=0.1)
    model = _mlp(w1, b1, w2, b2)
    x = torch.from_numpy(quantise(s.uniform(N_PROBE, n_in, lo=LO, hi=HI)))
    n = universe(level)
    fields = dict(n_in=n_in, n_hidden=n_hidden, n_out=n_out, lo=LO, hi=HI, n_probe=N_PROBE, last=n - 1)
    text = (prompt.HIDDEN if level == "hard" else prompt.INPUTS).format(
        distractor_note=prompt.MEDIUM_NOTE if level == "medium" else "", **fields
    )
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model,
        probe={"X": x, "box": (LO, HI)},
        config={"kind": "mlp", "n_in": n_in, "n_hidden": n_hidden, "n_out": n_out, "box": [LO, HI]},
        prompt=text,
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.INDICES, "n": n, "indices": dead},
    )
