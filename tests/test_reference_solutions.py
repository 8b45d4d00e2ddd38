"""Every family's reference solution (the scripted baseline) solves fresh seeds at every level,
also after 1e-4 dense weight noise, and fits in half of the step budget."""

from __future__ import annotations

import pytest
from helpers import FAMILY_IDS, cached_instance, run_reference
from mechsandbox.tasks import LEVELS, get_family

FRESH_SEEDS = (1_000_003, 2_000_017)


@pytest.mark.parametrize("task_id", FAMILY_IDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("noise", [0.0, 1e-4])
def test_reference_scores_at_least_095(task_id: str, level: str, noise: float) -> None:
    fam = get_family(task_id)
    for seed in FRESH_SEEDS:
        inst = cached_instance(task_id, seed, level)  # shared by the two noise levels
        answer = run_reference(fam, inst, noise=noise, noise_seed=seed)
        grade = fam.grade(answer, inst.truth, inst)  # measured on the clean model
        assert not grade.rejected, grade.message
        assert grade.score >= 0.95, f"{task_id}/{level}/seed {seed}: {grade.score} ({grade.message})"


@pytest.mark.parametrize("task_id", FAMILY_IDS)
def test_reference_fits_in_half_the_budget(task_id: str) -> None:
    fam = get_family(task_id)
    for level in LEVELS:
        assert len(fam.reference) <= fam.max_steps[level] // 2
