"""causal-subspace: interchange on the planted subspace works; the other read directions are inert because
their units never fire on the input distribution (though they do on the input cube, with weights drawn
like the live ones), so no linear reading of the weights finds S; constant bases score low; and the
grader (IIA x overlap, measured on the model; the same with or without the instance at hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import cached_instance, cached_instances
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.causal_subspace.generator import interchange_accuracy, orthonormal, unit_inputs

FAM = "causal-subspace"
N_SEEDS = 100
N_ATTACK_SEEDS = 40


def true_q(inst) -> np.ndarray:
    return orthonormal(np.array(inst.truth["basis"]))


def weights(inst) -> tuple:
    m = inst.model
    return tuple(p.detach().double().numpy() for p in (m.mlp_in.weight, m.mlp_in.bias, m.out.weight, m.out.bias))


def firing(inst) -> np.ndarray:
    """Per unit of mlp_in, the share of probe inputs on which it fires."""
    with torch.no_grad():
        return (inst.model.mlp_in(inst.model.enc(inst.probe["x"])) > 0).double().mean(dim=0).numpy()


@pytest.mark.parametrize("level", LEVELS)
def test_interchange_on_the_subspace_and_inert_units_never_fire(level: str) -> None:
    for seed in range(6):
        inst = cached_instance(FAM, seed, level)
        q, k = true_q(inst), inst.truth["k"]
        acc, null = interchange_accuracy(inst.model, inst.probe["x"], q, q)
        assert acc >= 0.99 and null <= 0.6
        w_in, b_in, _, _ = weights(inst)
        fires = firing(inst)
        live = np.flatnonzero(fires > 0)
        assert len(live) == k and np.all((fires[live] >= 0.3) & (fires[live] <= 0.7)), fires
        read = w_in / np.linalg.norm(w_in, axis=1, keepdims=True)
        inside = np.sum((q.T @ read[live].T) ** 2) / k
        assert inside >= 0.99, "the live units read exactly S"
        silent = np.flatnonzero(fires == 0)
        assert len(silent) >= 3 * k, "more read directions than S"
        # the silent units would fire elsewhere on the input cube: same reachable maximum as the live ones
        comp = unit_inputs(inst)
        top = comp.clip(min=0).sum(axis=1) + w_in @ inst.model.enc.bias.detach().double().numpy() + b_in
        assert np.all(top > 0.2), top
        # and interchanging what they read changes nothing
        acc_inert, _ = interchange_accuracy(inst.model, inst.probe["x"], orthonormal(read[silent]), q)
        assert abs(acc_inert - null) <= 0.02


def _unit_dirs(w_in: np.ndarray, idx) -> list:
    return (w_in[list(idx)] / np.linalg.norm(w_in[list(idx)], axis=1, keepdims=True)).tolist()


def weight_readings(inst) -> dict:
    """Answers read off the weights alone: linear compositions, their SVDs, per-unit statistics."""
    k = inst.truth["k"]
    w_in, b_in, w_out, b_out = weights(inst)
    centre = np.eye(w_out.shape[0]) - 1.0 / w_out.shape[0]  # the class-common part does not count
    out_n, in_n = np.linalg.norm(centre @ w_out, axis=0), np.linalg.norm(w_in, axis=1)
    comp_b = w_in @ inst.model.enc.bias.detach().double().numpy() + b_in
    cube_max = comp_b + unit_inputs(inst).clip(min=0).sum(axis=1)
    thresholds = np.linalg.lstsq(centre @ w_out, centre @ b_out, rcond=None)[0]

    def svd(m: np.ndarray) -> list:
        return np.linalg.svd(m, full_matrices=False)[2][:k].tolist()

    return {
        "svd(out @ mlp_in)": svd(w_out @ w_in),
        "svd(centred out @ mlp_in)": svd(centre @ w_out @ w_in),
        "svd(mlp_in)": svd(w_in),
        "svd(mlp_in, units with the largest out)": svd(w_in[np.argsort(-out_n)[: 2 * k]]),
        "|out| x |in|": _unit_dirs(w_in, np.argsort(-out_n * in_n)[:k]),
        "largest bias": _unit_dirs(w_in, np.argsort(-b_in)[:k]),
        "largest composed bias": _unit_dirs(w_in, np.argsort(-comp_b)[:k]),
        "smallest composed bias": _unit_dirs(w_in, np.argsort(comp_b)[:k]),
        "largest maximum over the input cube": _unit_dirs(w_in, np.argsort(-cube_max)[:k]),
        "out.bias regressed on out columns": _unit_dirs(w_in, np.argsort(-np.abs(thresholds))[:k]),
    }


@pytest.mark.parametrize("level", LEVELS)
def test_linear_readings_of_the_weights_score_low(level: str) -> None:
    """Version 1's distractors cancelled in out @ mlp_in (its SVD scored 0.99 on every instance); here
    every reading of the weights alone stays at chance (about 1 / units per bit) -- measured 0.02-0.16."""
    scores: dict[str, list] = {}
    for inst in cached_instances(FAM, range(N_ATTACK_SEEDS), level):
        for name, answer in weight_readings(inst).items():
            scores.setdefault(name, []).append(grade(FAM, answer, inst.truth, inst).score)
    means = {name: round(float(np.mean(s)), 3) for name, s in scores.items()}
    assert max(means.values()) <= 0.3, means


@pytest.mark.parametrize("level", LEVELS)
def test_activation_analysis_finds_the_subspace(level: str) -> None:
    """The units that fire on the probe inputs read S (an activation analysis suffices)."""
    for seed in range(6):
        inst = cached_instance(FAM, seed, level)
        w_in = weights(inst)[0]
        answer = _unit_dirs(w_in, np.flatnonzero(firing(inst) > 0))
        assert grade(FAM, answer, inst.truth, inst).score >= 0.95


@pytest.mark.parametrize("level", LEVELS)
def test_subspaces_vary_and_constant_bases_score_low(level: str) -> None:
    insts = cached_instances(FAM, range(N_SEEDS), level)
    d = insts[0].truth["d"]
    candidates = [np.eye(d)[:k].tolist() for k in (1, 2, 3)] + [[[1.0] * d]]
    candidates.append(insts[0].truth["basis"])  # one instance's true basis, used for all
    best = max(np.mean([grade(FAM, c, i.truth, i).score for i in insts]) for c in candidates)
    assert best <= 0.15, best
    whole = [grade(FAM, np.eye(d).tolist(), i.truth, i).score for i in insts[:20]]
    assert max(whole) <= insts[0].truth["k"] / d + 0.01, "the whole space scores k / d"


def test_grader_with_and_without_the_instance() -> None:
    inst = cached_instance(FAM, 4, "hard")
    truth = inst.truth
    exact = grade(FAM, truth["basis"], truth, inst)
    assert exact.score == 0.99 and exact.breakdown["rank"] == truth["k"]
    assert grade(FAM, truth["basis"], truth).score == exact.score  # regenerated from seed and level
    rotated = (np.array([[2.0, 1.0, 0.0], [0.5, -1.0, 0.0], [0.0, 0.0, 3.0]])[: truth["k"], : truth["k"]]
               @ np.array(truth["basis"])).tolist()  # fmt: skip
    assert grade(FAM, rotated, truth, inst).score == 0.99, "any basis of the subspace"
    huge = (np.array(truth["basis"]) * 1e300).tolist()  # finite, but an SVD of it overflows
    assert grade(FAM, huge, truth, inst).score == 0.99, "a scaled basis is the same subspace"
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
    """Gradients w.r.t. h vanish on the inert directions (the reference's premise: their units never fire)."""
    inst = cached_instance(FAM, 1, "medium")
    h = inst.model.enc(inst.probe["x"]).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(inst.model.head(h)[:, 0].sum(), h)
    q = true_q(inst)
    outside = g.double().numpy() - (g.double().numpy() @ q) @ q.T
    assert np.abs(outside).max() <= 0.05 * np.abs(g.double().numpy()).max()
