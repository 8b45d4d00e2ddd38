"""Generator for modular-addition: a network that really computes (a + b) mod p by the Fourier
multiplication algorithm, with distractor frequencies that the embedding carries at equal strength.

Construction (Nanda et al.'s algorithm, written by hand instead of trained):
- embedding: token t -> sum over frequencies f of alpha_f (cos(w_f t) c_f + sin(w_f t) s_f) + noise,
  w_f = 2 pi f / p, for the key frequencies and the distractors alike (same amplitude range), in the
  directions of a random orthogonal basis, so neither a DFT of W_E nor its axes separate them;
- gated MLP over the concatenated embeddings [E(a), E(b)]: per key four units compute
  cos(w a) cos(w b), sin(w a) sin(w b), sin(w a) cos(w b), cos(w a) sin(w b) exactly, and write
  cos(w(a + b)) and sin(w(a + b)) into the residual; filler units compute the same products for the
  distractor frequencies (and random products) but write into directions the unembedding ignores;
- unembedding: logit(c) = sum over keys of A_k cos(w_k (a + b - c)), which peaks at c = (a + b) mod p,
  plus waves of some distractor frequencies read from directions nothing writes.
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
VERSION = "1"
K_MAX = 5
LEVELS = {  # primes, keys (lo, hi), distractors (lo, hi), d_model, d_mlp, noise
    "easy": ((53, 59, 61), (2, 3), (2, 3), 32, 32, 0.002),
    "medium": ((67, 71, 73, 79, 83), (3, 4), (3, 4), 32, 40, 0.004),
    "hard": ((89, 97, 101, 103, 107, 109, 113), (3, 5), (4, 5), 40, 48, 0.006),
}
KEY_RULE, OTHER_RULE = 0.4, 0.15  # stated in the prompt
KEY_MARGIN, OTHER_MARGIN = 0.5, 0.05  # enforced by the generator


def answer_schema(level: str, p: int | None = None) -> dict:
    return frequency_schema(p or LEVELS[level][0][0], K_MAX, "the key frequencies the model uses,")


def logit_margin(model: ModAddMLP, tokens: torch.Tensor, w_e: torch.Tensor | None = None) -> float:
    """Mean over pairs of logit(correct c) - mean logit: the quantity the prompt's ablation measures."""
    p = model.embed.num_embeddings
    with torch.no_grad():
        e = (model.embed.weight if w_e is None else w_e)[tokens].flatten(-2)
        logits = model.unembed(model.mlp(e))
    target = (tokens[:, 0] + tokens[:, 1]) % p
    return float((logits.gather(1, target[:, None])[:, 0] - logits.mean(dim=1)).mean())


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


def _build(s: Stream, p: int, keys: list[int], dis: list[int], d: int, h: int, noise: float) -> ModAddMLP:
    freqs = keys + dis
    amp = {f: s.fraction(0.8, 1.0) for f in freqs}
    rot = s.orthogonal(d)  # embedding directions: columns 2i, 2i+1 for frequency i
    t = np.arange(p)[:, None]
    w_e = np.zeros((p, d))
    for i, f in enumerate(freqs):
        w = 2 * np.pi * f * t / p
        w_e += amp[f] * (np.cos(w) * rot[:, 2 * i] + np.sin(w) * rot[:, 2 * i + 1])
    # residual directions (columns of out_rot): 2j, 2j+1 carry key j's cos/sin(w(a + b)); the next
    # ``2 * len(dis)`` are read by the unembedding's distractor waves but never written; the rest is a
    # sink that filler units write into and nothing reads
    out_rot = s.orthogonal(d)
    n_read = 2 * len(keys)
    waves = list(range(n_read, n_read + 2 * len(dis)))
    sink = list(range(n_read + 2 * len(dis), d))
    left, right, out = np.zeros((h, 2 * d)), np.zeros((h, 2 * d)), np.zeros((d, h))
    units = []
    for i, f in enumerate(freqs):  # per frequency: (a-part of left, b-part of right, output column)
        cos_dir, sin_dir = rot[:, 2 * i] / amp[f], rot[:, 2 * i + 1] / amp[f]
        for la, rb, sign, target in ((cos_dir, cos_dir, 1, 0), (sin_dir, sin_dir, -1, 0),
                                     (sin_dir, cos_dir, 1, 1), (cos_dir, sin_dir, 1, 1)):  # fmt: skip
            if f in keys:
                col = out_rot[:, 2 * keys.index(f) + target] * sign
            else:  # a distractor's products land in directions the unembedding never reads
                col = out_rot[:, s.pick(sink)] * s.fraction(0.5, 1.0)
            units.append((la, rb, col))
    while len(units) < h:  # random products of embedding directions, written where nothing reads
        units.append((rot[:, s.below(d)], rot[:, s.below(d)], out_rot[:, s.pick(sink)] * 0.5))
    order = s.permutation(h)
    for j, (la, rb, col) in zip(order, units, strict=True):
        left[j, :d], right[j, d:], out[:, j] = la, rb, col
    gain = {f: s.fraction(0.85, 1.0) for f in keys}
    w_u = np.zeros((d, p))
    c = np.arange(p)[None, :]
    for j, f in enumerate(keys):
        w = 2 * np.pi * f * c / p
        w_u += gain[f] * (np.cos(w) * out_rot[:, 2 * j, None] + np.sin(w) * out_rot[:, 2 * j + 1, None])
    for i, f in enumerate(dis):  # distractor waves, read from directions nothing writes
        w = 2 * np.pi * f * c / p
        cos_col, sin_col = out_rot[:, waves[2 * i], None], out_rot[:, waves[2 * i + 1], None]
        w_u += s.fraction(0.85, 1.0) * (np.cos(w) * cos_col + np.sin(w) * sin_col)
    model = ModAddMLP(p, d, h)
    values = {
        "embed.weight": w_e,
        "mlp.left.weight": left,
        "mlp.left.bias": np.zeros(h),
        "mlp.right.weight": right,
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
    primes, (k_lo, k_hi), (d_lo, d_hi), d, h, noise = LEVELS[level]
    p = s.pick(primes)
    half = (p - 1) // 2
    tokens = _pairs(p)
    while True:  # deterministic rejection sampling until the stated rule holds with a margin
        n_keys, n_dis = s.between(k_lo, k_hi), s.between(d_lo, d_hi)
        freqs = [f + 1 for f in s.sample(half, n_keys + n_dis)]
        keys, dis = sorted(freqs[:n_keys]), freqs[n_keys:]
        model = _build(s, p, keys, dis, d, h, noise)
        with torch.no_grad():
            correct = (model(tokens).argmax(dim=1) == (tokens[:, 0] + tokens[:, 1]) % p).all()
        drops = frequency_drops(model, tokens)
        top = drops.max()
        others = [drops[k - 1] for k in range(1, half + 1) if k not in keys]
        if correct and min(drops[k - 1] for k in keys) >= KEY_MARGIN * top and max(others) <= OTHER_MARGIN * top:
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
