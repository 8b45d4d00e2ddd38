"""The seed sweeps' instances, generated in small chunks: each is well formed and its truth scores 0.99.

Why a file of its own: every family has a 100-seed sweep at every level (the seed-variation and
constant-answer rules, docs/CONTRACT.md), and generating them is most of the suite's CPU time; six slow
families generate their first 40 seeds and compare them with recorded truths (tests/sweep_truths.py), so
the default run builds 2,520 instances (3,600 with ``MECHSANDBOX_FULL_SWEEP=1``). One sweep is one test,
so the last sweep to start kept one pytest-xdist worker busy for minutes while the other sat idle. Here
the same instances are generated in chunks of ten seeds, as the first tests of the run
(tests/time_budget.json gives this file the largest budget), so both workers share the generation
evenly; the sweeps then load them from the run's cache.

What each chunk checks is real: the instance carries its family's version, level and seed, its truth
names an answer kind, and answering with the truth itself scores 0.99 under the family's grader.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import FAMILY_IDS, cached_instances, sweep_truths
from mechsandbox.answer_kind import AnswerKind
from mechsandbox.tasks import LEVELS, get_family
from sweep_truths import RECORDED_FAMILIES, checked_seeds

CHUNK = 10


ANSWER_FIELDS = {
    AnswerKind.INDICES: ("indices",),
    AnswerKind.FREQUENCIES: ("frequencies",),
    AnswerKind.HEADS: ("heads",),
    AnswerKind.HEADS_ROLES: ("heads", "roles"),
    AnswerKind.ROLES: ("roles",),
    AnswerKind.BASIS: ("basis",),
    AnswerKind.CELL: ("layer", "position"),
    AnswerKind.FEATURES_GROUPS: ("represented", "groups"),
}


def answer_from_truth(truth: dict[str, Any]) -> Any:
    """The answer a perfect agent sends, read off the truth record (one field bare, several as a dict)."""
    names = ANSWER_FIELDS[AnswerKind(truth["kind"])]
    return truth[names[0]] if len(names) == 1 else {name: truth[name] for name in names}


CHUNKS = [(t, lvl, start) for t in FAMILY_IDS for lvl in LEVELS for start in range(0, checked_seeds(t), CHUNK)]


@pytest.mark.parametrize(("task_id", "level", "start"), CHUNKS, ids=lambda v: str(v))
def test_sweep_chunk_is_well_formed_and_its_truth_scores_099(task_id: str, level: str, start: int) -> None:
    fam = get_family(task_id)
    seeds = range(start, start + CHUNK)
    for seed, inst in zip(seeds, cached_instances(task_id, seeds, level), strict=True):
        assert (inst.task_id, inst.level, inst.seed, inst.family_version) == (fam.id, level, seed, fam.family_version)
        grade = fam.grade(answer_from_truth(inst.truth), inst.truth, inst)
        assert (grade.score, grade.rejected) == (0.99, False), (seed, grade.message)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("task_id", RECORDED_FAMILIES)
def test_the_recorded_truths_are_the_generators(task_id: str, level: str) -> None:
    """The generated seeds (40, or 100 in the full run) equal tests/sweep_truths.json's, and the record is whole."""
    truths = sweep_truths(task_id, level)
    assert len(truths) == 100 and all(t["kind"] == truths[0]["kind"] for t in truths)
