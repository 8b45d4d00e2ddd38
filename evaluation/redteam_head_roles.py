"""A red team's weights-only reading of head-roles 7 (2026-12-04): every role at 0.99, no forward pass, no W_in.

Accepted as interpretability (docs/TASKS.md, head-roles' findings): it reads the circuit in a decoded feature
basis, step by step, rather than a statistic that goes with the role. Kept as code as the family's weight-space
reference: ``tests/test_head_roles.py`` holds that it still works (a version that closes it must say so in
docs/TASKS.md) and ``bench/redteam_head_roles.py`` prints its scores. It reads only the attention weights of
blocks 1-2, block 0's W_out and the unembedding, and learns nothing. The steps, and the construction detail each one
uses:

1. Firing units: block 0's W_out rows with the smallest norms (the firing units' writes are shorter than the
   never-firing completion's: a gap in the sorted norms). Each row comes twice (a unit and its partner).
2. The copying head: the block-1 head whose OV the block-2 keys read (K-composition norm; the other block-1 heads
   write ``scr``, which nothing reads).
3. Cleaning the decoder (the decisive step): a firing unit of one kind (positions or tokens) writes, on the features
   its kind does not decode, only its filler, which lies in the left null space of its kind's incidence. The token-side
   features are found as W_U's columns (``tok3``) and what the copying head writes from them (``prev``); the
   position-side ones as the heads' private key spaces (the eigenvectors of the heads' mean key projector with
   eigenvalues between 0.02 and 0.5, what one head reads and the others do not). The left null space of the firing
   rows restricted to the token side is then exactly the span the position codes decode from, and the other way
   round: projecting the rows onto those spans removes the filler, and what is left are the codes' decoded features.
4. The induction head: the block-2 head whose QK, composed with the copying head's OV and the decoded link, closes
   on W_U to the largest trace (its ``prev`` map is the identity; every other head's is a fixed-point-free power).
5. Offsets: in the span of the position codes' decodings, each head's QK is one cyclic shift of 16 position
   directions. The copying head's map (offset 1) orders them (the direction it never produces is the last position,
   the one it kills the first); every head's offset is the shift that best matches its map in that order, refined by
   fitting all heads' maps jointly and snapping to the offsets the family uses. Offsets name the roles.
"""

from __future__ import annotations

import numpy as np
import torch

from ..arch import HookedTransformer

ROLE_OF_OFFSET = {1: "previous-token", 2: "local", 3: "local", 4: "none", 5: "none", 6: "none", 8: "duplicate-token",
                  15: "attend-to-first"}  # fmt: skip
SNAP = {0: 1, 7: 8, 9: 8, 10: 8, 11: 15, 12: 15, 13: 15, 14: 15}  # offsets the family never uses, to the nearest used
N_POS = 16


def _orth(m: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    u, s, _ = np.linalg.svd(m, full_matrices=False)
    return u[:, s > tol * s[0]]


def _left_null(m: np.ndarray, k: int) -> np.ndarray:
    return np.linalg.svd(m, full_matrices=True)[0][:, -k:]


def _firing_rows(w_out: np.ndarray) -> np.ndarray:
    """Step 1: the rows below the largest gap in the sorted row norms, one of each duplicated pair kept (as an
    orthonormal-row basis scaled by the singular values)."""
    norms = np.linalg.norm(w_out, axis=1)
    s = np.sort(norms)
    cut = int(np.argmax(np.diff(s)))
    rows = w_out[norms < (s[cut] + s[cut + 1]) / 2]
    _, sv, vt = np.linalg.svd(rows, full_matrices=False)
    half = len(rows) // 2
    return np.diag(sv[:half]) @ vt[:half]


def _gram_schmidt(u: np.ndarray, basis: list[np.ndarray]) -> np.ndarray:
    for v in basis:
        u = u - (u @ v) * v
    return u / np.linalg.norm(u)


def _order_positions(m_copy: np.ndarray) -> np.ndarray:
    """Step 5's start: 16 position directions ordered by the copying head's shift, built from both ends."""
    u, _, vt = np.linalg.svd(m_copy)
    back = [vt[-1]]  # the direction the map never produces: the last position
    for _ in range(N_POS // 2 - 1):
        back.append(_gram_schmidt(back[-1] @ m_copy, back))
    fwd = [_gram_schmidt(u[:, -1], back)]  # the direction it kills: the first
    for _ in range(N_POS // 2 - 1):
        fwd.append(_gram_schmidt(fwd[-1] @ m_copy.T, back + fwd))
    return np.array(fwd + back[::-1])


def _shift_scores(order: np.ndarray, m: np.ndarray) -> np.ndarray:
    p = order @ m @ order.T
    p = p / np.abs(p).max()
    i = np.arange(N_POS)
    return np.array([p[i, (i - d) % N_POS].sum() for d in range(N_POS)])


def _offset(scores: np.ndarray) -> int:
    d = int(np.argmax(scores))
    return SNAP.get(d, d)


def _fit_jointly(order: np.ndarray, maps: dict[str, np.ndarray], rounds: int = 6) -> dict[str, np.ndarray]:
    """Re-estimate every position direction from all heads' maps at their current offsets, re-orthonormalise."""
    scores = {n: _shift_scores(order, m) for n, m in maps.items()}
    for _ in range(rounds):
        new = np.zeros_like(order)
        for n, m in maps.items():
            k = _offset(scores[n])
            for j in range(N_POS):
                new[j] += order[(j + k) % N_POS] @ m + order[(j - k) % N_POS] @ m.T
        a, _, b = np.linalg.svd(new)
        order = a @ b
        scores = {n: _shift_scores(order, m) for n, m in maps.items()}
    return scores


def _best_fit(maps: dict[str, np.ndarray], copy: str) -> dict[str, np.ndarray]:
    """Step 5 from several starting orders (the copying head's map, the mean map of the heads first read at offset 1,
    and with the mean transposed map of those read at 15), keeping the joint fit whose offsets explain the maps best
    (the sum of each head's normalised score at its offset)."""
    first = {n: _shift_scores(_order_positions(maps[copy]), m) for n, m in maps.items()}
    prevs = [maps[n] for n in maps if _offset(first[n]) == 1]
    backs = [maps[n].T for n in maps if _offset(first[n]) == 15]
    starts = [maps[copy], *prevs, sum(prevs) / len(prevs)]
    if backs:
        starts.append((sum(prevs) / len(prevs) + sum(backs) / len(backs)) / 2)
    best, best_fit = None, -np.inf
    for start in starts:
        scores = _fit_jointly(_order_positions(start), maps)
        fit = sum(sc[_offset(sc)] / np.linalg.norm(sc) for sc in scores.values())
        if fit > best_fit:
            best, best_fit = scores, fit
    return best


def read_roles(model: HookedTransformer, first: int = 1) -> dict[str, str]:
    """Every graded head's role, from the weights named in the module docstring only."""
    with torch.no_grad():
        w_out = model.blocks[0].mlp.W_out.double().numpy()
        w_u = model.W_U.double().numpy()
        heads = {}
        for lay in range(first, model.cfg.n_layers):
            for h in range(model.cfg.n_heads):
                q, k, v, o = (w[lay, h].double().numpy() for w in (model.W_Q, model.W_K, model.W_V, model.W_O))
                heads[f"L{lay}H{h}"] = {"qk": q @ k.T, "ov": v @ o, "k": k}
    names = list(heads)
    block2 = [n for n in names if not n.startswith(f"L{first}")]
    keys2 = np.concatenate([heads[n]["k"] for n in block2], 1)
    copy = max((n for n in names if n.startswith(f"L{first}")), key=lambda n: np.linalg.norm(heads[n]["ov"] @ keys2))
    firing = _firing_rows(w_out)
    vocab = w_u.shape[1]
    token_side = _orth(np.concatenate([w_u, (w_u.T @ heads[copy]["ov"]).T], 1))[:, : 2 * vocab]
    key_bases = [_orth(heads[n]["k"]) for n in names]
    key_proj = sum(b @ b.T for b in key_bases) / len(names)
    ev, evec = np.linalg.eigh(key_proj)
    key_side = evec[:, (ev > 0.02) & (ev < 0.5)]
    pos_span = _left_null(firing @ token_side, N_POS)
    tok_span = _left_null(firing @ key_side, vocab)
    clean = (pos_span @ pos_span.T + tok_span @ tok_span.T) @ firing
    link = _orth(clean.T)[:, :40]
    link = link @ link.T
    induction = max(block2, key=lambda n: np.trace(w_u.T @ heads[copy]["ov"] @ heads[n]["qk"].T @ link @ w_u))
    basis = _orth(firing.T @ pos_span)[:, :N_POS]
    maps = {n: basis.T @ heads[n]["qk"] @ basis for n in names}
    maps = {n: m / np.linalg.norm(m) for n, m in maps.items()}
    scores = _best_fit(maps, copy)
    roles = {n: ROLE_OF_OFFSET.get(_offset(scores[n]), "none") for n in names}
    roles[copy] = "previous-token"
    roles[induction] = "induction"
    return roles
