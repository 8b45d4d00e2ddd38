"""head-roles: every head's detection scores match its planted role with a margin, induction rests on
K-composition, roles move with the seed, weight statistics do not predict roles, and the grader."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from baselines import head_stats
from helpers import cached_instance, cached_instances
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.head_roles.generator import ROLES, detect_roles, role_scores

FAM = "head-roles"
N_SEEDS = 100


@pytest.mark.parametrize("level", LEVELS)
def test_detection_scores_match_the_planted_roles(level: str) -> None:
    for seed in range(6):
        inst = cached_instance(FAM, seed, level)
        roles, scores = detect_roles(inst.model, inst.probe["tokens"])
        for (layer, head), role in roles.items():
            assert inst.truth["roles"][f"L{layer}H{head}"] == role, (seed, layer, head, scores[(layer, head)])
            values = sorted(scores[(layer, head)].values())
            assert values[-2] <= 0.25 and (role == "none" or values[-1] >= 0.55)
        per_layer = [Counter(r for h, r in inst.truth["roles"].items() if h.startswith(f"L{lay}")) for lay in (0, 1)]
        assert all(c.most_common(1)[0][1] >= 2 for c in per_layer), "a redundant pair in each layer"
        assert "induction" not in per_layer[0] and "induction" in per_layer[1]


def test_induction_heads_rest_on_a_layer0_head() -> None:
    inst = cached_instance(FAM, 3, "medium")
    tokens, model = inst.probe["tokens"], inst.model
    induction = [int(h.split("H")[1]) for h, r in inst.truth["roles"].items() if r == "induction"]
    patterns: dict[int, torch.Tensor] = {}
    for head in range(model.cfg.n_heads):

        def zero(z, hook, head=head):
            z[:, :, head] = 0.0
            return z

        def keep(pattern, hook, head=head):
            patterns[head] = pattern

        hooks = [("blocks.0.attn.hook_z", zero), ("blocks.1.attn.hook_pattern", keep)]
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=hooks)
    drops = [float(role_scores(patterns[h])["induction"][induction].mean()) for h in range(model.cfg.n_heads)]
    assert min(drops) < 0.2 < max(drops), "exactly the previous-token head that feeds the induction heads matters"


@pytest.mark.parametrize("level", LEVELS)
def test_roles_vary_and_constant_answers_score_low(level: str) -> None:
    truths = [inst.truth for inst in cached_instances(FAM, range(N_SEEDS), level)]
    heads = sorted(truths[0]["roles"])
    mode = {h: Counter(t["roles"][h] for t in truths).most_common(1)[0][0] for h in heads}
    candidates = [mode] + [{h: role for h in heads} for role in ROLES]
    for lay in (0, 1):  # one role for a layer, the per-position mode for the other
        for role in ROLES:
            candidates.append({h: role if h.startswith(f"L{lay}") else mode[h] for h in heads})
    best = max(sum(grade(FAM, c, t).score for t in truths) / N_SEEDS for c in candidates)
    assert best <= 0.15, best
    assert len({tuple(sorted(t["roles"].items())) for t in truths}) == N_SEEDS


@pytest.mark.parametrize("level", LEVELS)
def test_weight_statistics_do_not_predict_roles(level: str) -> None:
    """A nearest-centroid classifier on per-head weight statistics (norms, ranks of QK/OV), fitted on
    20 seeds and tested on 20 others, scores <= 0.3 chance-corrected."""

    def rows(seed: int) -> list[tuple[list[float], str]]:
        inst = cached_instance(FAM, seed, level)
        stats = head_stats(inst)
        return [([*stats[h].values()], inst.truth["roles"][f"L{h[0]}H{h[1]}"]) for h in sorted(stats)]

    train = [r for seed in range(20) for r in rows(seed)]
    x = torch.tensor([v for v, _ in train])
    mean, std = x.mean(0), x.std(0) + 1e-9
    centroids = {
        role: ((x[[i for i, (_, r) in enumerate(train) if r == role]] - mean) / std).mean(0)
        for role in ROLES
        if any(r == role for _, r in train)
    }
    scores = []
    for seed in range(20, 40):
        inst = cached_instance(FAM, seed, level)
        answer = {}
        for (values, _), head in zip(rows(seed), sorted(head_stats(inst)), strict=True):
            z = (torch.tensor(values) - mean) / std
            answer[f"L{head[0]}H{head[1]}"] = min(centroids, key=lambda r: float((z - centroids[r]).norm()))
        scores.append(grade(FAM, answer, inst.truth).score)
    assert sum(scores) / len(scores) <= 0.3, scores


def test_roles_grader() -> None:
    truth = cached_instance(FAM, 0, "easy").truth
    assert grade(FAM, truth["roles"], truth).score == 0.99
    half = dict(list(truth["roles"].items())[: len(truth["roles"]) // 2])
    partial = grade(FAM, half, truth).score
    assert 0.3 < partial < 0.6
    wrong = {h: "none" if r != "none" else "local" for h, r in truth["roles"].items()}
    assert grade(FAM, wrong, truth).score == 0.01
    for bad in ([[0, 1]], {"L0H0": "copy"}, {"L9H0": "none"}, {"X": "none"}, "none", 3, {"L0H0": 1}):
        result = grade(FAM, bad, truth)
        assert result.rejected and result.message, bad
    assert not grade(FAM, get_family(FAM).answer_example, truth).rejected
