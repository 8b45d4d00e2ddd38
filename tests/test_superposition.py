"""superposition: the stated definitions hold with margins, the geometry is what was planted (polytope
cosines, orthogonal groups, per-feature dimensionality), weight statistics alone score <= 0.3, seeds vary the
answer, constant answers score low, and the grader (kappa + pair Jaccard)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import cached_instance, cached_instances
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.superposition.generator import behaviour, groups_of

FAM = "superposition"
N_SEEDS = 100


@pytest.mark.parametrize("level", LEVELS)
def test_definitions_hold_with_margins(level: str) -> None:
    for seed in range(10):
        inst = cached_instance(FAM, seed, level)
        increase, cos = behaviour(inst.model)
        rep = inst.truth["represented"]
        dead = [i for i in range(inst.truth["n"]) if i not in rep]
        assert increase[rep].min() >= 0.6 and increase[dead].max() <= 0.35
        assert groups_of(rep, cos) == inst.truth["groups"]
        w = inst.model.W.detach().double().numpy()
        for group in inst.truth["groups"]:  # per-feature dimensionality D_i = |W_i|^4 / sum_j (W_i . W_j)^2
            for i in group:
                d_i = np.dot(w[:, i], w[:, i]) ** 2 / sum(np.dot(w[:, i], w[:, j]) ** 2 for j in rep)
                assert 0.3 <= d_i <= 0.8, (seed, group, d_i)  # pair 1/2, pentagon 2/5, tetrahedron 3/4; alone 1


@pytest.mark.parametrize("level", LEVELS)
def test_weight_statistics_baseline_scores_at_most_03(level: str) -> None:
    """Represented = the largest columns of W (told how many there are), groups = the cosine rule among
    them: the weights alone, without the bias or the model's behaviour, score <= 0.3 on average."""
    scores, kappas = [], []
    for seed in range(40):
        inst = cached_instance(FAM, seed, level)
        norms = inst.model.W.detach().norm(dim=0)
        guess = sorted(int(i) for i in norms.argsort(descending=True)[: len(inst.truth["represented"])])
        _, cos = behaviour(inst.model)
        result = grade(FAM, {"represented": guess, "groups": groups_of(guess, cos)}, inst.truth)
        scores.append(result.score)
        kappas.append(result.breakdown["kappa"])
    assert np.mean(scores) <= 0.3, np.mean(scores)
    assert min(kappas) < 0.6, "column norms alone mislead"


@pytest.mark.parametrize("level", LEVELS)
def test_answers_vary_and_constant_answers_score_low(level: str) -> None:
    truths = [inst.truth for inst in cached_instances(FAM, range(N_SEEDS), level)]
    n = truths[0]["n"]
    assert len({str(t) for t in truths}) == N_SEEDS
    every = list(range(n))
    candidates = [
        {"represented": every, "groups": [every]},
        {"represented": every, "groups": []},
        {"represented": [], "groups": []},
        {"represented": every, "groups": [[i, i + 1] for i in range(0, n - 1, 2)]},
        {"represented": every[: n // 2], "groups": [every[: n // 2]]},
    ]
    best = max(float(np.mean([grade(FAM, c, t).score for t in truths])) for c in candidates)
    assert best <= 0.15, best


def test_grader() -> None:
    truth = cached_instance(FAM, 2, "medium").truth
    exact = {"represented": truth["represented"], "groups": truth["groups"]}
    assert grade(FAM, exact, truth).score == 0.99
    no_groups = grade(FAM, {"represented": truth["represented"], "groups": []}, truth)
    assert no_groups.score == pytest.approx(0.5) and no_groups.breakdown["kappa"] == pytest.approx(1.0)
    merged = [sorted(i for g in truth["groups"] for i in g)]
    assert grade(FAM, {"represented": truth["represented"], "groups": merged}, truth).score < 0.85
    for bad in ([1, 2], {"represented": [99], "groups": []}, {"represented": [1]}, {"represented": [], "groups": [3]},
                {"represented": [], "groups": "all"}, {"represented": [1], "groups": [], "x": 1}):  # fmt: skip
        result = grade(FAM, bad, truth)
        assert result.rejected and result.message, bad
    assert not grade(FAM, get_family(FAM).answer_example, truth).rejected
