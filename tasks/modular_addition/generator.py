"""Generator for modular-addition: a network that really computes (a + b) mod p by the Fourier
multiplication algorithm, with distractor frequencies that the embedding carries at equal strength.

Construction (Nanda et al.'s algorithm, written by hand instead of trained; version 4):
- embedding: token t -> sum over frequencies f of alpha_f (cos(w_f t + rho_f) c_f + sin(w_f t + rho_f) s_f)
  + noise, w_f = 2 pi f / p, rho_f a random phase, for the key frequencies and three times as many
  distractors alike (same amplitude range), in the directions of a random orthogonal basis, so neither a DFT of
  W_E nor its axes separate them;
- gated MLP over the concatenated embeddings [E(a), E(b)] whose every unit squares one direction (left =
  right), in *phase quads*: four units that read x1 +- y1 and x2 +- y2, where (x1, x2) is the frequency's wave in
  E(a) turned by a random angle theta and (y1, y2) its wave in E(b) turned by psi - theta, and write +-col / 4, so
  that by 4xy = (x + y)^2 - (x - y)^2 the quad outputs col cos(w(a + b) + psi) whatever theta is. Every
  frequency, key or distractor, has four quads (16 units), two writing each of the two directions where the
  unembedding reads its wave, all with one column norm and reads at random phases. A key's two quads per
  direction both sit where the unembedding reads (its wave's own random phase sigma_f), and add up; a
  distractor's sit at phi and phi + pi from there (the same phase sum modulo pi, opposite outputs) and cancel
  exactly on every input;
- unembedding: logit(c) = sum over keys of A_k cos(w_k (a + b - c)), which peaks at c = (a + b) mod p,
  plus the distractors' waves (cos(w_f c + sigma_f), sin(w_f c + sigma_f)), which receive nothing.
So every product of the weight matrices (W_U W_out, W_E L^T, their spectra) lists keys and distractors alike, and
so do the shapes of each frequency's unit group (how many units, their norms, how far the columns cancel, the
read phases and their sums modulo pi, the write rank): version 3's keys had one column norm and read pure
cos / sin directions while a distractor's columns were c, c, -2c, -2c, which named the keys (0.99, issue 16).
What separates a key from a distractor is whether its quads' outputs add or cancel, which only the whole path
W_E -> squares -> W_out -> W_U shows (each unit's direct effect on the correct logit, or the stated ablation
done in closed form), or the ablation itself.
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
VERSION = "4"
K_MAX = 5
DISTRACTORS = 3  # per key: the embedding's strong frequencies then hold one key in four, so listing them all scores
# Jaccard 0.25 (version 2 had two per key: all of them scored 0.33, and twice the answer size about 0.35-0.39)
LEVELS = {  # primes, keys (lo, hi), d_model, d_mlp, noise
    # (every frequency read and written by 16 square units; the dense noise is lower than version 1's
    # 0.002/0.004/0.006 because squares amplify it and the model must stay exact)
    "easy": ((53, 59, 61), (2, 3), 24, 192, 0.001),
    "medium": ((67, 71, 73, 79, 83), (3, 4), 32, 256, 0.0015),
    "hard": ((89, 97, 101, 103, 107, 109, 113), (3, 5), 40, 320, 0.002),
}
WRITE = (0.12, 0.19)  # the output strength of a key, per unit of sqrt(2.5) x 4 (version 3's), drawn for every
# frequency, key or distractor, so the column norms have one distribution (see _frequency_units)
KEY_RULE, OTHER_RULE = 0.4, 0.15  # stated in the prompt
KEY_MARGIN, OTHER_MARGIN = 0.5, 0.05  # enforced by the generator


def answer_schema(level: str, p: int | None = None) -> dict:
    return frequency_schema(p or LEVELS[level][0][0], K_MAX, "the key frequencies the model uses,")


def logit_margin(model: ModAddMLP, tokens: torch.Tensor, w_e: torch.Tensor | None = None) -> float:
    """Mean over pairs of logit(correct c) - mean logit, with the embedding replaced by ``w_e`` if given: the
    quantity the prompt's ablation measures, computed from the logits as the prompt states it (the generator uses
    :func:`grid_margin`, the same number in closed form; the tests hold one to the other)."""
    p = model.embed.num_embeddings
    with torch.no_grad():
        e = model.embed.weight if w_e is None else w_e.to(model.embed.weight.dtype)
        logits = model.unembed(model.mlp(e[tokens].flatten(-2)))
        correct = logits.gather(1, ((tokens[:, 0] + tokens[:, 1]) % p)[:, None])[:, 0]
    return float((correct - logits.mean(dim=1)).mean())


def grid_margin(model: ModAddMLP, w_e: torch.Tensor | None = None) -> float:
    """:func:`logit_margin` over all p^2 pairs, in float64 and in O(d_mlp p log p): unit j adds
    (u_j(a) + v_j(b)) (u'_j(a) + v'_j(b)) gain_j((a + b) mod p), whose sum over the grid is, for the u u' and v v'
    terms, their sum over tokens times the sum of gain_j, and for the cross terms a circular convolution of
    u_j with v'_j (and v_j with u'_j) read against gain_j, done by FFT."""
    p, d = model.embed.num_embeddings, model.embed.embedding_dim
    mlp = model.mlp
    with torch.no_grad():
        e = (model.embed.weight if w_e is None else w_e).double()
        (u, v), (u2, v2) = (
            (e @ lin.weight[:, :d].double().T + lin.bias.double(), e @ lin.weight[:, d:].double().T)
            for lin in (mlp.left, mlp.right)
        )  # [p, units] each: the a side (with the bias) and the b side
        w_u = model.unembed.weight.double()
        gain = (w_u - w_u.mean(dim=0)) @ mlp.out.weight.double()  # [p, units]
        diagonal = ((u * u2).sum(dim=0) + (v * v2).sum(dim=0)) * gain.sum(dim=0)
        conv = torch.fft.irfft(
            torch.fft.rfft(u, dim=0) * torch.fft.rfft(v2, dim=0) + torch.fft.rfft(v, dim=0) * torch.fft.rfft(u2, dim=0),
            n=p,
            dim=0,
        )  # [p, units]: sum over a of (u(a) v'(c - a) + v(c - a) u'(a)) at each c
        total = diagonal.sum() + (conv * gain).sum()  # the out bias meets the centred W_U, which sums to zero
    return float(total / p**2)


def frequency_drops(model: ModAddMLP, tokens: torch.Tensor) -> np.ndarray:
    """Drop of :func:`logit_margin` over all pairs (``tokens`` is the full grid, as in the probe) when frequency
    k (1..(p-1)/2) is projected out of the embedding along the token axis, for every k."""
    p = model.embed.num_embeddings
    if tokens.shape[0] != p * p:
        raise ValueError("frequency_drops measures the margin over all p^2 pairs")
    w_e = model.embed.weight.detach().double()
    clean = grid_margin(model)
    t = torch.arange(p, dtype=torch.float64)
    drops = []
    for k in range(1, (p - 1) // 2 + 1):
        basis = torch.stack([torch.cos(2 * torch.pi * k * t / p), torch.sin(2 * torch.pi * k * t / p)], dim=1)
        basis = basis / basis.norm(dim=0)
        drops.append(clean - grid_margin(model, w_e - basis @ (basis.T @ w_e)))
    return np.array(drops)


def _pairs(p: int) -> torch.Tensor:
    return torch.cartesian_prod(torch.arange(p), torch.arange(p))


def _product_units(x: np.ndarray, y: np.ndarray, col: np.ndarray) -> list[tuple]:
    """Two square units (left = right) that output col x y, by 4xy = (x + y)^2 - (x - y)^2. Each entry:
    (direction, output column)."""
    return [(x + y, col / 4), (x - y, -col / 4)]


def _turn(c: np.ndarray, s_: np.ndarray, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """Reading directions of the wave (c, s) turned by angle: with z = c + i s, Re and Im of z e^{i angle}."""
    return np.cos(angle) * c - np.sin(angle) * s_, np.sin(angle) * c + np.cos(angle) * s_


def _phase_quad(s: Stream, sides: tuple, psi: float, col: np.ndarray) -> list[tuple]:
    """Four units that output col cos(w(a + b) + psi): with alpha = e^{i w a} and beta = e^{i w b},
    Re(alpha e^{i theta} beta e^{i (psi - theta)}) = x1 y1 - x2 y2 for a random theta, so the reads sit at random
    phases while the output does not depend on theta."""
    a_cos, a_sin, b_cos, b_sin = sides
    theta = 2 * np.pi * s.fraction(0.0, 1.0)
    x1, x2 = _turn(a_cos, a_sin, theta)
    y1, y2 = _turn(b_cos, b_sin, psi - theta)
    return _product_units(x1, y1, col) + _product_units(x2, y2, -col)


def _frequency_units(s: Stream, sides: tuple, outs: tuple, key: bool, shift: float) -> list[tuple]:
    """A frequency's 16 units: per output direction (the unembedding reads cos(w c + sigma) on outs[0],
    sin(w c + sigma) on outs[1]: phases tau = 0 and -pi/2), two phase quads of one column norm. The embedding's
    wave carries its own phase rho, so a quad at psi outputs cos(w(a + b) + 2 rho + psi); ``shift`` is
    sigma - 2 rho, which lines a quad up with the unembedding. A key's two quads both sit at tau + shift and add
    up; a distractor's sit at tau + shift + phi and tau + shift + phi + pi (phi drawn once per frequency) and
    cancel on every input. Either way the two quads read the same phase sum modulo pi (a draft whose key quads sat
    at tau +- phi showed two where every distractor showed one: 0.98 for a red team), and the phase sum a
    key's units read is sigma + tau, random with sigma (with sigma = rho = 0 the keys read multiples of pi/2:
    0.98 for the next red team), so only the unembedding's phase tells it apart."""
    scale = s.fraction(*WRITE) * 2.5**0.5  # the output strength version 3's keys had
    col = 2 * scale  # a quad writes col x y (unit columns col / 4); a key's two quads add up to 4 x scale
    phi = 2 * np.pi * s.fraction(0.0, 1.0)
    units: list[tuple] = []
    for out_dir, tau in zip(outs, (0.0, -np.pi / 2), strict=True):
        for psi in (tau + shift,) * 2 if key else (tau + shift + phi, tau + shift + phi + np.pi):
            units += _phase_quad(s, sides, psi, out_dir * col)
    return units


def _build(s: Stream, p: int, keys: list[int], dis: list[int], d: int, h: int, noise: float) -> ModAddMLP:
    """Every unit squares one direction of [E(a), E(b)] (left = right); every frequency gets the 16 units of
    :func:`_frequency_units`, whose quads add up (a key: cos(w(a + b)) and sin(w(a + b)) where the unembedding
    reads the key's wave) or cancel on every input (a distractor). So every frequency in the embedding is read by
    the MLP and every one the MLP writes is read by the unembedding, at matched strengths and in groups of one
    shape: products of the weight matrices and the unit groups' shapes list keys and distractors alike (the
    shortcut audit's ``composed`` class), and only the interaction of the squares (or an intervention) tells them
    apart."""
    freqs = keys + dis
    amp = {f: s.fraction(0.8, 1.0) for f in freqs}
    rho = {f: 2 * np.pi * s.fraction(0.0, 1.0) for f in freqs}  # the embedding's phase per frequency
    sigma = {f: 2 * np.pi * s.fraction(0.0, 1.0) for f in freqs}  # the unembedding's
    rot = s.orthogonal(d)  # embedding directions: columns 2i, 2i+1 for frequency i
    t = np.arange(p)[:, None]
    w_e = np.zeros((p, d))
    for i, f in enumerate(freqs):
        w = 2 * np.pi * f * t / p + rho[f]
        w_e += amp[f] * (np.cos(w) * rot[:, 2 * i] + np.sin(w) * rot[:, 2 * i + 1])
    # output directions (columns of out_rot): 2i, 2i+1 carry frequency i's cos/sin wave for the unembedding
    out_rot = s.orthogonal(d)
    units: list[tuple[np.ndarray, np.ndarray]] = []
    zero = np.zeros(d)
    for i, f in enumerate(freqs):
        cos_d, sin_d = rot[:, 2 * i] / amp[f], rot[:, 2 * i + 1] / amp[f]
        sides = (np.concatenate([cos_d, zero]), np.concatenate([sin_d, zero]),  # read from E(a)
                 np.concatenate([zero, cos_d]), np.concatenate([zero, sin_d]))  # read from E(b)  # fmt: skip
        outs = (out_rot[:, 2 * i], out_rot[:, 2 * i + 1])
        units += _frequency_units(s, sides, outs, f in keys, sigma[f] - 2 * rho[f])
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
        w = 2 * np.pi * f * c / p + sigma[f]
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
