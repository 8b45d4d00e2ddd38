"""The shortcut audit: answering a family without the interpretability it names, with the family's own grader.

Why: a family is a benchmark only if its answer cannot be read off the weights by statistics, found by a
classifier trained on other seeds, or guessed from priors and the probe data's layout. Two audits of earlier
versions found all three (issue 16: a composed-weights SVD gave causal-subspace's subspace exactly, the smallest
QK spectral norm named the induction head, a constant middle layer farmed fact-storage's neighbour credit).
This module runs those strategies, by class, against any family whose answer kind it knows:

- ``stats``: one per-component statistic (norms, sorted singular-value profiles of QK, OV and MLP matrices,
  effective and numerical ranks, kurtosis and max-abs of entries, biases), ranked both ways, told the answer
  size (over all components, and per layer told each layer's count);
- ``composed``: the same for products along residual paths (full QK and OV circuits through the embedding and
  unembedding, the QK cross terms between tokens and positions, head-to-head composition norms and their
  token-aligned traces with partner counts, MLP products), and, for subspace answers, the top singular vectors of
  every product of the weight matrices; for set answers also a logistic regression and a nearest-centroid rule on
  all composed readings at once, fitted on half the seeds (a learned composed reading: issue 16's red team scored
  0.81 on induction-circuit v4 that way while every single reading stayed under 0.25);
- ``classifier``: a logistic (softmax for roles) regression and a nearest-centroid rule on all those features,
  fitted on half the seeds and scored on the other half, both ways;
- ``prior``: the best constant answer, and the best answer built from the probe data's layout (positions by
  token-id thresholds), chosen on half the seeds and scored on the other half.

Each class's figure is the best strategy's mean score (chance-corrected where the family's grader is). Families
whose stated definition is itself a weight formula are exempt from the classes that formula answers
(:data:`EXEMPT`). ``tests/test_shortcut_audit.py`` holds every family to <= 0.3 on 40 seeds per level;
``bench/shortcut_audit.py`` prints the table.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..answer_kind import AnswerKind
from ..tasks import Instance, get_family
from ..tasks.circuits import Ablator, QueryAblator

CLASSES = ("stats", "composed", "classifier", "prior")
LIMIT = 0.3
SCALES = (1, 2, 3, 4)  # answer sizes the set readings try, in multiples of the true size

# family -> (classes it is exempt from, why). The reason is printed by the bench and the test.
EXEMPT: dict[str, tuple[tuple[str, ...], str]] = {
    "dead-neurons": (CLASSES, "a dead unit is defined by its weights and bias on the input box (a weight formula)"),
    "fourier-frequencies": (CLASSES, "the key rule is the embedding's Fourier power (a weight formula)"),
    "superposition": (CLASSES, "represented features and groups are defined by W's columns and biases"),
    "multiplication-neuron": (("composed",), "the unit is defined by its bilinear coefficients (left x right x out)"),
    "additive-bypass": (("composed",), "the unit is defined by its bilinear coefficients (left x right x out)"),
}


def is_composed(feature: str) -> bool:
    return feature.startswith("composed:")


def feature_columns(names: list[str]) -> list[tuple[str, list[tuple[int, str]]]]:
    """The feature columns of each single-feature class: ``stats`` (per-component) and ``composed`` (products)."""
    return [("stats", [(j, n) for j, n in enumerate(names) if not is_composed(n)]),
            ("composed", [(j, n) for j, n in enumerate(names) if is_composed(n)])]  # fmt: skip


@dataclass
class Finding:
    """One class's best strategy for one (family, level)."""

    cls: str
    score: float
    strategy: str


# ---------------------------------------------------------------------------------------------
# matrix statistics
# ---------------------------------------------------------------------------------------------
N_PROFILE = 8


def matrix_stats(
    name: str, m: torch.Tensor | None, factors: tuple[torch.Tensor, torch.Tensor] | None = None
) -> dict[str, float]:
    """Spectral profile and entry statistics of one matrix (rotation-invariant and not). ``factors`` (A, B) with
    m = A @ B.T give the singular values from two thin QRs (a head's QK or OV has rank <= d_head). With factors,
    ``m`` may be None: then the matrix is never formed and the entry statistics (kurtosis, max-abs) are left out,
    which is what a reading in a basis without meaning needs (its Frobenius norm is the singular values')."""
    # a float32 ``m`` (a unit-basis circuit: head_components) keeps its dtype: its entry statistics are features, and
    # float32's relative error (1e-7) is far below what separates any two of them
    if m is not None and factors is None:
        m = m.double()
    if factors is not None:  # the thin factors' R matrices, once for the spectrum and both sides' duplicate rows
        a, b = (f.double() for f in factors)
        ra, rb = torch.linalg.qr(a, mode="r")[1], torch.linalg.qr(b, mode="r")[1]  # R alone: half the QR's work
        sv = torch.linalg.svdvals(ra @ rb.mT)
    elif m is not None:
        sv = torch.linalg.svdvals(m)
    else:
        raise ValueError("matrix_stats needs the matrix or its factors")
    top = float(sv[0]) if sv.numel() else 0.0
    fro = float(m.norm()) if m is not None else float(sv.norm())
    out = {f"{name}.fro": fro, f"{name}.spec": top}
    for i in range(1, N_PROFILE):
        out[f"{name}.sv{i}"] = float(sv[i] / top) if i < sv.numel() and top > 0 else 0.0
    p = sv / sv.sum().clamp_min(1e-30)
    out[f"{name}.eff_rank"] = float(torch.exp(-(p * torch.log(p + 1e-30)).sum()))
    out[f"{name}.num_rank"] = float((sv > 1e-3 * max(top, 1e-30)).sum())
    if factors is not None:  # rows of A @ B.T, compared through r-dim images of them (d^2 r, not d^3)
        out[f"{name}.dups"] = float(duplicate_rows(a @ rb.T) + duplicate_rows(b @ ra.T))
    else:
        out[f"{name}.dups"] = float(duplicate_rows(m) + duplicate_rows(m.T))
    if m is None:
        return out
    # entry statistics in few passes over the entries (a head's QK is d_model^2 of them, and this ran for every
    # head of every audited instance): squared deviations once, their moments as dot products
    flat = m.flatten()
    sq_dev = (flat - flat.mean()).square_()
    var = float(sq_dev.mean())
    out[f"{name}.kurt"] = float(torch.dot(sq_dev, sq_dev)) / flat.numel() / var**2 if var > 0 else 0.0
    rms = float(torch.dot(flat, flat) / flat.numel()) ** 0.5
    lo, hi = torch.aminmax(flat)
    out[f"{name}.maxabs"] = max(-float(lo), float(hi)) / rms if rms > 0 else 0.0
    return out


def low_rank_svdvals(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Singular values of a @ b^T (batched over leading dims) from the QRs of a and b, in float64: the r largest,
    r = the factors' width, the others being zero (cheap when both are thin: a head's QK is d_model x d_model of
    rank <= d_head)."""
    _, ra = torch.linalg.qr(a.double(), mode="r")
    _, rb = torch.linalg.qr(b.double(), mode="r")
    return torch.linalg.svdvals(ra @ rb.mT)


def duplicate_rows(rows: torch.Tensor, cos: float = 0.9999) -> int:
    """How many rows are (anti)parallel copies of another non-zero row. For M = A B^T, :func:`matrix_stats` passes
    the rows of A R^T (B = QR, d x r) instead of M's: <a_i B^T, a_j B^T> = a_i (B^T B) a_j^T = <a_i R^T, a_j R^T>,
    so they have M's rows' lengths and cosines at d^2 r instead of d^3."""
    norms = rows.norm(dim=1)
    live = norms > 1e-6 * max(float(norms.max()) if norms.numel() else 0.0, 1e-30)
    if int(live.sum()) < 2:
        return 0
    unit = rows[live] / norms[live, None]
    # the Gram (d^2 r, this function's whole cost, run twice per circuit of every audited head) in float32 first, at
    # half the time; rows within 1e-4 of ``cos`` there (float32's error on these cosines: at most 4.2e-7 measured for
    # 1100 unit rows of width 80) are decided in float64, so the count is float64's exactly
    single = unit.float()
    c = (single @ single.T).abs_()
    c.fill_diagonal_(0.0)
    best = c.max(dim=1).values.double()
    near = ((best - cos).abs() < 1e-4).nonzero()[:, 0]
    if near.numel():
        exact = (unit[near] @ unit.T).abs_()
        exact[torch.arange(near.numel()), near] = 0.0
        best[near] = exact.max(dim=1).values
    return int((best > cos).sum())


# ---------------------------------------------------------------------------------------------
# components and their features, per answer kind
# ---------------------------------------------------------------------------------------------
@dataclass
class Components:
    """The candidate components of one instance: ids as answers name them, a group (layer) each, and
    features (names prefixed ``composed:`` are products along residual paths)."""

    keys: list[Any]
    groups: list[int]
    names: list[str]
    x: np.ndarray  # [n_components, n_features]


def _table(keys: list[Any], groups: list[int], rows: list[dict[str, float]]) -> Components:
    names = sorted(rows[0])
    return Components(keys, groups, names, np.array([[r[n] for n in names] for r in rows], dtype=np.float64))


def earlier_mlp_writes(model: Any, layer: int) -> torch.Tensor:
    """The write rows (W_out) of every MLP before ``layer``'s attention, stacked [units, d_model] (one zero row
    where there is none): the neuron basis a head's circuits are read in by ``composed:qk_mlp`` / ``ov_mlp``."""
    rows = [block.mlp.W_out.double() for block in model.blocks[:layer] if hasattr(block, "mlp")]
    return torch.cat(rows) if rows else torch.zeros(1, model.cfg.d_model, dtype=torch.float64)


def distinct_units(rows: torch.Tensor, cos: float = 0.99) -> torch.Tensor:
    """The rows of a unit basis (``earlier_mlp_writes``) a reading should see: without the all-zero rows (a
    switched-off MLP's units: head-roles' blocks 1-2), and each mutually nearest pair of rows whose cosine exceeds
    ``cos`` (a unit and a partner writing the same vector, as every unit of head-roles' decoder has, exactly or
    within the noise) merged into their mean. Why: duplicated rows and columns only repeat entries (the support
    fractions and the kurtosis do not change) and a zero block only dilutes them, while they made head-roles 7's
    unit-basis circuits 16x larger at block 2 (2228^2 entries per head instead of 557^2): most of the audit's time."""
    live = rows[rows.norm(dim=1) > 0]
    if len(live) < 2:
        return live
    unit = live / live.norm(dim=1, keepdim=True)
    c = unit @ unit.T
    c.fill_diagonal_(-2.0)
    best, partner = c.max(dim=1)
    idx = torch.arange(len(live))
    pair = (best > cos) & (partner[partner] == idx)
    keep = ~pair | (idx < partner)  # one row per merged pair: the lower index holds the mean
    merged = torch.where(pair[:, None], (live + live[partner]) / 2, live)
    return merged[keep]


UNIT_BASIS = ("composed:qk_mlp", "composed:ov_mlp")
SUPPORT_LEVELS = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


def support_profile(name: str, m: torch.Tensor) -> dict[str, float]:
    """How many entries (and rows, and columns) of a matrix read in a privileged basis reach each fraction of its
    largest entry: the support of a circuit written in that basis (head-roles 3's red team labelled roles from
    such counts of W_out QK W_out^T at 0.76-0.91 while its spectra matched)."""
    a = m.abs()
    if not a.numel():
        return {f"{name}.{kind}{t}": 0.0 for t in SUPPORT_LEVELS for kind in ("support", "rows", "cols")}
    top = float(a.max())
    rows, cols = a.amax(dim=1), a.amax(dim=0)  # a row holds an entry above a level iff its largest is above it
    out = {}
    for t in SUPPORT_LEVELS:
        level = t * top if top > 0 else float("inf")
        out[f"{name}.support{t}"] = float(torch.count_nonzero(a > level)) / a.numel()  # 2x a bool sum's speed
        out[f"{name}.rows{t}"] = float(torch.count_nonzero(rows > level)) / rows.numel()
        out[f"{name}.cols{t}"] = float(torch.count_nonzero(cols > level)) / cols.numel()
    return out


def shared_subspaces(
    wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, first: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Projectors that remove the d_head-dim subspace the graded heads share most, on the side heads read (the
    column spaces of W_Q, W_K and W_V) and on the side they write (those of W_O^T): sum every head's projectors,
    take the top d_head eigenvectors. Why: a padding that gives every head one spectral profile by leaning each
    head's circuit into one common subspace nothing uses on the data (head-roles' and induction-circuit's
    ``pad_spectrum``) is found this way, and stripping it gives back the planted circuit exactly (a red team,
    2026-12-04: head-roles 4's roles from the stripped QK's rank, 0.99 at every level with no training)."""
    d, dh = wq.shape[-2], wq.shape[-1]
    eye = torch.eye(d, dtype=torch.float64)
    strip = []
    for mats in ((wq, wk, wv), (wo.mT,)):
        acc = torch.zeros(d, d, dtype=torch.float64)
        for w in mats:
            basis = torch.linalg.qr(w[first:].reshape(-1, d, dh))[0]  # [heads, d, d_head]
            acc += torch.einsum("hdr,her->de", basis, basis)
        top = torch.linalg.eigh(acc)[1][:, -dh:]
        strip.append(eye - top @ top.T)
    return strip[0], strip[1]


def top_directions(wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """[4, heads, d]: each head's top singular pair of QK (query side, key side) and of OV (read side, write side),
    unit vectors (signs arbitrary: readers of them take absolute cosines)."""
    out = []
    for left, right in ((wq, wk), (wv, wo.mT)):
        (ql, rl), (qr, rr) = torch.linalg.qr(left), torch.linalg.qr(right)
        u, _, vh = torch.linalg.svd(rl @ rr.mT)
        out += [(ql @ u[..., :, :1])[..., 0], (qr @ vh[..., :1, :].mT)[..., 0]]
    return torch.stack(out)


def direction_similarity(dirs: torch.Tensor) -> list[dict[str, float]]:
    """Per head (rows of ``dirs`` [4, heads, d] from :func:`top_directions`): the mean absolute cosine of its top
    query, key, read and write directions with every other head's, and its query's mean similarity among the heads
    whose key reads what its key reads, or whose OV reads and writes what its OV does. Why: a red team (2026-12-04,
    copy-head 5's second cut) took the heads that read the mark and copy the marked tokens and answered the one whose
    query was least like theirs (0.87 / 0.84 / 0.70); an odd one out among look-alikes is a cross-head reading any
    family's decoys must survive."""
    cos = torch.einsum("khd,kjd->khj", dirs, dirs).abs()  # [4, heads, heads]
    n = cos.shape[1]
    off = ~torch.eye(n, dtype=torch.bool)
    cos = cos * off
    names = ("q", "k", "v", "o")
    rows = []
    for h in range(n):
        r = {f"composed:sim_{name}.mean": float(cos[i, h].sum() / max(n - 1, 1)) for i, name in enumerate(names)}
        for cond, weight in (("k", cos[1, h]), ("ov", cos[2, h] * cos[3, h])):
            total = float(weight.sum())
            r[f"composed:sim_q_given_{cond}"] = float((weight * cos[0, h]).sum()) / total if total > 0 else 0.0
        rows.append(r)
    return rows


def circuit_overlaps(
    wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, layers: list[int]
) -> list[dict[str, float]]:
    """Per head (heads flattened [heads, d, d_head], ``layers`` their layers): how much of its QK and of its OV other
    heads share, |<M_h, M_g>_F| / (|M_h| |M_g|), summarised as the largest, second and third, the mean, and the
    largest within its layer and across layers. Why: a red team (2026-12-04, head-roles 6) found that heads planted
    with the same rule share the same entries in the one decoded basis, so the Frobenius inner products of their
    circuits count shared pairs through any rotation; clusters of heads with large overlaps, and with whom (its own
    block, the other), labelled roles at 0.36-0.48 with three hand rules. The circuits are formed (n d^2 d_head
    flops): through the factors, every pair's d_head x d_head Gram costs (n d_head)^2 d, 5x more here."""
    out: list[dict[str, float]] = [{} for _ in range(wq.shape[0])]
    same = torch.tensor(layers)[:, None] == torch.tensor(layers)[None, :]
    for name, (a, b) in (("qk", (wq, wk)), ("ov", (wv, wo.mT))):
        flat = (a @ b.mT).flatten(1)  # the circuits themselves, [heads, d^2]: n d^2 r flops, not (n r)^2 d
        gram = flat @ flat.T
        norm = gram.diagonal().clamp_min(1e-30).sqrt()
        cos = (gram / (norm[:, None] * norm[None, :])).abs()
        cos.fill_diagonal_(0.0)
        for h, row in enumerate(cos):
            top = torch.sort(row, descending=True).values
            r = out[h]
            for i, key in enumerate(("max", "second", "third")):
                r[f"composed:{name}_overlap.{key}"] = float(top[i]) if i < len(top) else 0.0
            r[f"composed:{name}_overlap.mean"] = float(row.sum() / max(len(row) - 1, 1))
            mine, other = row[same[h]], row[~same[h]]
            r[f"composed:{name}_overlap.same_layer"] = float(mine.max()) if mine.numel() else 0.0
            r[f"composed:{name}_overlap.other_layer"] = float(other.max()) if other.numel() else 0.0
    return out


def head_components(inst: Instance, first: int = 0) -> Components:
    """Every attention head, with its QK and OV profiles and those of its full circuits and compositions. In a
    model with MLPs, also each head's circuits in the basis of the earlier MLPs' units (W_out QK W_out^T and
    W_out OV): products along the residual path from those units, which a head reading decoded features meets
    instead of the embeddings. Heads of layers before ``first`` are left out (they are not graded)."""
    m = inst.model
    cfg = m.cfg
    with torch.no_grad():
        wq, wk, wv, wo = (t.double() for t in (m.W_Q, m.W_K, m.W_V, m.W_O))
        we, wpos, wu = m.W_E.double(), m.W_pos.double(), m.W_U.double()
        comp_scores = composition_scores(wq, wk, wv, wo)
        comp_scores.update(same_token_composition(we, wq, wk, wv, wo))
        strip_in, strip_out = shared_subspaces(wq, wk, wv, wo, first)
        graded = [w[first:].flatten(0, 1) for w in (wq, wk, wv, wo)]  # [heads, ...] in the loop's order
        similar = iter(direction_similarity(top_directions(*graded)))
        layers = [lay for lay in range(first, cfg.n_layers) for _ in range(cfg.n_heads)]
        shared = iter(circuit_overlaps(*graded, layers))
        tops = {kind: float(sc.abs().max()) if sc.numel() else 0.0 for kind, sc in comp_scores.items()}
        keys, groups, rows = [], [], []
        for lay in range(first, cfg.n_layers):
            n = None if cfg.attn_only else distinct_units(earlier_mlp_writes(m, lay).float())
            for h in range(cfg.n_heads):
                r: dict[str, float] = {}
                for name, mat in (("q", wq[lay, h]), ("k", wk[lay, h]), ("v", wv[lay, h]), ("o", wo[lay, h])):
                    r[f"{name}.fro"] = float(mat.norm())
                r["bq"] = float(m.b_Q[lay, h].norm())
                q, k, v, o = wq[lay, h], wk[lay, h], wv[lay, h], wo[lay, h]
                r.update(matrix_stats("qk", q @ k.T, (q, k)))  # per graded head: block 0's are not read
                r.update(matrix_stats("ov", v @ o, (v, o.T)))
                comp = {  # each product along a residual path as its thin factors (A, B): the matrix is A @ B.T
                    "composed:qk_tok": (we @ q, we @ k),
                    "composed:qk_pos": (wpos @ q, wpos @ k),
                    # the cross terms: token queries against positional keys and the reverse
                    "composed:qk_tok_pos": (we @ q, wpos @ k),
                    "composed:qk_pos_tok": (wpos @ q, we @ k),
                    "composed:ov_full": (we @ v, wu.T @ o.T),
                    "composed:ov_unembed": (v, wu.T @ o.T),
                    # the circuits with the subspace every head shares stripped (shared_subspaces)
                    "composed:qk_stripped": (strip_in @ q, strip_in @ k),
                    "composed:ov_stripped": (strip_in @ v, strip_out @ o.T),
                }
                if n is not None:  # in float32: a thousand units, and these products were half the audit's time
                    q32, k32, v32 = (t.float() for t in (q, k, v))
                    comp["composed:qk_mlp"] = (n @ q32, n @ k32)
                    comp["composed:ov_mlp"] = (n @ v32, o.T.float())
                for name, fac in comp.items():
                    if name in UNIT_BASIS:  # a privileged basis: its entries, not only its spectrum, mean something
                        mat = fac[0] @ fac[1].T  # through the factors: 4x fewer flops than n @ qk @ n.T
                        r.update(matrix_stats(name, mat, fac))
                        r.update(support_profile(name, mat))
                    else:  # a rotated basis: the spectrum only, and the matrix is never formed
                        r.update(matrix_stats(name, None, fac))
                r.update(_composition(comp_scores, tops, lay, h))
                r.update(next(similar))
                r.update(next(shared))
                keys.append((lay, h))
                groups.append(lay)
                rows.append(r)
    return _table(keys, groups, rows)


def _later_pairs(
    n_layers: int, n_heads: int, pair: Callable[[int, slice], torch.Tensor], silent: Sequence[bool] = ()
) -> torch.Tensor:
    """[L, H, L, H] holding ``pair(a, later)`` ([H, L - a - 1, H]: source heads of layer a, destination heads of
    the later layers) at [a, :, a + 1:, :] and zero where the source is not earlier. Why per source layer: only
    those pairs compose, and computing every pair and masking did L^2 / (L (L - 1) / 2) times the work. A layer
    marked ``silent`` (its OV exactly zero: head-roles' switched-off block 0) is left at zero, which is what its
    pairs are: it was two thirds of head-roles' composition work."""
    out = torch.zeros(n_layers, n_heads, n_layers, n_heads, dtype=torch.float64)
    for a in range(n_layers - 1):
        if a < len(silent) and silent[a]:
            continue
        out[a, :, a + 1 :] = pair(a, slice(a + 1, None))
    return out


def _silent_layers(wv: torch.Tensor, wo: torch.Tensor) -> list[bool]:
    """Per layer: whether every head's OV is exactly zero (W_V or W_O all zero), so it composes with nothing."""
    return [bool((wv[a] == 0).all() or (wo[a] == 0).all()) for a in range(wv.shape[0])]


def composition_scores(
    wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Composition norms (Elhage et al.) of every (source head, later destination head): how strongly the
    destination's query, key or value reads what the source writes, ||OV_s M_t||_F / (||OV_s||_F ||M_t||_F) with
    M_t = QK_t, QK_t^T or OV_t. [kind] -> [L, H, L, H], zero unless the source's layer is earlier. Computed through
    thin QRs (every factor has d_head columns), so no d_model x d_model product is formed."""
    n_layers, n_heads = wq.shape[:2]
    silent = _silent_layers(wv, wo)
    src = torch.linalg.qr(wv, mode="r")[1] @ wo  # ||V O X|| = ||R_V O X||: [L, H, dh, d]
    src_norm = src.norm(dim=(-2, -1))
    out = {}
    for kind, (c, dmat) in {"q": (wq, wk), "k": (wk, wq), "v": (wv, wo.transpose(-1, -2))}.items():
        dst = c @ torch.linalg.qr(dmat, mode="r")[1].transpose(-1, -2)  # M_t = C D^T, ||X C D^T|| = ||X C R_D^T||
        dst_norm = dst.norm(dim=(-2, -1))

        def pair(a: int, later: slice, dst: torch.Tensor = dst, dst_norm: torch.Tensor = dst_norm) -> torch.Tensor:
            core = torch.einsum("bed,cfdg->bcfeg", src[a], dst[later]).norm(dim=(-2, -1))
            return core / (src_norm[a][:, None, None] * dst_norm[later][None]).clamp_min(1e-30)

        out[kind] = _later_pairs(n_layers, n_heads, pair, silent)
    return out


def same_token_composition(
    we: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Aligned composition through the embedding, per (source head, later destination head): how much the
    destination's query (kind ``qtok``) or key (``ktok``) matches, token by token, what the source writes about
    each token: trace(W_E QK_t OV_s^T W_E^T) for keys, trace(W_E OV_s QK_t W_E^T) for queries, over the largest
    such value in the model (a Frobenius normalisation drowns the aligned part in the heads' padding and scratch
    terms). Why beside the norms of :func:`composition_scores`: a norm ties a head whose
    key reads exactly what a previous-token head writes with heads that read a scratch space many heads share; the
    trace keeps only the token-aligned part (issue 16's red team found the induction circuit this way)."""
    n_layers, n_heads = wq.shape[:2]
    gram = we.T @ we  # [d, d]
    gq = torch.einsum("de,cfey->cfdy", gram, wq)  # G Q_t
    gv = torch.einsum("de,abex->abdx", gram, wv)  # G V_s

    def keys(a: int, later: slice) -> torch.Tensor:
        # trace(W_E Q_t K_t^T O_s^T V_s^T W_E^T) = trace(M1 M2^T) = sum(M1 * M2), M1 = V_s^T G Q_t, M2 = O_s K_t
        m1 = torch.einsum("bdx,cfdy->bcfxy", wv[a], gq[later])  # [H, L', H, dh, dh]
        m2 = torch.einsum("bxd,cfdy->bcfxy", wo[a], wk[later])
        return (m1 * m2).sum((-2, -1))

    def queries(a: int, later: slice) -> torch.Tensor:
        # trace(W_E V_s O_s Q_t K_t^T W_E^T) = sum(N1 * N2^T), N1 = O_s Q_t, N2 = K_t^T G V_s
        n1 = torch.einsum("bxd,cfdy->bcfxy", wo[a], wq[later])
        n2 = torch.einsum("cfdy,bdx->bcfyx", wk[later], gv[a])
        return (n1 * n2.transpose(-1, -2)).sum((-2, -1))

    silent = _silent_layers(wv, wo)
    ktok, qtok = (_later_pairs(n_layers, n_heads, fn, silent) for fn in (keys, queries))
    return {"ktok": ktok / ktok.abs().max().clamp_min(1e-30), "qtok": qtok / qtok.abs().max().clamp_min(1e-30)}


def _composition(scores: dict[str, torch.Tensor], tops: dict[str, float], lay: int, h: int) -> dict[str, float]:
    """Per head: the max and mean composition with earlier heads (``in``) and with later heads (``out``), and how
    many partners reach half the largest value of the model (``tops``, per kind), so a head read by two later
    heads shows it."""
    out: dict[str, float] = {}
    for kind, sc in scores.items():
        top = tops[kind]
        for direction, vals in (("in", sc[:lay, :, lay, h]), ("out", sc[lay, h, lay + 1 :])):
            vals = vals.flatten()
            out[f"composed:{kind}comp_{direction}.max"] = float(vals.max()) if vals.numel() else 0.0
            out[f"composed:{kind}comp_{direction}.mean"] = float(vals.mean()) if vals.numel() else 0.0
            out[f"composed:{kind}comp_{direction}.sum"] = float(vals.sum()) if vals.numel() else 0.0
            out[f"composed:{kind}comp_{direction}.count"] = float((vals >= 0.5 * top).sum()) if top > 0 else 0.0
    return out


def mlp_layer_components(inst: Instance) -> Components:
    """Every MLP layer of a transformer (the layer of a cell answer), with its matrices' profiles."""
    m = inst.model
    with torch.no_grad():
        wu, we = m.W_U.double(), m.W_E.double()
        rows = []
        for lay in range(m.cfg.n_layers):
            w_in, w_out, b_in = m.W_in[lay].double(), m.W_out[lay].double(), m.b_in[lay].double()
            r = {**matrix_stats("w_in", w_in), **matrix_stats("w_out", w_out)}
            r.update({"b_in.mean": float(b_in.mean()), "b_in.std": float(b_in.std()), "b_in.min": float(b_in.min())})
            r.update(matrix_stats("composed:out_unembed", w_out @ wu))
            r.update(matrix_stats("composed:embed_in", we @ w_in))
            r.update(matrix_stats("composed:in_out", w_in @ w_out))
            heads = [matrix_stats("attn_ov", m.W_V[lay, h].double() @ m.W_O[lay, h].double())
                     for h in range(m.cfg.n_heads)]  # fmt: skip
            r.update({f"{k}.mean": float(np.mean([hd[k] for hd in heads])) for k in heads[0]})
            rows.append(r)
    return _table(list(range(m.cfg.n_layers)), list(range(m.cfg.n_layers)), rows)


def unit_components(inst: Instance) -> Components:
    """Hidden units of a gated MLP (``left``/``right``/``out``) or of a ReLU MLP (``[0]``/``[2]``)."""
    m = inst.model
    with torch.no_grad():
        rows = []
        if hasattr(m, "left"):
            wl, wr, wo = m.left.weight.double(), m.right.weight.double(), m.out.weight.double()
            bl, br = m.left.bias.double(), m.right.bias.double()
            for j in range(wl.shape[0]):
                r = {}
                for name, vec in (("l", wl[j]), ("r", wr[j]), ("out", wo[:, j])):
                    r.update(_vector_stats(name, vec))
                cos = abs(wl[j] @ wr[j]) / (wl[j].norm() * wr[j].norm()).clamp_min(1e-30)
                r.update({"bl": float(bl[j]), "br": float(br[j]), "lr_cos": float(cos)})
                rows.append(r)
        else:
            w, b, w2 = m[0].weight.double(), m[0].bias.double(), m[2].weight.double()
            for j in range(w.shape[0]):
                r = {**_vector_stats("in", w[j]), **_vector_stats("out", w2[:, j]), "b": float(b[j])}
                rows.append(r)
    n = len(rows)
    return _table(list(range(n)), [0] * n, rows)


def _vector_stats(name: str, v: torch.Tensor) -> dict[str, float]:
    a = v.abs()
    top = float(a.max()) if a.numel() else 0.0
    srt = torch.sort(a, descending=True).values / max(top, 1e-30)
    return {
        f"{name}.norm": float(v.norm()),
        f"{name}.l1": float(a.sum()),
        f"{name}.max": top,
        f"{name}.second": float(srt[1]) if srt.numel() > 1 else 0.0,
        f"{name}.third": float(srt[2]) if srt.numel() > 2 else 0.0,
        f"{name}.sparsity": float((a < 0.05 * max(top, 1e-30)).double().mean()),
    }


def frequency_components(inst: Instance) -> Components:
    """Frequencies 1..p//2 of a modular-arithmetic model: the token-axis Fourier power of every matrix with a
    token axis (embedding, unembedding) and of the embedding composed with the first layer's weights."""
    m = inst.model
    p = int(inst.truth["p"])
    with torch.no_grad():
        mats = {"embed": m.embed.weight.double(), "unembed": m.unembed.weight.double()}
        d = mats["embed"].shape[1]
        for side, w in (("left", getattr(m.mlp, "left", None)), ("right", getattr(m.mlp, "right", None))):
            if w is not None:
                wt = w.weight.double()
                mats[f"composed:{side}_a"] = mats["embed"] @ wt[:, :d].T
                mats[f"composed:{side}_b"] = mats["embed"] @ wt[:, d : 2 * d].T
        if hasattr(m.mlp, "out"):
            mats["composed:out_unembed"] = m.unembed.weight.double() @ m.mlp.out.weight.double()
        n_f = p // 2
        rows = [dict() for _ in range(n_f)]
        for name, mat in mats.items():
            power = torch.fft.rfft(mat, dim=0).abs().pow(2).sum(dim=1)[1 : n_f + 1]
            share = power / power.sum().clamp_min(1e-30)
            for f in range(n_f):
                rows[f][f"{name}.power"] = float(share[f])
                rows[f][f"{name}.rank"] = float((share > share[f]).sum())
        if hasattr(m.mlp, "out") and hasattr(m.mlp, "left"):
            for f, stats in enumerate(_unit_groups(m, n_f)):
                rows[f].update(stats)
    return _table(list(range(1, n_f + 1)), [0] * n_f, rows)


def _unit_groups(m: Any, n_f: int) -> list[dict[str, float]]:
    """Per frequency, the shape of the group of MLP units that write it (the frequency holding most of the power of
    W_U's reading of a unit's output column): how many, the spread of their write and read norms (std / mean), how
    far their writes cancel (norm of the summed writes over the summed norms), the numerical rank of their writes,
    the share of units whose write has an opposite twin in the group, how far each unit's read of the embedding,
    per input side, sits from a pure cos or sin (phase distance to a multiple of pi/2), and how many values the
    units' read-phase sums psi (a-side phase + b-side phase: a square's product term goes as cos(w(a + b) + psi))
    take and where they sit: the length of the mean of e^{4 i psi} over the group, its real part (near 1 when the
    sums are multiples of pi/2), and the length of the mean of e^{2 i psi} within each set of units that write
    one direction (either sign). Why: red teams named modular-addition's keys from these shapes alone (issue 16):
    version 3's column norms and pure reads, then drafts of version 4 whose keys' quads read two phase sums
    modulo pi where a distractor's read one, or sums at multiples of pi/2 (0.98 each), where every per-frequency
    power agreed."""
    d = m.embed.weight.shape[1]
    writes = m.unembed.weight.double() @ m.mlp.out.weight.double()  # [p, units]
    spec = torch.fft.rfft(writes, dim=0)[1 : n_f + 1]  # [n_f, units]
    power = spec.abs().pow(2)
    top = power.argmax(dim=0)
    live = power.max(dim=0).values >= 0.5 * power.sum(dim=0).clamp_min(1e-30)  # units that write one frequency
    left = m.mlp.left.weight.double()  # [units, 2 d]
    reads = [torch.fft.rfft(m.embed.weight.double() @ left[:, side * d : (side + 1) * d].T, dim=0)[1 : n_f + 1]
             for side in (0, 1)]  # fmt: skip
    out = []
    for f in range(n_f):
        units = torch.nonzero(live & (top == f)).flatten()
        r: dict[str, float] = {"composed:group.units": float(units.numel())}
        if units.numel():
            wn = writes[:, units].norm(dim=0)
            rn = left[units].norm(dim=1)
            r["composed:group.write_spread"] = float(wn.std(unbiased=False) / wn.mean().clamp_min(1e-30))
            r["composed:group.read_spread"] = float(rn.std(unbiased=False) / rn.mean().clamp_min(1e-30))
            r["composed:group.cancel"] = float(writes[:, units].sum(dim=1).norm() / wn.sum().clamp_min(1e-30))
            sv = torch.linalg.svdvals(writes[:, units])
            r["composed:group.write_rank"] = float((sv >= 0.1 * sv[0]).sum())
            unit_dirs = writes[:, units] / wn.clamp_min(1e-30)
            cos = unit_dirs.T @ unit_dirs  # between the units' writes
            r["composed:group.twins"] = float((cos < -0.99).any(dim=1).double().mean())
            phases = []
            for side in reads:
                z = side[f, units]
                strong = z.abs() >= 0.1 * z.abs().max().clamp_min(1e-30)
                ang = torch.remainder(torch.angle(z[strong]), torch.pi / 2)
                phases.append(torch.minimum(ang, torch.pi / 2 - ang))
            both = torch.cat(phases)
            r["composed:group.phase"] = float(both.mean()) if both.numel() else 0.0
            psi = torch.angle(reads[0][f, units]) + torch.angle(reads[1][f, units])
            r["composed:group.phase_sums"] = float(torch.exp(4j * psi).mean().abs())
            r["composed:group.phase_sums_round"] = float(torch.cos(4 * psi).mean())  # where they sit, not how tight
            same_dir = cos.abs() > 0.9
            per_dir = [torch.exp(2j * psi[same_dir[i]]).mean().abs() for i in range(units.numel())]
            r["composed:group.phase_sums_per_write"] = float(torch.stack(per_dir).mean())
        else:
            shape = ("write_spread", "read_spread", "cancel", "write_rank", "twins", "phase", "phase_sums",
                     "phase_sums_round", "phase_sums_per_write")  # fmt: skip
            r.update({f"composed:group.{k}": 0.0 for k in shape})
        out.append(r)
    return out


# ---------------------------------------------------------------------------------------------
# adapters: how an answer kind is built from chosen components, and what its labels are
# ---------------------------------------------------------------------------------------------
def truth_items(truth: dict) -> list:
    for key in ("heads", "frequencies", "indices"):
        if key in truth:
            return [tuple(x) if isinstance(x, list) else x for x in truth[key]]
    raise KeyError(f"no component list in a {truth.get('kind')} truth")


def _as_answer_item(key: Any) -> Any:
    return list(key) if isinstance(key, tuple) else key


class SetAdapter:
    """Answers that are a set of components (heads, units, frequencies)."""

    def __init__(self, components: Callable[[Instance], Components]):
        self.components = components

    def labels(self, inst: Instance, comp: Components) -> np.ndarray:
        truth = set(truth_items(inst.truth))
        return np.array([1 if k in truth else 0 for k in comp.keys])

    def choose(self, inst: Instance, comp: Components, score: np.ndarray, per_group: bool, scale: int = 1) -> Any:
        """The top components by ``score``, told the answer size (per group, each group's count), times ``scale``:
        an over-sized answer trades Jaccard for catching every true item among a reading's look-alikes (issue 16's
        red team listed every out-writing head and its source)."""
        truth = truth_items(inst.truth)
        if per_group:
            want = Counter(comp.groups[comp.keys.index(t)] for t in truth)
            chosen = []
            for g, n in want.items():
                idx = [i for i in np.argsort(-score, kind="stable") if comp.groups[i] == g][: n * scale]
                chosen += [comp.keys[i] for i in idx]
        else:
            chosen = [comp.keys[i] for i in np.argsort(-score, kind="stable")[: len(truth) * scale]]
        return [_as_answer_item(k) for k in chosen]


class RolesAdapter:
    """A role for every head (head-roles): labels are role indices."""

    def __init__(self, roles: Sequence[str]):
        self.roles = list(roles)

    @staticmethod
    def components(inst: Instance) -> Components:
        """The graded heads: those of layers from the schema's ``x-first-layer`` on (head-roles 3's block 0 is
        an MLP whose attention is switched off)."""
        return head_components(inst, int(inst.answer_schema.get("x-first-layer", 0)))

    def labels(self, inst: Instance, comp: Components) -> np.ndarray:
        return np.array([self.roles.index(inst.truth["roles"][f"L{lay}H{h}"]) for lay, h in comp.keys])

    def answer(self, comp: Components, predicted: np.ndarray) -> dict[str, str]:
        return {f"L{lay}H{h}": self.roles[int(c)] for (lay, h), c in zip(comp.keys, predicted, strict=True)}


# ---------------------------------------------------------------------------------------------
# learners (small, deterministic: full-batch LBFGS on standardized features)
# ---------------------------------------------------------------------------------------------
def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = train.mean(0), train.std(0)
    sd[sd < 1e-12] = 1.0
    return np.nan_to_num((train - mu) / sd), np.nan_to_num((test - mu) / sd)


def within(comp: Components) -> np.ndarray:
    """Features z-scored within each group of one instance ("the smallest norm in its layer")."""
    x = comp.x.copy()
    g = np.array(comp.groups)
    for grp in set(comp.groups):
        rows = g == grp
        mu, sd = x[rows].mean(0), x[rows].std(0)
        sd[sd < 1e-12] = 1.0
        x[rows] = (x[rows] - mu) / sd
    return x


def design(comp: Components, n_groups: int, composed: bool = False) -> np.ndarray:
    """The per-component statistics (``composed``: the composed readings instead, for the learned composed
    reading of class ``composed``), their within-group z-scores and a one-hot group."""
    cols = [j for j, name in enumerate(comp.names) if name.startswith("composed:") == composed]
    onehot = np.eye(n_groups)[np.array(comp.groups)]
    return np.hstack([comp.x[:, cols], within(comp)[:, cols], onehot])


def softmax_regression(
    x: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-2
) -> Callable[[np.ndarray], np.ndarray]:
    """Fit a multinomial logistic regression; return a function giving class scores [n, n_classes]."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ w + b, yt) + l2 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w_, b_ = w.detach(), b.detach()
    return lambda z: (torch.from_numpy(z) @ w_ + b_).numpy()


def nearest_centroid(x: np.ndarray, y: np.ndarray, n_classes: int) -> Callable[[np.ndarray], np.ndarray]:
    cents = np.stack([x[y == c].mean(0) if (y == c).any() else np.full(x.shape[1], np.inf) for c in range(n_classes)])
    return lambda z: -np.nan_to_num(((z[:, None, :] - cents[None]) ** 2).sum(-1), nan=np.inf, posinf=1e30)


# ---------------------------------------------------------------------------------------------
# the audit
# ---------------------------------------------------------------------------------------------
def folds(n: int) -> list[tuple[list[int], list[int]]]:
    a, b = list(range(0, n, 2)), list(range(1, n, 2))
    return [(a, b), (b, a)]


class Audit:
    """Runs the four classes for one family and level over a list of instances (40 recommended)."""

    def __init__(self, task_id: str, instances: list[Instance]):
        self.family = get_family(task_id)
        self.insts = instances
        self.kind = AnswerKind(instances[0].truth["kind"])
        self.tried: list[Finding] = []

    def keep(self, best: Finding, candidate: Finding) -> Finding:
        """Record every strategy's score (``self.tried``, for the bench's detail) and return the better one."""
        self.tried.append(candidate)
        return candidate if candidate.score > best.score else best

    def grade(self, answer: Any, inst: Instance) -> float:
        return self.family.grade(answer, inst.truth, inst).score

    def mean(self, answers: Sequence[Any], idx: Sequence[int]) -> float:
        return float(np.mean([self.grade(a, self.insts[i]) for a, i in zip(answers, idx, strict=True)]))

    def run(self, classes: Sequence[str] = CLASSES) -> list[Finding]:
        runner = {
            AnswerKind.HEADS: self._sets,
            AnswerKind.HEADS_ROLES: self._sets,
            AnswerKind.INDICES: self._sets,
            AnswerKind.FREQUENCIES: self._sets,
            AnswerKind.ROLES: self._roles,
            AnswerKind.BASIS: self._basis,
            AnswerKind.CELL: self._cell,
        }.get(self.kind)
        if runner is None:
            raise NotImplementedError(f"the shortcut audit has no adapter for answer kind {self.kind}")
        found = runner()
        return [f for f in found if f.cls in classes]

    # -- sets of components ----------------------------------------------------------------
    def _set_adapter(self) -> SetAdapter:
        if self.kind in (AnswerKind.HEADS, AnswerKind.HEADS_ROLES):
            return SetAdapter(head_components)
        if self.kind is AnswerKind.FREQUENCIES:
            return SetAdapter(frequency_components)
        return SetAdapter(unit_components)

    def _sets(self) -> list[Finding]:
        ad = self._set_adapter()
        comps = [ad.components(i) for i in self.insts]
        n = len(self.insts)
        out = []
        for cls, columns in feature_columns(comps[0].names):
            best = Finding(cls, 0.0, "none")
            for j, name in columns:
                for sign, per_group, scale in itertools.product((1, -1), (False, True), SCALES):
                    answers = [ad.choose(inst, c, sign * c.x[:, j], per_group, scale)
                               for inst, c in zip(self.insts, comps, strict=True)]  # fmt: skip
                    score = self.mean(answers, range(n))
                    where = (" per layer" if per_group else "") + (f", {scale}x the answer size" if scale > 1 else "")
                    best = self.keep(best, Finding(cls, score, f"{'-' if sign < 0 else '+'}{name}{where}"))
            out.append(best)
        n_groups = max(max(c.groups) for c in comps) + 1

        def learned(composed: bool, learner_name: str, learner: Callable) -> list[tuple[str, float]]:
            scores: dict[tuple[bool, int], list[float]] = {}
            for train, test in folds(n):
                x = np.vstack([design(comps[i], n_groups, composed) for i in train])
                y = np.concatenate([ad.labels(self.insts[i], comps[i]) for i in train])
                xs, _ = _standardize(x, x)
                model = learner(xs, y, 2)
                for i in test:
                    _, z = _standardize(x, design(comps[i], n_groups, composed))
                    s = model(z)
                    for per_group, scale in itertools.product((False, True), SCALES):
                        answer = ad.choose(self.insts[i], comps[i], s[:, 1] - s[:, 0], per_group, scale)
                        scores.setdefault((per_group, scale), []).append(self.grade(answer, self.insts[i]))
            found = []
            for (per_group, scale), got in scores.items():
                name = f"{learner_name}{' per layer' if per_group else ''}"
                name += f", {scale}x the answer size" if scale > 1 else ""
                found.append((name + (" on composed readings" if composed else ""), float(np.mean(got))))
            return found

        out = self._with_learned(out, comps[0].names, ("logistic", "centroid"), learned)
        out.append(self._set_priors(comps))
        return out

    def _with_learned(
        self,
        out: list[Finding],
        names: list[str],
        learner_names: tuple[str, str],
        learned: Callable[[bool, str, Callable], list[tuple[str, float]]],
    ) -> list[Finding]:
        """The learned readings, for set and role answers alike: a regression and a nearest-centroid rule on every
        per-component statistic (class ``classifier``) and on every composed reading (class ``composed``, where the
        components have any), each class keeping the better of its single and learned readings. ``learned``
        (composed, learner name, learner) returns the (strategy, score) pairs of one learner."""
        for cls, composed in (("classifier", False), ("composed", True)):
            if composed and not any(is_composed(name) for name in names):
                continue
            best = next((f for f in out if f.cls == cls), Finding(cls, 0.0, "none"))
            for learner_name, learner in zip(learner_names, (softmax_regression, nearest_centroid), strict=True):
                for strategy, score in learned(composed, learner_name, learner):
                    best = self.keep(best, Finding(cls, score, strategy))
            out = [f for f in out if f.cls != cls] + [best]
        return out

    def _set_priors(self, comps: list[Components]) -> Finding:
        """Constant answers: each single component, and the k most frequent true components on the train half."""
        n = len(self.insts)
        universe = sorted({k for c in comps for k in c.keys}, key=str)
        k_max = max(len(truth_items(i.truth)) for i in self.insts)
        scores: dict[str, list[float]] = {}
        for train, test in folds(n):
            freq = Counter(t for i in train for t in truth_items(self.insts[i].truth))
            cands = {f"[{u}]": [_as_answer_item(u)] for u in universe}
            for k in range(1, max(k_max, 6) + 1):
                top = [_as_answer_item(c) for c, _ in freq.most_common(k)]
                cands[f"{k} most frequent"] = top  # role labels cannot raise a head set's grade (J-scaled)
            # choose on train, score on test
            name = max(cands, key=lambda c: self.mean([cands[c]] * len(train), train))
            scores.setdefault("chosen", []).append(self.mean([cands[name]] * len(test), test))
        return Finding("prior", float(np.mean(scores["chosen"])), "best constant chosen on the other half")

    # -- roles --------------------------------------------------------------------------------
    def _roles(self) -> list[Finding]:
        roles = self.family_roles()
        ad = RolesAdapter(roles)
        comps = [ad.components(i) for i in self.insts]
        n, n_groups, n_cls = len(self.insts), max(comps[0].groups) + 1, len(roles)
        out = []

        def fitted(cols: Callable[[Components], np.ndarray], learner: Callable) -> float:
            scores = []
            for train, test in folds(n):
                x = np.vstack([cols(comps[i]) for i in train])
                y = np.concatenate([ad.labels(self.insts[i], comps[i]) for i in train])
                xs, _ = _standardize(x, x)
                model = learner(xs, y, n_cls)
                for i in test:
                    _, z = _standardize(x, cols(comps[i]))
                    scores.append(self.grade(ad.answer(comps[i], model(z).argmax(1)), self.insts[i]))
            return float(np.mean(scores))

        onehot = lambda c: np.eye(n_groups)[np.array(c.groups)]  # noqa: E731
        for cls, columns in feature_columns(comps[0].names):
            best = Finding(cls, 0.0, "none")
            for j, name in columns:
                one = lambda c, j=j: np.hstack([c.x[:, [j]], within(c)[:, [j]], onehot(c)])  # noqa: E731
                score = fitted(one, softmax_regression)
                best = self.keep(best, Finding(cls, score, f"softmax on {name} (raw and within its layer) + layer"))
            out.append(best)

        def learned(composed: bool, learner_name: str, learner: Callable) -> list[tuple[str, float]]:
            what = "the composed readings" if composed else "every feature"
            return [(f"{learner_name} on {what}", fitted(lambda c: design(c, n_groups, composed), learner))]

        out = self._with_learned(out, comps[0].names, ("softmax", "centroid"), learned)
        prior_scores = []
        for train, test in folds(n):
            y = [Counter() for _ in range(n_groups)]
            for i in train:
                for g, lab in zip(comps[i].groups, ad.labels(self.insts[i], comps[i]), strict=True):
                    y[g][int(lab)] += 1
            for i in test:
                pred = np.array([y[g].most_common(1)[0][0] for g in comps[i].groups])
                prior_scores.append(self.grade(ad.answer(comps[i], pred), self.insts[i]))
        out.append(Finding("prior", float(np.mean(prior_scores)), "each layer's most common role"))
        return out

    def family_roles(self) -> list[str]:
        roles = self.insts[0].answer_schema.get("x-roles")
        if not roles:
            raise NotImplementedError("a roles answer schema without x-roles")
        return list(roles)

    # -- subspaces ----------------------------------------------------------------------------
    def _basis(self) -> list[Finding]:
        """Top-k singular vectors of every product of the weight matrices that reads the hidden space, and of the
        rows of the units a statistic ranks first."""
        n = len(self.insts)
        readings: dict[str, list[Any]] = {}
        unit_rank: dict[str, list[Any]] = {}
        for inst in self.insts:
            for name, ans in _basis_readings(inst).items():
                readings.setdefault(name, []).append(ans)
            for name, ans in _basis_by_units(inst).items():
                unit_rank.setdefault(name, []).append(ans)
        out = []
        for cls, table in (("composed", readings), ("stats", unit_rank)):
            best = Finding(cls, 0.0, "none")
            for name, answers in table.items():
                score = self.mean(answers, range(n))
                best = self.keep(best, Finding(cls, score, name))
            out.append(best)
        k = int(self.insts[0].truth["k"])
        d = int(self.insts[0].truth["d"])
        axes = [[1.0 if j == i else 0.0 for j in range(d)] for i in range(k)]
        out.append(Finding("prior", self.mean([axes] * n, range(n)), "the first k coordinate axes"))
        out.append(Finding("classifier", self._basis_classifier(), "logistic on unit features"))
        return out

    def _basis_classifier(self) -> float:
        """Units labelled by whether they read the true subspace; the top-scored units' rows give the basis."""
        comps = [unit_components_subspace(i) for i in self.insts]
        n = len(self.insts)
        scores = []
        for train, test in folds(n):
            x = np.vstack([comps[i].x for i in train])
            y = np.concatenate([_reads_truth(self.insts[i]) for i in train])
            xs, _ = _standardize(x, x)
            model = softmax_regression(xs, y, 2)
            for i in test:
                _, z = _standardize(x, comps[i].x)
                s = model(z)
                scores.append(self.grade(_span_of_units(self.insts[i], s[:, 1] - s[:, 0]), self.insts[i]))
        return float(np.mean(scores))

    # -- cells --------------------------------------------------------------------------------
    def _cell(self) -> list[Finding]:
        """(layer, position): layers from per-layer weight features or constants, positions from rules on the probe
        tokens (chosen on the other half of the seeds) or constants. Every cell of every instance is graded once."""
        comps = [mlp_layer_components(i) for i in self.insts]
        n = len(self.insts)
        rules = _position_rules(self.insts)
        n_layers, n_pos = len(comps[0].keys), int(self.insts[0].truth["n_positions"])
        grid = np.array([[[self.grade({"layer": lay, "position": pos}, inst) for pos in range(n_pos)]
                          for lay in range(n_layers)] for inst in self.insts])  # fmt: skip
        pos_of = {r: np.array(v) for r, v in rules.items()}

        def mean_of(layers: np.ndarray, r: str, idx: Sequence[int]) -> float:
            idx = np.array(idx)
            return float(grid[idx, layers[idx], pos_of[r][idx]].mean())

        def with_rules(layers: np.ndarray, fit_layers: np.ndarray | None = None) -> float:
            """Mean on each half with the position rule chosen on the other half (with ``fit_layers`` there)."""
            fit = layers if fit_layers is None else fit_layers
            scores = []
            for train, test in folds(n):
                r = max(rules, key=lambda r: mean_of(fit, r, train))
                scores.append(mean_of(layers, r, test) * len(test))
            return sum(scores) / n

        out = []
        for cls, columns in feature_columns(comps[0].names):
            best = Finding(cls, 0.0, "none")
            for j, name in columns:
                for sign in (1, -1):
                    score = with_rules(np.array([int(np.argmax(sign * c.x[:, j])) for c in comps]))
                    rule = f"{'max' if sign > 0 else 'min'} {name} layer, best position rule"
                    best = self.keep(best, Finding(cls, score, rule))
            out.append(best)
        # classifier over layers: which layer is the fact layer, from per-layer features
        predicted = np.zeros(n, dtype=int)
        for train, test in folds(n):
            x = np.vstack([design(comps[i], n_layers) for i in train])
            y = np.concatenate([[1 if k == self.insts[i].truth["layer"] else 0 for k in comps[i].keys] for i in train])
            xs, _ = _standardize(x, x)
            model = softmax_regression(xs, y, 2)
            for i in test:
                _, z = _standardize(x, design(comps[i], n_layers))
                s = model(z)
                predicted[i] = int(np.argmax(s[:, 1] - s[:, 0]))
        true_layers = np.array([i.truth["layer"] for i in self.insts])
        out.append(Finding("classifier", with_rules(predicted, true_layers),
                           "logistic over layer features, position rule chosen with the true layers"))  # fmt: skip
        # priors: a constant layer with the best position rule, chosen on the other half
        scores = []
        for train, test in folds(n):
            lay, r = max(itertools.product(range(n_layers), rules),
                         key=lambda c: mean_of(np.full(n, c[0]), c[1], train))  # fmt: skip
            scores.append(mean_of(np.full(n, lay), r, test) * len(test))
        out.append(Finding("prior", sum(scores) / n, "constant layer + position rule from the probe tokens"))
        return out


# ---------------------------------------------------------------------------------------------
# subspace readings (causal-subspace): the model is enc -> hidden -> mlp_in -> relu -> out
# ---------------------------------------------------------------------------------------------
def _top_right(m: torch.Tensor, k: int) -> list[list[float]]:
    _, _, vh = torch.linalg.svd(m.double(), full_matrices=False)
    return vh[:k].tolist()


def _basis_readings(inst: Instance) -> dict[str, Any]:
    m, k = inst.model, int(inst.truth["k"])
    with torch.no_grad():
        w_in, b_in = m.mlp_in.weight.double(), m.mlp_in.bias.double()
        w_out = m.out.weight.double()
        w_enc = m.enc.weight.double()
        centred = w_out - w_out.mean(0, keepdim=True)  # logit differences: what changes the class
        out = {
            "top right singular vectors of mlp_in": _top_right(w_in, k),
            "of out @ mlp_in": _top_right(w_out @ w_in, k),
            "of centred out @ mlp_in": _top_right(centred @ w_in, k),
            "of |out| column-weighted mlp_in": _top_right(w_out.norm(dim=0)[:, None] * w_in, k),
            "of out @ diag(b_in > 0) @ mlp_in": _top_right(w_out @ torch.diag((b_in > 0).double()) @ w_in, k),
            "top left singular vectors of enc": torch.linalg.svd(w_enc, full_matrices=False)[0][:, :k].T.tolist(),
            "of mlp_in restricted to enc's range": _top_right(w_in @ _proj(w_enc), k),
            "of out @ mlp_in @ enc, mapped back": _top_right(((w_out @ w_in @ w_enc) @ torch.linalg.pinv(w_enc)), k),
        }
    return out


def _proj(w_enc: torch.Tensor) -> torch.Tensor:
    u, s, _ = torch.linalg.svd(w_enc, full_matrices=False)
    u = u[:, s > 1e-6 * s.max()]
    return u @ u.T


def unit_components_subspace(inst: Instance) -> Components:
    m = inst.model
    with torch.no_grad():
        w_in, b_in, w_out = m.mlp_in.weight.double(), m.mlp_in.bias.double(), m.out.weight.double()
        rows = []
        for j in range(w_in.shape[0]):
            r = {**_vector_stats("in", w_in[j]), **_vector_stats("out", w_out[:, j]), "b": float(b_in[j])}
            r["out_centred"] = float((w_out[:, j] - w_out[:, j].mean()).norm())
            others = torch.cat([w_in[:j], w_in[j + 1 :]])
            cos = (others @ w_in[j]) / (others.norm(dim=1) * w_in[j].norm()).clamp_min(1e-30)
            r["twin_cos"] = float(cos.abs().max())
            rows.append(r)
    return _table(list(range(len(rows))), [0] * len(rows), rows)


def _reads_truth(inst: Instance) -> np.ndarray:
    basis = torch.tensor(inst.truth["basis"], dtype=torch.float64)
    q, _ = torch.linalg.qr(basis.T)
    w = inst.model.mlp_in.weight.detach().double()
    share = (w @ q).norm(dim=1) / w.norm(dim=1).clamp_min(1e-30)
    return (share > 0.7).long().numpy()


def _span_of_units(inst: Instance, score: np.ndarray) -> list[list[float]]:
    k = int(inst.truth["k"])
    w = inst.model.mlp_in.weight.detach().double()
    top = np.argsort(-score, kind="stable")[: 2 * k]
    return _top_right(w[top], k)


def _basis_by_units(inst: Instance) -> dict[str, Any]:
    comp = unit_components_subspace(inst)
    k = int(inst.truth["k"])
    out = {}
    for j, name in enumerate(comp.names):
        for sign in (1, -1):
            for mult in (1, 2):
                score = sign * comp.x[:, j]
                w = inst.model.mlp_in.weight.detach().double()
                top = np.argsort(-score, kind="stable")[: mult * k]
                out[f"rows of the {mult * k} units with {'max' if sign > 0 else 'min'} {name}"] = _top_right(w[top], k)
    return out


# ---------------------------------------------------------------------------------------------
# position rules from the probe tokens (cells)
# ---------------------------------------------------------------------------------------------
def _position_rules(insts: list[Instance]) -> dict[str, list[int]]:
    """Positions computed from each instance's probe tokens by simple rules, per instance: every constant
    position; the first / last position where most rows hold a token id below (or at least) a threshold; the
    first / last position where clean and corrupted tokens differ (when the probe gives both)."""
    n_ctx = int(insts[0].truth["n_positions"])
    rules: dict[str, list[int]] = {f"position {p}": [p] * len(insts) for p in range(n_ctx)}
    vocab = max(int(i.probe["tokens"].max()) for i in insts) + 1
    for t, below, last in itertools.product(range(1, vocab + 1), (True, False), (True, False)):
        name = f"{'last' if last else 'first'} position with ids {'<' if below else '>='} {t}"
        rules[name] = []
        for inst in insts:
            toks = inst.probe["tokens"]
            hit = ((toks < t) if below else (toks >= t)).double().mean(0) > 0.5
            where = torch.nonzero(hit).flatten().tolist()
            rules[name].append((where[-1] if last else where[0]) if where else 0)
    if all("corrupted_tokens" in i.probe for i in insts):
        for last in (True, False):
            name = f"{'last' if last else 'first'} position where clean and corrupted differ"
            rules[name] = []
            for inst in insts:
                diff = (inst.probe["tokens"] != inst.probe["corrupted_tokens"]).double().mean(0) > 0.5
                where = torch.nonzero(diff).flatten().tolist()
                rules[name].append((where[-1] if last else where[0]) if where else 0)
    # deduplicate identical rules (saves grading)
    seen: dict[tuple, str] = {}
    return {name: pos for name, pos in rules.items() if seen.setdefault(tuple(pos), name) == name}


def audit(task_id: str, instances: list[Instance]) -> list[Finding]:
    """Every class the family is not exempt from (see :data:`EXEMPT`)."""
    exempt = EXEMPT.get(get_family(task_id).id, ((), ""))[0]
    classes = [c for c in CLASSES if c not in exempt]
    return Audit(task_id, instances).run(classes) if classes else []


# ---------------------------------------------------------------------------------------------
# the generic single-ablation sweep (reported, not a shortcut: ablation is interpretability)
# ---------------------------------------------------------------------------------------------
def _divergence(clean: torch.Tensor, other: torch.Tensor, last_only: bool) -> float:
    """Mean KL(clean || other) of the next-token distributions (at the last position, or at every position)."""
    if last_only:
        clean, other = clean[:, -1], other[:, -1]
    p = torch.log_softmax(clean.double(), dim=-1)
    q = torch.log_softmax(other.double(), dim=-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def largest_gap(effects: dict[Any, float]) -> list[Any]:
    """The components above the largest gap between consecutive sorted effects (at least one)."""
    ranked = sorted(effects, key=lambda c: -effects[c])
    vals = [effects[c] for c in ranked]
    cut = max(range(1, len(vals)), key=lambda i: vals[i - 1] - vals[i]) if len(vals) > 1 else 1
    return ranked[:cut]


def _target_margin(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean logit(target) - max other logit: at the last position for one target per row, else where targets are."""
    lg = logits[:, -1] if targets.dim() == 1 else logits[:, : targets.shape[1]]
    tgt = lg.gather(-1, targets[..., None])[..., 0]
    other = lg.scatter(-1, targets[..., None], float("-inf")).max(dim=-1).values
    return float((tgt - other).mean())


SWEEP_METRICS = ("kl", "target margin")


def single_ablation_effects(inst: Instance) -> dict[str, dict[Any, float]] | None:
    """Every component's single zero-ablation effect under each metric of :data:`SWEEP_METRICS` the probe allows
    (``kl``: KL from the clean run on the probe tokens; ``target margin``: the drop of the probe targets' logit
    margin). A component is a head's ``hook_z`` or, for a cell answer, ``hook_mlp_out`` at one (layer, position).
    Each ablation runs once for all metrics, from the clean stream entering its layer (``Ablator``: the logits are
    bit-identical to a whole hooked forward), or, where only the last position is read in an attention-only model,
    as a rank-d_head correction computing the last position only (``QueryAblator``: equal to float32 rounding, a
    few 1e-5 of a logit, far below the gaps this sweep cuts at). None where the answer is not a set of heads or a
    cell."""
    kind = AnswerKind(inst.truth["kind"])
    m = inst.model
    if kind not in (AnswerKind.HEADS, AnswerKind.HEADS_ROLES, AnswerKind.CELL) or "tokens" not in inst.probe:
        return None
    tokens = inst.probe["tokens"]
    targets = inst.probe.get("targets")
    last_only = kind is AnswerKind.CELL or (targets is not None and targets.dim() == 1)
    metrics = [mt for mt in SWEEP_METRICS if mt == "kl" or targets is not None]
    effects: dict[str, dict[Any, float]] = {mt: {} for mt in metrics}
    with torch.no_grad():
        fast = kind is not AnswerKind.CELL and last_only and m.cfg.attn_only
        ablator = QueryAblator(m, tokens, slice(-1, None)) if fast else Ablator(m, tokens)
        clean = ablator.clean
        clean_margin = _target_margin(clean, targets) if targets is not None else 0.0

        def record(component: Any, out: torch.Tensor) -> None:
            for mt in metrics:
                kl = mt == "kl"
                effects[mt][component] = (
                    _divergence(clean, out, last_only) if kl else clean_margin - _target_margin(out, targets)
                )

        for lay in range(m.cfg.n_layers):
            if kind is AnswerKind.CELL:
                for pos in range(tokens.shape[1]):

                    def zero(act: torch.Tensor, hook: Any, pos: int = pos) -> torch.Tensor:
                        act[:, pos] = 0.0
                        return act

                    record((lay, pos), ablator.run_from(lay, [(f"blocks.{lay}.hook_mlp_out", zero)]))
                continue
            for h in range(m.cfg.n_heads):
                record((lay, h), ablator.logits([(lay, h)]))
    return effects


def sweep_answer(kind: AnswerKind, effects: dict[Any, float]) -> Any:
    """A systematic agent's answer from one metric's effects: the components above the largest gap (a cell: the
    largest)."""
    if kind is AnswerKind.CELL:
        lay, pos = max(effects, key=lambda c: effects[c])
        return {"layer": lay, "position": pos}
    return [list(c) for c in largest_gap(effects)]


def sweep_score(task_id: str, instances: list[Instance]) -> float | None:
    """The better mean score, over its metrics, of what a systematic agent with no hypothesis answers: every
    component ablated once (:func:`single_ablation_effects`), the components above the largest gap
    (:func:`sweep_answer`), graded by the family's grader (None where it does not apply)."""
    fam = get_family(task_id)
    best = None
    effects = [single_ablation_effects(i) for i in instances]
    for metric in SWEEP_METRICS:
        if any(e is None or metric not in e for e in effects):
            continue
        pairs = zip(instances, effects, strict=True)
        answers = [sweep_answer(AnswerKind(i.truth["kind"]), e[metric]) for i, e in pairs]
        score = float(np.mean([fam.grade(a, i.truth, i).score for a, i in zip(answers, instances, strict=True)]))
        best = score if best is None else max(best, score)
    return best
