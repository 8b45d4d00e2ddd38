"""Generator for fourier-frequencies: key frequencies planted in a prime-vocabulary embedding.

W_E[t] = sum_k A_k (cos(2 pi k t / p) u_k + sin(2 pi k t / p) v_k) + weaker distractor frequencies
+ dense noise, where (u_k, v_k) are columns of a random orthogonal matrix (so no axis of the
embedding is a frequency). The unembedding carries the key frequencies only. The prompt states the
operational rule (key: >= 40% of the strongest frequency's power; others < 25%) and the generator
enforces it with a margin (keys >= 50%, others <= 20%) on the final quantised weights.
"""

from __future__ import annotations

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import EmbedMLP
from ..base import Instance
from ..rng import Stream, quantise
from ..schemas import frequency_schema
from . import prompt

TASK_ID = "fourier-frequencies"
VERSION = "1"
K_MAX = 5
LEVELS = {  # primes, keys (lo, hi), distractors (lo, hi), distractor amplitude ratio (lo, hi), noise
    "easy": ((53, 59, 61), (2, 3), (1, 2), (0.25, 0.35), 0.02),
    "medium": ((67, 71, 73, 79, 83), (3, 4), (2, 4), (0.3, 0.42), 0.04),
    "hard": ((89, 97, 101, 103, 107, 109, 113), (3, 5), (3, 6), (0.35, 0.44), 0.06),
}
D_MODEL, D_MLP = 64, 128


def freq_power(w_e: np.ndarray) -> np.ndarray:
    """Power of each frequency 1..(p-1)/2 in the embedding (DFT over tokens, summed over dims)."""
    p = w_e.shape[0]
    spec = np.abs(np.fft.fft(w_e, axis=0)) ** 2
    return spec.sum(axis=1)[1 : (p - 1) // 2 + 1]


def answer_schema(level: str, p: int | None = None) -> dict:
    return frequency_schema(p or LEVELS[level][0][0], K_MAX)


def _waves(p: int, freqs: list[int], amps: list[float], basis: np.ndarray) -> np.ndarray:
    t = np.arange(p)[:, None]
    out = np.zeros((p, basis.shape[0]))
    for i, (k, a) in enumerate(zip(freqs, amps, strict=True)):
        ang = 2 * np.pi * k * t / p
        out += a * (np.cos(ang) * basis[:, 2 * i] + np.sin(ang) * basis[:, 2 * i + 1])
    return out


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    primes, (k_lo, k_hi), (d_lo, d_hi), (r_lo, r_hi), noise = LEVELS[level]
    p = s.pick(primes)
    half = (p - 1) // 2
    while True:  # deterministic rejection sampling until the stated rule holds with a margin
        n_keys, n_dis = s.between(k_lo, k_hi), s.between(d_lo, d_hi)
        freqs = [f + 1 for f in s.sample(half, n_keys + n_dis)]
        keys, distractors = sorted(freqs[:n_keys]), freqs[n_keys:]
        key_amp = [s.fraction(0.85, 1.0) for _ in keys]
        dis_amp = [min(key_amp) * s.fraction(r_lo, r_hi) for _ in distractors]
        basis = s.orthogonal(D_MODEL)
        w_e = _waves(p, keys + distractors, key_amp + dis_amp, basis) + s.normal(p, D_MODEL, scale=noise)
        w_e = quantise(w_e).astype(np.float64)
        power = freq_power(w_e) / freq_power(w_e).max()
        others = [power[k - 1] for k in range(1, half + 1) if k not in keys]
        if min(power[k - 1] for k in keys) >= 0.5 and max(others) <= 0.2:
            break
    # The unembedding reads the key frequencies back (a different rotation of the same waves).
    w_u = _waves(p, keys, [1.0] * len(keys), s.orthogonal(D_MODEL)) + s.normal(p, D_MODEL, scale=noise)
    model = EmbedMLP(p, D_MODEL, D_MLP)
    w1 = s.normal(D_MLP, D_MODEL, scale=1 / np.sqrt(D_MODEL))
    w2 = s.normal(D_MODEL, D_MLP, scale=1 / np.sqrt(D_MLP))
    with torch.no_grad():
        model.embed.weight.copy_(torch.from_numpy(quantise(w_e)))
        model.unembed.weight.copy_(torch.from_numpy(quantise(w_u)))
        model.mlp[0].weight.copy_(torch.from_numpy(quantise(w1)))
        model.mlp[0].bias.copy_(torch.from_numpy(quantise(s.normal(D_MLP, scale=0.1))))
        model.mlp[2].weight.copy_(torch.from_numpy(quantise(w2)))
        model.mlp[2].bias.copy_(torch.from_numpy(quantise(s.normal(D_MODEL, scale=0.1))))
    grid = torch.cartesian_prod(torch.arange(p), torch.arange(p))
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model.eval(),
        probe={"tokens": grid, "p": p},
        config={"kind": "embed-mlp", "p": p, "d_model": D_MODEL, "d_mlp": D_MLP},
        prompt=prompt.TEXT.format(p=p, d=D_MODEL, half=half),
        answer_schema=answer_schema(level, p),
        truth={"kind": AnswerKind.FREQUENCIES, "p": p, "frequencies": keys},
    )
