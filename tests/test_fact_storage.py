"""fact-storage: the causal trace peaks at the planted cell (both corruptions), restoring the
residual plateaus, seeds vary the cell, weights do not give the layer away, and the cell grader."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from helpers import cached_instance, cached_instances
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.fact_storage.generator import N_SUBJ, trace

FAM = "fact-storage"
N_SEEDS = 100


def subject_end(tokens: torch.Tensor) -> tuple[int, int]:
    positions = (tokens[0] < N_SUBJ).nonzero()[:, 0]
    return int(positions.max()), len(positions)


@pytest.mark.parametrize("level", LEVELS)
def test_trace_peaks_at_the_planted_cell_and_the_residual_plateaus(level: str) -> None:
    for seed in range(4):
        inst = cached_instance(FAM, seed, level)
        tokens, targets, truth = inst.probe["tokens"], inst.probe["targets"], inst.truth
        end, m = subject_end(tokens)
        assert end == truth["position"]
        for shift in (3, 5, 8):  # replacements the generator never checked
            corrupt = tokens.clone()
            corrupt[:, end - m + 1 : end + 1] = (corrupt[:, end - m + 1 : end + 1] + shift) % N_SUBJ
            rec = trace(inst.model, tokens, corrupt, targets)
            assert int(rec.argmax()) == truth["layer"] * tokens.shape[1] + end, (seed, shift, rec)
        resid = trace(inst.model, tokens, corrupt, targets, site="resid_pre")
        plateau = resid[1 : truth["layer"] + 1, end]
        assert bool((plateau >= 0.9).all()), "restoring the residual recovers everything up to the fact layer"
        if level == "easy":
            assert torch.equal(inst.probe["corrupted_tokens"][:, : end - m + 1], tokens[:, : end - m + 1])
        else:
            assert "corrupted_tokens" not in inst.probe


@pytest.mark.parametrize("level", LEVELS)
def test_cells_vary_and_constant_answers_score_low(level: str) -> None:
    truths = [inst.truth for inst in cached_instances(FAM, range(N_SEEDS), level)]
    cells = Counter((t["layer"], t["position"]) for t in truths)
    assert cells.most_common(1)[0][1] <= 0.10 * N_SEEDS, cells.most_common(3)
    n_layers, n_pos = truths[0]["n_layers"], truths[0]["n_positions"]
    cells = [(lay, pos) for lay in range(n_layers) for pos in range(n_pos)]
    best = max(sum(grade(FAM, list(c), t).score for t in truths) / N_SEEDS for c in cells)
    assert best <= 0.15, best


@pytest.mark.parametrize("level", LEVELS)
def test_mlp_weight_statistics_do_not_give_the_layer_away(level: str) -> None:
    """Per-layer MLP statistics (norms of W_in, W_out, b_in, in both directions) pick the fact layer
    no more often than a constant layer choice does (chance among the possible layers + 0.15)."""
    insts = cached_instances(FAM, range(40), level)
    n_layers = insts[0].truth["n_layers"]
    stats = {
        "w_in": lambda mlp: float(mlp.W_in.norm()),
        "w_out": lambda mlp: float(mlp.W_out.norm()),
        "b_in": lambda mlp: float(mlp.b_in.norm()),
        "w_out_max": lambda mlp: float(mlp.W_out.norm(dim=1).max()),
    }
    constant = max(Counter(i.truth["layer"] for i in insts).values()) / len(insts)
    for name, stat in stats.items():
        for sign in (1, -1):
            hits = 0
            for inst in insts:
                values = [sign * stat(inst.model.blocks[lay].mlp) for lay in range(1, n_layers - 1)]
                hits += 1 + values.index(max(values)) == inst.truth["layer"]
            assert hits / len(insts) <= constant + 0.15, (name, sign, hits)


def test_cell_grader() -> None:
    truth = cached_instance(FAM, 0, "medium").truth
    lay, pos = truth["layer"], truth["position"]
    assert grade(FAM, {"layer": lay, "position": pos}, truth).score == 0.99
    assert grade(FAM, [lay, pos], truth).score == 0.99
    assert grade(FAM, {"layer": lay, "position": pos - 1}, truth).score == 0.3
    assert grade(FAM, {"layer": lay + 1, "position": pos}, truth).score == 0.3
    assert grade(FAM, {"layer": lay + 1, "position": pos + 1}, truth).score == 0.01
    for bad in ({"layer": 99, "position": 0}, {"layer": lay}, [lay], [lay, pos, 0], {"layer": True, "position": 1},
                {"layer": lay, "position": pos, "x": 1}, "L1P2", 3):  # fmt: skip
        result = grade(FAM, bad, truth)
        assert result.rejected and result.message, bad
    example = get_family(FAM).answer_example
    assert not grade(FAM, example, truth).rejected
    json.dumps(grade(FAM, [lay, pos], truth).breakdown)
