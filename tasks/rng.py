"""Seed streams: platform-independent discrete choices and quantised continuous draws.

Why: docs/CONTRACT.md, "Determinism and versions". The *truth* (indices, frequencies, heads) must be identical on every
platform, so discrete choices use only ``PCG64.random_raw()`` (64-bit integers, defined by the
algorithm) and our own integer arithmetic -- never ``Generator.integers`` or ``choice``, whose
algorithms may change between numpy releases. Continuous weights come from a ``Generator`` and are
rounded to multiples of 2**-16 before the float32 cast, so ulp-level differences of BLAS/SIMD in any
float64 arithmetic done before the rounding vanish (barring a value exactly on a rounding edge).
"""

from __future__ import annotations

import hashlib

import numpy as np

QUANTUM = 2.0**-16


def _tag(text: str) -> int:
    """A stable 64-bit integer for a stream name (sha256, not ``hash()``, which is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def quantise(x: np.ndarray | float) -> np.ndarray:
    """Round to the 2**-16 grid and cast to float32 (exact for |x| < 2**8)."""
    return (np.round(np.asarray(x, dtype=np.float64) / QUANTUM) * QUANTUM).astype(np.float32)


class Stream:
    """One deterministic random stream, named by (seed, stream name).

    Families that share a model kind use different stream names, so one seed never yields the
    same instance (and so never the same answer) for two families.
    """

    def __init__(self, seed: int, name: str):
        if not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        entropy = [int(seed), _tag(name)]
        self._bits = np.random.PCG64(np.random.SeedSequence(entropy))
        self._gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([*entropy, 1])))

    # -- discrete (platform independent) -------------------------------------------------
    def raw(self) -> int:
        return int(self._bits.random_raw())

    def below(self, n: int) -> int:
        """Uniform integer in [0, n) by rejection on raw 64-bit draws (no modulo bias)."""
        if n <= 0:
            raise ValueError("n must be positive")
        limit = (2**64 // n) * n
        while True:
            r = self.raw()
            if r < limit:
                return r % n

    def between(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] inclusive."""
        return lo + self.below(hi - lo + 1)

    def pick(self, items: list | tuple):
        return items[self.below(len(items))]

    def permutation(self, n: int) -> list[int]:
        """Fisher-Yates with our own integer draws."""
        out = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out

    def sample(self, n: int, k: int) -> list[int]:
        """k distinct integers from range(n), in draw order."""
        return self.permutation(n)[:k]

    def fraction(self, lo: float, hi: float, steps: int = 4096) -> float:
        """A value on a fixed grid in [lo, hi], chosen by integer draws (for truth-relevant scalars)."""
        return lo + (hi - lo) * self.below(steps + 1) / steps

    # -- continuous (quantised before the float32 cast) -----------------------------------
    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        """Standard normal draws in float64 (quantise the final weights with :func:`quantise`)."""
        return self._gen.standard_normal(shape) * scale

    def uniform(self, *shape: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
        return self._gen.uniform(lo, hi, shape)

    def orthogonal(self, n: int) -> np.ndarray:
        """A random orthogonal matrix (QR of a Gaussian, signs fixed so it is unique)."""
        q, r = np.linalg.qr(self.normal(n, n))
        return q * np.sign(np.diag(r))[None, :]
