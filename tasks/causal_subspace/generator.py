"""Generator for causal-subspace: the output depends on an intermediate variable stored in a random
low-dimensional subspace S of a hidden layer; other directions are read by the next layer exactly as S
is, but are causally inert on the inputs the model is given.

Model: h = enc(x) (the ``hidden`` hook point), logits = out(relu(mlp_in(h))). The binary inputs come in
disjoint ordered pairs (p, q), one per variable, and are drawn from a structured distribution: in an
*open* pair the state p=1, q=0 occurs half the time (q implies p); in a *closed* pair it never occurs
(p implies q, and p=0, q=1 occurs half the time). Every variable z = x_p - x_q is written into its own
direction of a random rotation of h (random scale, sign and offset), and every read variable has one
unit relu(g (x_p - x_q - 1/2) + b) that fires exactly on the state p=1, q=0. The read variables form k
groups (one per bit of the k-dim variable v; 2^k classes); each group has one open pair (the live
unit, whose firing is the class bit, so S is spanned by the k live directions) and closed pairs whose
units never fire on the data. All units draw gain, bias, output weights (a multiple of the bit's sign
pattern over the classes plus a random class-common part) and write scale/sign/offset from the same
distributions, the output bias sets each bit's threshold from the group's weakest unit, and the pairs'
distributions are mirror images: so no reading of the weights (single matrices, products such as
out.weight @ mlp_in.weight, their SVDs and ranks, per-unit norms and biases, the units' firing region
over the whole input cube) tells the live unit of a group from the inert ones, and neither do the mean
and covariance of h. Only running the model on the data (which units fire) or intervening does.
Further directions carry more pair variables that nothing reads.

The grader measures a submitted basis B on the model: interchange-intervention accuracy over fixed
(base, source) pairs of probe inputs -- h_base + P_B (h_source - h_base) -- chance-corrected against not
intervening, times the subspace overlap |Q_S^T Q_B|_F^2 / max(k, rank B) (so the whole space, which
interchanges everything, scores k / d).

Version 1 (retired) read its distractors through pairs of identical units whose output weights
cancelled exactly, so any linear composition of the weights (the top-k right singular vectors of
out.weight @ mlp_in.weight) gave S exactly.
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
VERSION = "2"
LEVELS = {  # hidden d, k, read variables per bit (1 live + inert), unread variables, noise (d and k fixed
    # per level: the public shapes, e.g. the 2**k classes, must not vary with the seed); inputs = 2 x variables
    "easy": (16, 1, 8, 4, 0.0),
    "medium": (16, 2, 5, 4, 0.005),
    "hard": (16, 3, 4, 4, 0.01),
}
N_PROBE, N_PAIRS = 256, 512


def n_inputs(level: str) -> int:
    _, k, group, n_unread, _ = LEVELS[level]
    return 2 * (k * group + n_unread)


def answer_schema(level: str) -> dict:
    d = LEVELS[level][0]
    return {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}, "minItems": d, "maxItems": d},
        "minItems": 1,
        "maxItems": d,
        "description": f"a basis of the subspace: a list of vectors of {d} numbers (any basis; it is orthonormalised)",
        "x-kind": AnswerKind.BASIS,
        "x-universe": d,
        "x-k-max": LEVELS[level][1],
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


def _inputs(s: Stream, pair_of: list, is_open: list, n_in: int) -> np.ndarray:
    """N_PROBE rows: per pair (p, q), open: p=1,q=0 w.p. 1/2; closed: p=0,q=1 w.p. 1/2; else both equal
    (both 1 w.p. the pair's ``both``, drawn alike for open and closed pairs). Integer draws only."""
    both = [s.below(4097) for _ in pair_of]  # P(both on | equal) in 4096ths
    x = np.zeros((N_PROBE, n_in), dtype=np.float32)
    for row in x:
        for (p, q), op, w in zip(pair_of, is_open, both, strict=True):
            if s.below(2):
                row[p if op else q] = 1.0
            elif s.below(4096) < w:
                row[p] = row[q] = 1.0
    return x


def unit_inputs(instance: Instance) -> np.ndarray:
    """Per unit of mlp_in, the composed coefficients of its pre-activation on the inputs [d_mlp, n_in]."""
    m = instance.model
    return (m.mlp_in.weight.detach().double() @ m.enc.weight.detach().double()).numpy()


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    d, k, group, n_unread, noise = LEVELS[level]
    n_in, n_classes, n_read = n_inputs(level), 2**k, k * group
    n_var = n_read + n_unread
    live = [s.below(group) for _ in range(k)]  # where the answer lies: the open pair of each bit's group
    signs = np.array([[1.0 if (c >> j) & 1 else -1.0 for j in range(k)] for c in range(n_classes)])
    while True:
        order = s.permutation(n_in)
        pair_of = [(order[2 * v], order[2 * v + 1]) for v in range(n_var)]
        is_open = [v % group == live[v // group] if v < n_read else bool(s.below(2)) for v in range(n_var)]
        x = torch.from_numpy(_inputs(s, pair_of, is_open, n_in))
        rot = s.orthogonal(d)
        dims = s.permutation(d)
        dirs = rot[:, dims[:n_var]]  # column v: the direction of variable v
        scale = s.uniform(n_var, lo=0.7, hi=1.4) * np.array([s.pick((-1.0, 1.0)) for _ in range(n_var)])
        # h . dir_v = scale_v (x_p - x_q - 1/2 + shift_v); the shift is symmetric about 1/2, so |mean| of h
        # along a direction is distributed alike for open (mean of x_p - x_q: 1/2) and closed (-1/2) pairs,
        # and wide, so that the signed mean along a unit's read direction (1 apart) says little alone
        shift = s.uniform(n_var, lo=-2.5, hi=3.5)
        enc_w, enc_b = np.zeros((d, n_in)), np.zeros(d)
        for v, (p, q) in enumerate(pair_of):
            enc_w[:, p] += scale[v] * dirs[:, v]
            enc_w[:, q] -= scale[v] * dirs[:, v]
            enc_b += scale[v] * (shift[v] - 0.5) * dirs[:, v]
        gain = s.uniform(n_read, lo=1.5, hi=3.0)
        bias = s.uniform(n_read, lo=-0.2, hi=0.2) * gain  # pre-activation g (x_p - x_q - 1/2) + bias
        amp = s.uniform(n_read, lo=0.8, hi=1.6)  # the unit's weight on its bit's sign pattern
        common = s.normal(n_read, scale=0.5)  # a class-common part (no effect on the argmax)
        theta = s.uniform(k, lo=0.3, hi=0.7)
        units = s.permutation(n_read)  # unit units[v] reads variable v
        w_in, b_in, w_out = np.zeros((n_read, d)), np.zeros(n_read), np.zeros((n_classes, n_read))
        for v in range(n_read):
            u = units[v]
            w_in[u] = gain[v] / scale[v] * dirs[:, v]
            b_in[u] = bias[v] - gain[v] * shift[v]
            w_out[:, u] = amp[v] * signs[:, v // group] + common[v]
        # bit j is on iff its group's summed output exceeds a threshold below its weakest unit's output
        firing = amp * (gain / 2 + bias)
        b_out = -sum(theta[j] * firing[j * group : (j + 1) * group].min() * signs[:, j] for j in range(k))
        b_out = b_out + s.normal(1, scale=0.5)
        model = SubspaceMLP(n_in, d, n_read, n_classes)
        values = {"enc.weight": enc_w, "enc.bias": enc_b, "mlp_in.weight": w_in, "mlp_in.bias": b_in,
                  "out.weight": w_out, "out.bias": b_out}  # fmt: skip
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(torch.from_numpy(quantise(values[name] + s.normal(*param.shape, scale=noise))))
        s_dirs = dirs[:, [j * group + live[j] for j in range(k)]]
        u_dirs = dirs[:, [v for v in range(n_read) if not is_open[v]]]
        truth_basis = orthonormal(quantise(s_dirs.T).astype(np.float64))  # what the grader will use
        acc, null = interchange_accuracy(model, x, s_dirs, truth_basis)
        inert, _ = interchange_accuracy(model, x, u_dirs, truth_basis)
        with torch.no_grad():
            counts = np.bincount(model(x).argmax(dim=1).numpy(), minlength=n_classes)
            fires = (model.mlp_in(model.enc(x)) > 0).double().mean(dim=0).numpy()
        live_units = [units[j * group + live[j]] for j in range(k)]
        silent = all(fires[u] == 0.0 for u in range(n_read) if u not in live_units)
        if (acc >= 0.99 and null <= 0.6 and abs(inert - null) <= 0.02 and silent
                and counts.min() >= N_PROBE // (4 * n_classes)):  # fmt: skip
            break
    basis = quantise(s_dirs.T).astype(np.float64)  # exact in JSON: multiples of 2**-16
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model.eval(),
        probe={"x": x},
        config={"kind": "subspace-mlp", "n_in": n_in, "d_hidden": d, "d_mlp": n_read, "n_classes": n_classes},
        prompt=prompt.TEXT.format(n_in=n_in, d=d, k=k, n_probe=N_PROBE, n_classes=n_classes),
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.BASIS, "seed": seed, "level": level, "d": d, "k": k, "basis": basis.tolist()},
    )
