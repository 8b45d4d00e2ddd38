"""Generator for modular-addition: a network that really computes (a + b) mod p by the Fourier
multiplication algorithm, with distractor frequencies that the embedding carries at equal strength.

Construction (Nanda et al.'s algorithm, written by hand instead of trained; version 3):
- embedding: token t -> sum over frequencies f of alpha_f (cos(w_f t) c_f + sin(w_f t) s_f) + noise,
  w_f = 2 pi f / p, for the key frequencies and three times as many distractors alike (same amplitude range), in
  the directions of a random orthogonal basis, so neither a DFT of W_E nor its axes separate them;
- gated MLP over the concatenated embeddings [E(a), E(b)] whose every unit squares one direction (left =
  right): per key, eight units compute cos(w(a + b)) and sin(w(a + b)) by the polarisation identity
  4xy = (x + y)^2 - (x - y)^2 and write them where the unembedding reads the key's wave; per distractor,
  eight units square mixtures of its waves in E(a) and E(b) and write, where the unembedding reads the
  distractor's wave, columns that cancel exactly on every input ((x + y)^2 + (x - y)^2 - 2x^2 - 2y^2 = 0),
  with read and write strengths matched to a key's;
- unembedding: logit(c) = sum over keys of A_k cos(w_k (a + b - c)), which peaks at c = (a + b) mod p,
  plus the distractors' waves, which receive nothing.
So every product of the weight matrices (W_U W_out, W_E L^T, their spectra) lists keys and distractors alike;
version 1's filler units wrote into a sink the unembedding never read, and W_U W_out named the keys (0.99 in
the shortcut audit). Only the interaction of the squares, or the stated ablation, separates them -- except, as a
red team found after version 3, the shapes of each frequency's unit group (a key's columns have one norm and cancel
in pairs, a distractor's are c, c, -2c, -2c; a key's units read pure cos / sin directions): the audit reads them
(`composed:group.*`), an open finding in docs/TASKS.md, for version 4.
The generator checks the answer's operational definition (the prompt's frequency ablation) with a
margin, and that the model is right on all p^2 pairs.
"""

from __future__ import annotations

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import ModAddMLP
from ..base import Instance
from ..rng import Stream, quantise
from ..schemas import frequency_schema
from . import prompt

TASK_ID = "modular-addition"
VERSION = "3"
K_MAX = 5
DISTRACTORS = 3  # per key: the embedding's strong frequencies then hold one key in four, so listing them all scores
# Jaccard 0.25 (version 2 had two per key: all of them scored 0.33, and twice the answer size about 0.35-0.39)
LEVELS = {  # primes, keys (lo, hi), d_model, d_mlp, noise
    # (every frequency read and written by 8 square units; the dense noise is lower than version 1's
    # 0.002/0.004/0.006 because squares amplify it and the model must stay exact)
    "easy": ((53, 59, 61), (2, 3), 24, 96, 0.001),
    "medium": ((67, 71, 73, 79, 83), (3, 4), 32, 128, 0.0015),
    "hard": ((89, 97, 101, 103, 107, 109, 113), (3, 5), 40, 160, 0.002),
}
WRITE = (0.12, 0.19)  # the scale of a distractor's zero-sum columns; a key's product columns get sqrt(2.5) x one
# draw from it, so the write power per frequency (key: 8 s^2, distractor: 20 c^2) has one distribution (version 2
# fixed a key's at 1/4: W_U W_out's power ranked keys apart)
KEY_RULE, OTHER_RULE = 0.4, 0.15  # stated in the prompt
KEY_MARGIN, OTHER_MARGIN = 0.5, 0.05  # enforced by the generator


def answer_schema(level: str, p: int | None = None) -> dict:
    return frequency_schema(p or LEVELS[level][0][0], K_MAX, "the key frequencies the model uses,")


def logit_margin(model: ModAddMLP, tokens: torch.Tensor, w_e: torch.Tensor | None = None) -> float:
    """Mean over pairs of logit(correct c) - mean logit: the quantity the prompt's ablation measures.

    Computed without the [pairs, p] logits: the MLP's inputs are per-token parts (left(x) = L_a E(a) + L_b E(b) +
    bias), and only the correct logit and the mean logit are needed, so a call costs O(pairs x d_mlp), not
    O(pairs x d_mlp x p) (the generator calls it once per frequency)."""
    p = model.embed.num_embeddings
    d = model.embed.embedding_dim
    mlp = model.mlp
    with torch.no_grad():
        e = model.embed.weight if w_e is None else w_e
        a, b = tokens[:, 0], tokens[:, 1]
        parts = []
        for lin in (mlp.left, mlp.right):
            per_a, per_b = e @ lin.weight[:, :d].T, e @ lin.weight[:, d:].T
            parts.append(per_a[a] + per_b[b] + lin.bias)
        resid = mlp.out(parts[0] * parts[1])
        w_u = model.unembed.weight
        target = (a + b) % p
        correct = (resid * w_u[target]).sum(dim=1)
        mean = resid @ w_u.mean(dim=0)
    return float((correct - mean).mean())


def frequency_drops(model: ModAddMLP, tokens: torch.Tensor) -> np.ndarray:
    """Drop of :func:`logit_margin` when frequency k (1..(p-1)/2) is projected out of the embedding
    along the token axis, for every k."""
    p = model.embed.num_embeddings
    w_e = model.embed.weight.detach().double()
    clean = logit_margin(model, tokens)
    t = torch.arange(p, dtype=torch.float64)
    drops = []
    for k in range(1, (p - 1) // 2 + 1):
        basis = torch.stack([torch.cos(2 * torch.pi * k * t / p), torch.sin(2 * torch.pi * k * t / p)], dim=1)
        basis = basis / basis.norm(dim=0)
        ablated = (w_e - basis @ (basis.T @ w_e)).float()
        drops.append(clean - logit_margin(model, tokens, ablated))
    return np.array(drops)


def _pairs(p: int) -> torch.Tensor:
    return torch.cartesian_prod(torch.arange(p), torch.arange(p))


def _square_units(x: np.ndarray, y: np.ndarray, col: np.ndarray, kind: str) -> list[tuple]:
    """Units as squares of one input direction (left = right), by the polarisation identities:
    ``product``: (x + y)^2 - (x - y)^2 = 4 x y, written as col (x y); ``zero``:
    (x + y)^2 + (x - y)^2 - 2 x^2 - 2 y^2 = 0, four units writing col-sized columns that cancel on every input.
    Each entry: (direction, output column)."""
    if kind == "product":
        return [(x + y, col / 4), (x - y, -col / 4)]
    return [(x + y, col), (x - y, col), (x, -2 * col), (y, -2 * col)]


READ_SCALE = (8 / 12) ** 0.5  # a zero quadruple reads |x+y|^2 + |x-y|^2 + |x|^2 + |y|^2 = 3 (|x|^2 + |y|^2) per side


def _mixture(s: Stream, cos_dir: np.ndarray, sin_dir: np.ndarray) -> np.ndarray:
    """A random unit-strength mixture of a frequency's cos and sin reading directions."""
    phase = 2 * np.pi * s.fraction(0.0, 1.0)
    return np.cos(phase) * cos_dir + np.sin(phase) * sin_dir


def _build(s: Stream, p: int, keys: list[int], dis: list[int], d: int, h: int, noise: float) -> ModAddMLP:
    """Every unit squares one direction of [E(a), E(b)] (left = right). A key's eight units compute
    cos(w(a + b)) and sin(w(a + b)) from its waves in E(a) and E(b) and write them where the unembedding reads
    the key's wave. A distractor's eight units square mixtures of its waves in E(a) and E(b) and write, into
    the directions where the unembedding reads the distractor's wave, columns that cancel exactly on every
    input (two zero quadruples). So every frequency in the embedding is read by the MLP and every one the MLP
    writes is read by the unembedding, at matched strengths: products of the weight matrices list keys and
    distractors alike (the shortcut audit's ``composed`` class), and only the interaction of the squares (or an
    intervention) tells them apart."""
    freqs = keys + dis
    amp = {f: s.fraction(0.8, 1.0) for f in freqs}
    rot = s.orthogonal(d)  # embedding directions: columns 2i, 2i+1 for frequency i
    t = np.arange(p)[:, None]
    w_e = np.zeros((p, d))
    for i, f in enumerate(freqs):
        w = 2 * np.pi * f * t / p
        w_e += amp[f] * (np.cos(w) * rot[:, 2 * i] + np.sin(w) * rot[:, 2 * i + 1])
    # output directions (columns of out_rot): 2i, 2i+1 carry frequency i's cos/sin wave for the unembedding
    out_rot = s.orthogonal(d)
    units: list[tuple[np.ndarray, np.ndarray]] = []
    zero = np.zeros(d)
    for i, f in enumerate(freqs):
        cos_d, sin_d = rot[:, 2 * i] / amp[f], rot[:, 2 * i + 1] / amp[f]
        a_cos, a_sin = np.concatenate([cos_d, zero]), np.concatenate([sin_d, zero])  # read from E(a)
        b_cos, b_sin = np.concatenate([zero, cos_d]), np.concatenate([zero, sin_d])  # read from E(b)
        out_cos, out_sin = out_rot[:, 2 * i], out_rot[:, 2 * i + 1]
        scale = s.fraction(*WRITE)  # one per frequency, key or distractor (see WRITE)
        if f in keys:  # cos(w(a+b)) = cc - ss, sin(w(a+b)) = sc + cs; product columns are col / 4
            gain = 4 * scale * 2.5**0.5  # "product" writes col / 4 per unit: each column is sqrt(2.5) x scale
            c, sn = out_cos * gain, out_sin * gain
            units += _square_units(a_cos, b_cos, c, "product") + _square_units(a_sin, b_sin, -c, "product")
            units += _square_units(a_sin, b_cos, sn, "product") + _square_units(a_cos, b_sin, sn, "product")
        else:  # x and y mix the wave in E(a) and in E(b); scaled so that the frequency's summed read strength
            # matches a key's (8 unit-norm parts per side)
            for out_dir in (out_cos, out_sin):
                x, y = (_mixture(s, a_cos, a_sin) + _mixture(s, b_cos, b_sin) for _ in range(2))
                units += _square_units(x * READ_SCALE, y * READ_SCALE, out_dir * scale, "zero")
    if len(units) > h:
        raise ValueError(f"{len(units)} units do not fit in d_mlp={h}")
    while len(units) < h:  # squares of random embedding directions, written where nothing reads
        spare = out_rot[:, 2 * len(freqs) + s.below(d - 2 * len(freqs))]
        side = s.below(2)
        direction = np.concatenate([rot[:, s.below(d)], zero] if side == 0 else [zero, rot[:, s.below(d)]])
        units.append((direction, spare * s.fraction(0.3, 0.6)))
    order = s.permutation(h)
    left, out = np.zeros((h, 2 * d)), np.zeros((d, h))
    for j, (direction, col) in zip(order, units, strict=True):
        left[j], out[:, j] = direction, col
    w_u = np.zeros((d, p))
    c = np.arange(p)[None, :]
    for i, f in enumerate(freqs):
        w = 2 * np.pi * f * c / p
        w_u += s.fraction(0.85, 1.0) * (np.cos(w) * out_rot[:, 2 * i, None] + np.sin(w) * out_rot[:, 2 * i + 1, None])
    model = ModAddMLP(p, d, h)
    values = {
        "embed.weight": w_e,
        "mlp.left.weight": left,
        "mlp.left.bias": np.zeros(h),
        "mlp.right.weight": left,
        "mlp.right.bias": np.zeros(h),
        "mlp.out.weight": out,
        "mlp.out.bias": np.zeros(d),
        "unembed.weight": w_u.T,
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.from_numpy(quantise(values[name] + s.normal(*param.shape, scale=noise))))
    return model.eval()


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    primes, (k_lo, k_hi), d, h, noise = LEVELS[level]
    p = s.pick(primes)
    half = (p - 1) // 2
    tokens = _pairs(p)
    while True:  # deterministic rejection sampling until the stated rule holds with a margin
        n_keys = s.between(k_lo, k_hi)
        n_dis = DISTRACTORS * n_keys
        freqs = [f + 1 for f in s.sample(half, n_keys + n_dis)]
        keys, dis = sorted(freqs[:n_keys]), freqs[n_keys:]
        model = _build(s, p, keys, dis, d, h, noise)
        with torch.no_grad():
            if not (model(tokens).argmax(dim=1) == (tokens[:, 0] + tokens[:, 1]) % p).all():
                continue
        drops = frequency_drops(model, tokens)
        top = drops.max()
        others = [drops[k - 1] for k in range(1, half + 1) if k not in keys]
        if min(drops[k - 1] for k in keys) >= KEY_MARGIN * top and max(others) <= OTHER_MARGIN * top:
            break
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model,
        probe={"tokens": tokens, "p": p},
        config={"kind": "modular-adder", "p": p, "d_model": d, "d_mlp": h},
        prompt=prompt.TEXT.format(p=p, d=d, h=h, half=half, key=int(KEY_RULE * 100), other=int(OTHER_RULE * 100)),
        answer_schema=answer_schema(level, p),
        truth={"kind": AnswerKind.FREQUENCIES, "p": p, "frequencies": keys},
    )
