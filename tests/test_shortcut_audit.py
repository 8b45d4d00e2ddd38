"""The shortcut audit (mechsandbox/evaluation/shortcuts.py) on every family and level: no strategy without the
interpretability a family names -- per-component weight statistics, composed-weights readings, a classifier trained
on other seeds, constant and probe-layout priors -- scores above 0.3 with the family's own grader.

Why here and for every family: the audit is how a new family proves it does not leak its answer (issue 16). It
runs on the first 40 seeds of each (family, level), the instances the seed sweeps already generated in this run
(tests/test_sweep_instances.py), so it costs the analysis only. ``bench/shortcut_audit.py`` prints the same table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAMILY_IDS, cached_instances
from mechsandbox.evaluation.shortcuts import CLASSES, EXEMPT, LIMIT, Audit, audit
from mechsandbox.tasks import LEVELS, get_family

N_SEEDS = 40
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("task_id", FAMILY_IDS)
@pytest.mark.parametrize("level", LEVELS)
def test_no_shortcut_scores_above_03(task_id: str, level: str) -> None:
    exempt = EXEMPT.get(task_id, ((), ""))[0]
    if set(exempt) == set(CLASSES):
        pytest.skip(f"exempt: {EXEMPT[task_id][1]}")
    torch.set_num_threads(1)  # small matrices: threads only contend with the other xdist worker
    found = audit(task_id, cached_instances(task_id, range(N_SEEDS), level))
    assert {f.cls for f in found} == set(CLASSES) - set(exempt)
    leaks = [f"{f.cls} {f.score:.3f} ({f.strategy})" for f in found if f.score > LIMIT]
    assert not leaks, f"{task_id}/{level}: " + "; ".join(leaks)


def test_every_exemption_is_stated_in_the_family_notes() -> None:
    notes = (REPO / "docs" / "TASKS.md").read_text()
    for task_id, (classes, _) in EXEMPT.items():
        get_family(task_id)  # a real family
        assert f"{task_id}" in notes and "shortcut audit" in notes, task_id
        assert set(classes) <= set(CLASSES)


def test_the_audit_finds_a_planted_leak() -> None:
    """The audit can fail: copy-head instances whose copy head gets a visibly larger OV (a weight statistic that
    names it) score high in the stats and classifier classes."""
    torch.set_num_threads(1)
    insts = cached_instances("copy-head", range(16), "easy")
    leaky = []
    for inst in insts:
        inst = type(inst)(**{**inst.__dict__})
        model = type(inst.model)(inst.model.cfg)
        model.load_state_dict(inst.model.state_dict())
        (lay, h), = inst.truth["heads"]
        with torch.no_grad():
            model.blocks[lay].attn.W_O[h] *= 5.0
        inst.model = model
        leaky.append(inst)
    found = {f.cls: f.score for f in Audit("copy-head", leaky).run(("stats", "classifier"))}
    assert found["stats"] >= 0.9 and found["classifier"] >= 0.9, found
    # and the untouched instances do not (the same seeds)
    clean = {f.cls: f.score for f in Audit("copy-head", insts).run(("stats",))}
    assert clean["stats"] <= LIMIT, clean
    assert np.isfinite(list(clean.values())).all()
