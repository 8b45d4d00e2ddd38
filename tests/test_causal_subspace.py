"""causal-subspace: interchange on the planted subspace works, the distractor directions are read but
inert, the SVD of the next layer does not give the answer, constant bases score low, and the grader
(IIA x overlap, measured on the model; the same with or without the instance at hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import cached_instance, cached_instances
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.causal_subspace.generator import interchange_accuracy, orthonormal

FAM = "causal-subspace"
N_SEEDS = 100


def true_q(inst) -> np.ndarray:
    return orthonormal(np.array(inst.truth["basis"]))


@pytest.mark.parametrize("level", LEVELS)
def test_interchange_on_the_subspace_and_inert_distractors(level: str) -> None:
    for seed in range(6):
        inst = cached_instance(FAM, seed, level)
        q = true_q(inst)
        acc, null = interchange_accuracy(inst.model, inst.probe["x"], q, q)
        assert acc >= 0.99 and null <= 0.6
        w_in = inst.model.mlp_in.weight.detach().double().numpy()
        _, sv, vh = np.linalg.svd(w_in, full_matrices=False)
        read = vh[sv > 0.2 * sv[0]]  # directions the next layer reads
        assert read.shape[0] > q.shape[1], "mlp_in reads more directions than the causal subspace"
        inside = np.sum((q.T @ read.T) ** 2) / q.shape[1]
        assert inside >= 0.95, "the causal subspace is among the directions read"
        extra = read - (read @ q) @ q.T  # read directions outside S: interchanging them does nothing
        extra_q = orthonormal(extra)
        acc_extra, _ = interchange_accuracy(inst.model, inst.probe["x"], extra_q, q)
        assert abs(acc_extra - null) <= 0.03


@pytest.mark.parametrize("level", LEVELS)
def test_next_layer_svd_and_whole_space_score_low(level: str) -> None:
    svd_scores, whole = [], []
    for seed in range(20):
        inst = cached_instance(FAM, seed, level)
        k, d = inst.truth["k"], inst.truth["d"]
        _, _, vh = np.linalg.svd(inst.model.mlp_in.weight.detach().double().numpy(), full_matrices=False)
        svd_scores.append(grade(FAM, vh[:k].tolist(), inst.truth, inst).score)
        whole.append(grade(FAM, np.eye(d).tolist(), inst.truth, inst).score)
    assert np.mean(svd_scores) <= 0.5, svd_scores
    assert max(whole) <= 0.35


@pytest.mark.parametrize("level", LEVELS)
def test_subspaces_vary_and_constant_bases_score_low(level: str) -> None:
    insts = cached_instances(FAM, range(N_SEEDS), level)
    d = insts[0].truth["d"]
    candidates = [np.eye(d)[:k].tolist() for k in (1, 2, 3)] + [[[1.0] * d]]
    candidates.append(insts[0].truth["basis"])  # one instance's true basis, used for all
    best = max(np.mean([grade(FAM, c, i.truth, i).score for i in insts]) for c in candidates)
    assert best <= 0.15, best


def test_grader_with_and_without_the_instance() -> None:
    inst = cached_instance(FAM, 4, "hard")
    truth = inst.truth
    exact = grade(FAM, truth["basis"], truth, inst)
    assert exact.score == 0.99 and exact.breakdown["rank"] == truth["k"]
    assert grade(FAM, truth["basis"], truth).score == exact.score  # regenerated from seed and level
    rotated = (np.array([[2.0, 1.0, 0.0], [0.5, -1.0, 0.0], [0.0, 0.0, 3.0]])[: truth["k"], : truth["k"]]
               @ np.array(truth["basis"])).tolist()  # fmt: skip
    assert grade(FAM, rotated, truth, inst).score == 0.99, "any basis of the subspace"
    padded = [*truth["basis"], np.eye(truth["d"])[0].tolist()]
    assert 0.5 <= grade(FAM, padded, truth, inst).score < 0.99
    for bad in ([], [[1.0, 2.0]], [[0.0] * truth["d"]], [[float("nan")] * truth["d"]], {"basis": []}, "S",
                [["a"] * truth["d"]], [[True] * truth["d"]]):  # fmt: skip
        result = grade(FAM, bad, truth, inst)
        assert result.rejected and result.message, bad
    assert not grade(FAM, get_family(FAM).answer_example, cached_instance(FAM, 0, "easy").truth).rejected
    single = truth["basis"][0]
    assert not grade(FAM, single, truth, inst).rejected, "one vector alone is a basis too"


def test_reference_solution_direction_comes_from_gradients() -> None:
    """Gradients w.r.t. h vanish on the inert directions (the reference's premise)."""
    inst = cached_instance(FAM, 1, "medium")
    h = inst.model.enc(inst.probe["x"]).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(inst.model.head(h)[:, 0].sum(), h)  # (the sum over classes cancels)
    q = true_q(inst)
    outside = g.double().numpy() - (g.double().numpy() @ q) @ q.T
    assert np.abs(outside).max() <= 0.05 * np.abs(g.double().numpy()).max()
