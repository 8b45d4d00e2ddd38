"""Generator for causal-subspace: the output depends on an intermediate variable stored in a random
low-dimensional subspace S of a hidden layer; other directions are read by the next layer but are
causally inert.

Model: h = enc(x) (the ``hidden`` hook point), logits = out(relu(mlp_in(h))). Binary inputs x; the
variable v in R^k (k = 1..3) is v_j = sum_{i in A_j} x_i - sum_{i in B_j} x_i + 1/2, written into S
(k orthonormal directions of a random rotation of h). The class is the sign pattern of v (2^k
classes): mlp_in has units relu(+-g v_j) that ``out`` combines into sum_j s_cj v_j. Distractor
variables u (functions of x of the same kind) live in other directions; mlp_in reads each through two
identical units whose output weights cancel exactly, so the SVD of mlp_in's weights shows S and the
distractors alike, while interchanging them changes nothing. Further directions carry more functions
of x that nothing reads.

The grader measures a submitted basis B on the model: interchange-intervention accuracy over fixed
(base, source) pairs of probe inputs -- h_base + P_B (h_source - h_base) -- chance-corrected against not
intervening, times the subspace overlap |Q_S^T Q_B|_F^2 / max(k, rank B) (so the whole space, which
interchanges everything, scores k / d).
"""

from __future__ import annotations

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import SubspaceMLP
from ..base import Instance
from ..rng import Stream, quantise
from . import prompt

TASK_ID = "causal-subspace"
VERSION = "1"
LEVELS = {  # inputs, hidden d, k, distractor dims, unread dims, noise (d and k fixed per level: the
    # public shapes, e.g. the 2**k classes, must not vary with the seed)
    "easy": (10, 16, 1, 2, 4, 0.0),
    "medium": (12, 16, 2, 3, 5, 0.005),
    "hard": (14, 16, 3, 4, 6, 0.01),
}
N_PROBE, N_PAIRS, GAIN = 256, 512, 2.0


def answer_schema(level: str) -> dict:
    d = LEVELS[level][1]
    return {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}, "minItems": d, "maxItems": d},
        "minItems": 1,
        "maxItems": d,
        "description": f"a basis of the subspace: a list of vectors of {d} numbers (any basis; it is orthonormalised)",
        "x-kind": AnswerKind.BASIS,
        "x-universe": d,
        "x-k-max": LEVELS[level][2],
        "x-dim": d,
    }


def pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The grader's fixed (base, source) index pairs over the probe inputs."""
    s = Stream(0, f"{TASK_ID}/pairs")
    base = [s.below(n) for _ in range(N_PAIRS)]
    source = [s.below(n) for _ in range(N_PAIRS)]
    return torch.tensor(base), torch.tensor(source)


def orthonormal(vectors: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """An orthonormal basis [d, r] of the span of the rows of ``vectors`` (numerical rank r)."""
    u, sv, _ = np.linalg.svd(vectors.T, full_matrices=False)
    return u[:, sv > tol * max(1.0, float(sv.max(initial=0.0)))]


def interchange_accuracy(model: SubspaceMLP, x: torch.Tensor, basis: np.ndarray, target_basis: np.ndarray) -> tuple:
    """(IIA of ``basis``, accuracy of not intervening) on the fixed pairs, where the right answer for a
    pair is the model's output after the interchange on ``target_basis`` (the true subspace)."""
    b, src = pairs(x.shape[0])
    with torch.no_grad():
        h = model.enc(x).double()
        hb, hs = h[b], h[src]

        def classes(q: np.ndarray) -> torch.Tensor:
            proj = torch.from_numpy(q @ q.T)
            return model.head((hb + (hs - hb) @ proj).float()).argmax(dim=1)

        target = classes(target_basis)
        acc = float((classes(basis) == target).double().mean())
        null = float((model.head(hb.float()).argmax(dim=1) == target).double().mean())
    return acc, null


def _variable(s: Stream, n_in: int) -> np.ndarray:
    """Coefficients of one +-1 combination of 2-4 inputs (offset 1/2 added by the caller)."""
    coef = np.zeros(n_in)
    for i, idx in enumerate(s.sample(n_in, s.between(2, 4))):
        coef[idx] = 1.0 if i % 2 == 0 else -1.0
    return coef


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_in, d, k, n_dis, n_unread, noise = LEVELS[level]
    n_classes = 2**k
    d_mlp = 2 * (k + n_dis)
    x = torch.from_numpy(np.array([[s.below(2) for _ in range(n_in)] for _ in range(N_PROBE)], dtype=np.float32))
    while True:
        rot = s.orthogonal(d)
        dims = s.permutation(d)
        s_dirs, u_dirs = rot[:, dims[:k]], rot[:, dims[k : k + n_dis]]
        n_dirs = rot[:, dims[k + n_dis : k + n_dis + n_unread]]
        coefs = [_variable(s, n_in) for _ in range(k + n_dis + n_unread)]
        enc_w = sum(np.outer(direction, c) for direction, c in zip(
            [*s_dirs.T, *u_dirs.T, *n_dirs.T], coefs, strict=True))  # fmt: skip
        enc_b = sum(0.5 * direction for direction in [*s_dirs.T, *u_dirs.T, *n_dirs.T])
        signs = np.array([[1.0 if (c >> j) & 1 else -1.0 for j in range(k)] for c in range(n_classes)])
        w_in, b_in, w_out = np.zeros((d_mlp, d)), np.zeros(d_mlp), np.zeros((n_classes, d_mlp))
        units = s.permutation(d_mlp)
        for j in range(k):  # relu(g v) - relu(-g v) = g v, spread over the classes by sign
            plus, minus = units[2 * j], units[2 * j + 1]
            w_in[plus], w_in[minus] = GAIN * s_dirs[:, j], -GAIN * s_dirs[:, j]
            w_out[:, plus], w_out[:, minus] = signs[:, j], -signs[:, j]
        for j in range(n_dis):  # read, then cancelled: two identical units with opposite output weights
            a, c = units[2 * (k + j)], units[2 * (k + j) + 1]
            w_in[a] = w_in[c] = GAIN * u_dirs[:, j]
            b_in[a] = b_in[c] = s.fraction(-0.5, 0.5)
            spread = s.normal(n_classes)
            w_out[:, a], w_out[:, c] = spread, -spread
        model = SubspaceMLP(n_in, d, d_mlp, n_classes)
        values = {"enc.weight": enc_w, "enc.bias": enc_b, "mlp_in.weight": w_in, "mlp_in.bias": b_in,
                  "out.weight": w_out, "out.bias": np.zeros(n_classes)}  # fmt: skip
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(torch.from_numpy(quantise(values[name] + s.normal(*param.shape, scale=noise))))
        truth_basis = orthonormal(quantise(s_dirs.T).astype(np.float64))  # what the grader will use
        acc, null = interchange_accuracy(model, x, s_dirs, truth_basis)
        inert, _ = interchange_accuracy(model, x, u_dirs, truth_basis)
        with torch.no_grad():
            counts = np.bincount(model(x).argmax(dim=1).numpy(), minlength=n_classes)
        if acc >= 0.99 and null <= 0.6 and abs(inert - null) <= 0.02 and counts.min() >= N_PROBE // (4 * n_classes):
            break
    basis = quantise(s_dirs.T).astype(np.float64)  # exact in JSON: multiples of 2**-16
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model.eval(),
        probe={"x": x},
        config={"kind": "subspace-mlp", "n_in": n_in, "d_hidden": d, "d_mlp": d_mlp, "n_classes": n_classes},
        prompt=prompt.TEXT.format(n_in=n_in, d=d, k=k, n_probe=N_PROBE, n_classes=n_classes),
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.BASIS, "seed": seed, "level": level, "d": d, "k": k, "basis": basis.tolist()},
    )
