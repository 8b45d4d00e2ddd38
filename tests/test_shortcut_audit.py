"""The shortcut audit (mechsandbox/evaluation/shortcuts.py) on every family and level: no strategy without the
interpretability a family names -- per-component weight statistics, composed-weights readings, a classifier trained
on other seeds, constant and probe-layout priors -- scores above 0.3 with the family's own grader.

Why here and for every family: the audit is how a new family proves it does not leak its answer (issue 16). It
runs on the first 40 seeds of each (family, level) (80 for ``MORE_SEEDS``), the instances the seed sweeps already
generated in this run (tests/test_sweep_instances.py), so it costs the analysis only (and the generation of the
extra seeds). ``bench/shortcut_audit.py`` prints the same table.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from helpers import FAMILY_IDS, cached_instances
from mechsandbox.evaluation.shortcuts import CLASSES, EXEMPT, LIMIT, Audit, audit, circuit_overlaps, sweep_score
from mechsandbox.tasks import LEVELS, get_family

N_SEEDS = 40
# Families audited on more seeds: those whose 40-seed figure sits within the audit's sampling noise of the limit.
# copy-head 5: a logistic per layer on the composed readings scored 0.304 on seeds 0-39 at medium and 0.181 on 0-79
# (easy / hard 0.206 / 0.181 on 0-79); a learner trained on 20 seeds and the best of many strategies overshoot.
MORE_SEEDS = {"copy-head": 80}

# Findings still open, per (family, class), with why: their score is reported, not held to the limit, and an entry
# that is clearly fixed at some level (<= LIMIT - 0.1 there) fails the test until it is removed or narrowed. (Checked
# inside the main test, on the audit it already ran: a second audit of these families cost about 100 s.)
OPEN: dict[tuple[str, str], str] = {}
# (head-roles 6's composed class, the cross-head overlaps of heads planted with the same rule: 0.45 / 0.40 / 0.51, was
# the last entry; closed by version 7's private key copies, docs/TASKS.md.)
# An OPEN finding limited to some levels: at the others the class is held to the limit as usual. (induction-circuit
# 7's composed class was open at hard only, 0.351: closed by version 8's decoys, 0.228.)
OPEN_LEVELS: dict[tuple[str, str], tuple[str, ...]] = {}
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("task_id", FAMILY_IDS)
@pytest.mark.parametrize("level", LEVELS)
def test_no_shortcut_scores_above_03(task_id: str, level: str) -> None:
    exempt = EXEMPT.get(task_id, ((), ""))[0]
    if set(exempt) == set(CLASSES):
        pytest.skip(f"exempt: {EXEMPT[task_id][1]}")
    torch.set_num_threads(1)  # small matrices: threads only contend with the other xdist worker
    found = audit(task_id, cached_instances(task_id, range(MORE_SEEDS.get(task_id, N_SEEDS)), level))
    assert {f.cls for f in found} == set(CLASSES) - set(exempt)
    is_open = {f.cls: (task_id, f.cls) in OPEN and level in OPEN_LEVELS.get((task_id, f.cls), LEVELS) for f in found}
    leaks = [f"{f.cls} {f.score:.3f} ({f.strategy})" for f in found if f.score > LIMIT and not is_open[f.cls]]
    assert not leaks, f"{task_id}/{level}: " + "; ".join(leaks)
    # an OPEN entry is a known leak, not a permanent exemption: once it is closed, it must go
    fixed = [f"{f.cls} {f.score:.3f}" for f in found if is_open[f.cls] and f.score <= LIMIT - 0.1]
    assert not fixed, f"{task_id}/{level}: {fixed} look fixed: remove or narrow the OPEN entry"


def test_every_exemption_is_stated_in_the_family_notes() -> None:
    notes = (REPO / "docs" / "TASKS.md").read_text()
    section = notes[notes.index("## Shortcut audit") :]
    table = section[section.index("Exemptions") : section.index("A new family")]
    for task_id, (classes, _) in EXEMPT.items():
        get_family(task_id)  # a real family
        row = next(line for line in table.splitlines() if task_id in line)
        assert set(classes) <= set(CLASSES)
        assert ("| all |" in row) == (set(classes) == set(CLASSES)), row
        assert all(f"`{c}`" in row for c in classes) or "| all |" in row, row


@pytest.mark.parametrize("level", ["hard"])
def test_committee_hard_needs_more_than_single_ablations(level: str) -> None:
    """committee-circuit's hard level names redundancy: backups show only once their primary is ablated, so the
    generic single-ablation sweep (either metric, cut at the largest gap) scores at most 0.5 there."""
    torch.set_num_threads(1)
    score = sweep_score("committee-circuit", cached_instances("committee-circuit", range(N_SEEDS), level))
    assert score is not None and score <= 0.5, score


def test_the_audit_finds_a_planted_leak() -> None:
    """The audit can fail: multiplication-neuron instances whose true unit gets a visibly larger output column (a
    weight statistic that names it) score high in the stats and classifier classes; the same seeds untouched do not."""
    torch.set_num_threads(1)
    insts = cached_instances("multiplication-neuron", range(16), "easy")
    leaky = []
    for inst in insts:
        model = copy.deepcopy(inst.model)
        (unit,) = inst.truth["indices"]
        with torch.no_grad():
            model.out.weight[:, unit] *= 5.0
        leaky.append(dataclasses.replace(inst, model=model))
    found = {f.cls: f.score for f in Audit("multiplication-neuron", leaky).run(("stats", "classifier"))}
    assert found["stats"] >= 0.9 and found["classifier"] >= 0.9, found
    clean = {f.cls: f.score for f in Audit("multiplication-neuron", insts).run(("stats", "classifier"))}
    assert max(clean.values()) <= LIMIT, clean


def test_circuit_overlaps_count_shared_entries_through_rotations() -> None:
    """circuit_overlaps reads what two heads' circuits share whatever basis each head's factors are in: heads built
    from one set of (query, key) pairs, each in its own head-dim rotation and with Q/K rescaled, overlap fully; a
    head with half of those pairs overlaps sqrt(1/2); a head on other dims not at all (head-roles 6's finding)."""
    gen = torch.Generator().manual_seed(0)
    d, dh = 24, 8

    def head(pairs: list[tuple[int, int]], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = torch.zeros(d, dh, dtype=torch.float64), torch.zeros(d, dh, dtype=torch.float64)
        for e, (i, j) in enumerate(pairs):
            q[i, e], k[j, e] = 1.0, 1.0
        rot = torch.linalg.qr(torch.randn(dh, dh, generator=gen, dtype=torch.float64))[0]
        return q @ rot * scale, k @ rot / scale

    full = [(i, i + 8) for i in range(8)]
    heads = [head(full, 1.0), head(full, 3.0), head(full[:4], 1.0), head([(16 + i, i) for i in range(8)], 1.0)]
    wq, wk = torch.stack([h[0] for h in heads]), torch.stack([h[1] for h in heads])
    wv, wo = wq.clone(), wk.mT.clone()
    rows = circuit_overlaps(wq, wk, wv, wo, [1, 1, 2, 2])
    assert abs(rows[0]["composed:qk_overlap.max"] - 1.0) < 1e-9
    assert abs(rows[2]["composed:qk_overlap.max"] - 0.5**0.5) < 1e-9
    assert rows[3]["composed:qk_overlap.max"] < 1e-9
    assert abs(rows[0]["composed:qk_overlap.same_layer"] - 1.0) < 1e-9
    assert abs(rows[0]["composed:qk_overlap.other_layer"] - 0.5**0.5) < 1e-9
