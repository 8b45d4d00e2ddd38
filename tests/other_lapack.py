"""A context in which numpy's LAPACK answers are chosen differently wherever they are not unique: a random basis of
every subspace of equal singular values (``svd``) or eigenvalues (``eigh``), random signs of the columns of ``qr``.
Another BLAS build, another CPU or another numpy may make any of these choices; a generator whose truth or weights
depend on them gives different instances on different machines (tests/test_platform_independence.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

_SVD, _QR, _EIGH = np.linalg.svd, np.linalg.qr, np.linalg.eigh


def _clusters(values: np.ndarray, rel_tol: float = 1e-9) -> list[tuple[int, int]]:
    """[start, stop) runs of equal values (within rel_tol) in an already sorted vector."""
    out, start = [], 0
    while start < len(values):
        stop = start + 1
        while stop < len(values) and abs(values[start] - values[stop]) <= rel_tol * max(abs(values[start]), 1e-300):
            stop += 1
        out.append((start, stop))
        start = stop
    return out


@contextmanager
def another_lapack(seed: int = 7) -> Iterator[None]:
    rng = np.random.default_rng(seed)

    def rotation(n: int) -> np.ndarray:
        return _QR(rng.standard_normal((n, n)))[0]

    def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
        res = _SVD(a, full_matrices=full_matrices, compute_uv=compute_uv, hermitian=hermitian)
        if not compute_uv or np.ndim(a) != 2:
            return res
        u, s, vt = res[0].copy(), res[1], res[2].copy()
        for start, stop in _clusters(s):
            r = rotation(stop - start)
            u[:, start:stop], vt[start:stop] = u[:, start:stop] @ r, r.T @ vt[start:stop]
        return u, s, vt

    def qr(a, mode="reduced"):
        res = _QR(a, mode=mode)
        if mode != "reduced" or np.ndim(a) != 2:
            return res
        signs = rng.choice([-1.0, 1.0], res[0].shape[1])
        return res[0] * signs[None, :], res[1] * signs[:, None]

    def eigh(a, UPLO="L"):
        w, v = _EIGH(a, UPLO)
        v = v.copy()
        for start, stop in _clusters(w):
            v[:, start:stop] = v[:, start:stop] @ rotation(stop - start)
        return w, v

    np.linalg.svd, np.linalg.qr, np.linalg.eigh = svd, qr, eigh
    try:
        yield
    finally:
        np.linalg.svd, np.linalg.qr, np.linalg.eigh = _SVD, _QR, _EIGH
