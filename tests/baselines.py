"""Answer-agnostic baselines used by the tests: weight statistics and constant answers.

The weight-statistics baseline ranks components by one statistic of their weights (norms,
sparsity, effective rank, biases), in either direction, and -- generously -- is told the true
answer size; docs/CONTRACT.md ("Sizes and variation") requires it to score <= 0.3 on average.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from mechsandbox.evaluation.shortcuts import low_rank_svdvals
from mechsandbox.tasks import Instance


def _eff_rank(a: torch.Tensor, b: torch.Tensor) -> float:
    """Effective rank of ``a @ b.T`` from its singular values, read off the two thin factors (a head's QK or OV is
    d_model x d_model but of rank <= d_head: a full SVD of it was most of this baseline's time)."""
    s = low_rank_svdvals(a, b)
    p = s / s.sum()
    return float(torch.exp(-(p * torch.log(p + 1e-30)).sum()))


def _sparsity(v: torch.Tensor) -> float:
    return float((v.abs() < 0.05 * v.abs().max().clamp_min(1e-12)).double().mean())


def head_stats(inst: Instance) -> dict[tuple[int, int], dict[str, float]]:
    m = inst.model
    out = {}
    with torch.no_grad():
        for lay in range(m.cfg.n_layers):
            for h in range(m.cfg.n_heads):
                q, k, v, o = m.W_Q[lay, h], m.W_K[lay, h], m.W_V[lay, h], m.W_O[lay, h]
                qk, ov = q @ k.T, v @ o
                out[(lay, h)] = {
                    "q": float(q.norm()),
                    "k": float(k.norm()),
                    "v": float(v.norm()),
                    "o": float(o.norm()),
                    "qk": float(qk.norm()),
                    "ov": float(ov.norm()),
                    "qk_rank": _eff_rank(q, k),
                    "ov_rank": _eff_rank(v, o.T),
                    "ov_sparsity": _sparsity(ov),
                    "bq": float(m.b_Q[lay, h].norm()),
                }
    return out


def unit_stats(inst: Instance) -> dict[int, dict[str, float]]:
    m = inst.model
    out = {}
    with torch.no_grad():
        if hasattr(m, "left"):  # gated MLP
            wl, wr, bl, br, wo = m.left.weight, m.right.weight, m.left.bias, m.right.bias, m.out.weight
            for j in range(wl.shape[0]):
                out[j] = {
                    "l": float(wl[j].norm()),
                    "r": float(wr[j].norm()),
                    "l_sp": _sparsity(wl[j]),
                    "r_sp": _sparsity(wr[j]),
                    "bl": float(bl[j].abs()),
                    "br": float(br[j].abs()),
                    "out": float(wo[:, j].norm()),
                    "lr": float(wl[j].norm() * wr[j].norm()),
                }
        else:  # MLP: hidden units of the first layer
            w, b, w2 = m[0].weight, m[0].bias, m[2].weight
            for j in range(w.shape[0]):
                out[j] = {
                    "w": float(w[j].norm()),
                    "l1": float(w[j].abs().sum()),
                    "sp": _sparsity(w[j]),
                    "b": float(b[j]),
                    "abs_b": float(b[j].abs()),
                    "out": float(w2[:, j].norm()),
                }
    return out


def weight_stat_answers(inst: Instance, k: int) -> list[list]:
    """One answer per (statistic, direction): the k components with the most extreme value."""
    stats: dict = head_stats(inst) if "heads" in inst.truth else unit_stats(inst)
    names = next(iter(stats.values())).keys()
    answers = []
    for name in names:
        for sign in (1, -1):
            ranked = sorted(stats, key=lambda c, n=name, s=sign: -s * stats[c][n])
            answers.append([list(c) if isinstance(c, tuple) else c for c in ranked[:k]])
    return answers


def best_mean(scores_by_answer: list[list[float]]) -> float:
    """The best strategy's mean score (strategies in rows, instances in columns)."""
    return max(sum(row) / len(row) for row in scores_by_answer)


def constant_candidates(universe: list, k_max: int, frequent: Callable[[int], list]) -> list[list]:
    """Single components, plus the most frequent true components for each size 1..k_max."""
    return [[u] for u in universe] + [frequent(k) for k in range(1, k_max + 1)]
