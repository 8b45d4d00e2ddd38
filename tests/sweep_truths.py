"""The recorded truths of the slow families' seed sweeps (``tests/sweep_truths.json``), and their recorder.

Why: the seed-variation and constant-answer rules are stated over 100 seeds per family and level (docs/CONTRACT.md).
For the six slow families below (the transformers and fact-storage), generating 100 seeds x 3 levels took most of
the suite's time on the 2-core CI machine (docs/PERFORMANCE.md, "Test suite"), and checking the rules on fewer seeds
is not the same check: the best constant answer is chosen in-sample, so a smaller sample biases it upwards. So the
truths of seeds 0..99 are recorded here, the suite regenerates the first ``CHECKED`` seeds of each (family, level)
and compares them with the record, bit for bit in canonical JSON, and computes the statistics over the recorded 100.
A generator change shows as a mismatch (or a missing family version) until the record is made again, as ``gen-art
--check`` does for the canonical artifacts. ``MECHSANDBOX_FULL_SWEEP=1`` regenerates all 100.

Record again (both cores: 18 min 54 s here on 2026-12-02, before issue 20's faster generators), or only the
families whose version changed (``--families committee-circuit induction-circuit``: the others' records are kept)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/sweep_truths.py --record [--families TASK_ID ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("sweep_truths.json")
RECORDED_FAMILIES = (
    "induction-circuit",
    "committee-circuit",
    "copy-head",
    "modular-addition",
    "fact-storage",
    "head-roles",
)
SEEDS = 100  # the contract's count
CHECKED = 40  # seeds regenerated in the default run (the shortcut audit's seeds: generated anyway)
FULL_SWEEP_ENV = "MECHSANDBOX_FULL_SWEEP"  # "1": regenerate and compare all 100


def key(task_id: str, level: str, facts: bool = False) -> str:
    """The record's key of a (family version, level): its truths, or (``facts``) its probe facts."""
    from mechsandbox.tasks import get_family

    fam = get_family(task_id)
    return f"{fam.id}/v{fam.family_version}/{level}" + ("/probe" if facts else "")


def subject_span(tokens: Any) -> tuple[int, int]:
    """fact-storage: the first and last position of the subject in the first probe row."""
    from mechsandbox.tasks.fact_storage.generator import N_SUBJ

    positions = (tokens[0] < N_SUBJ).nonzero()[:, 0]
    return int(positions.min()), int(positions.max())


# What a family's own tests read off the probe of every swept seed, beyond the truth: recorded beside the truths
# (under ``key(..., facts=True)``) and checked the same way, so those tests need not generate all 100 seeds either.
PROBE_FACTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "fact-storage": lambda inst: {"subject_span": list(subject_span(inst.probe["tokens"]))},
}


def canonical(truth: dict[str, Any]) -> str:
    return json.dumps(truth, sort_keys=True, default=str)


def checked_seeds(task_id: str) -> int:
    """Seeds the suite generates for ``task_id``: all 100 unless the family's truths are recorded."""
    from mechsandbox.tasks import get_family

    if os.environ.get(FULL_SWEEP_ENV) == "1" or get_family(task_id).id not in RECORDED_FAMILIES:
        return SEEDS
    return CHECKED


@functools.cache
def _record() -> dict[str, list[dict[str, Any]]]:
    return json.loads(RECORD.read_text())  # read once per process (every variation test asks for it)


def recorded(task_id: str, level: str, facts: bool = False) -> list[dict[str, Any]]:
    """The 100 recorded truths (or probe facts); a clear failure when the record lacks this family version."""
    found = _record().get(key(task_id, level, facts))
    if found is None or len(found) != SEEDS:
        raise AssertionError(f"{RECORD.name} has no {SEEDS} records for {key(task_id, level, facts)}: record them "
                             f"again (python tests/sweep_truths.py --record)")  # fmt: skip
    return found


def _truths(job: tuple[str, str]) -> list[tuple[str, list[dict[str, Any]]]]:
    from mechsandbox.tasks import get_family

    task_id, level = job
    fam = get_family(task_id)
    insts = [fam.generate(seed, level) for seed in range(SEEDS)]
    out = [(key(task_id, level), [json.loads(canonical(inst.truth)) for inst in insts])]
    if fam.id in PROBE_FACTS:
        out.append((key(task_id, level, True), [json.loads(canonical(PROBE_FACTS[fam.id](i))) for i in insts]))
    return out


def record_all(jobs: int, task_ids: tuple[str, ...] = RECORDED_FAMILIES) -> None:
    """Record ``task_ids`` again; the other families' records are kept, and records of retired family versions
    are dropped."""
    from mechsandbox.tasks import LEVELS

    unknown = sorted(set(task_ids) - set(RECORDED_FAMILIES))
    if unknown:
        raise SystemExit(f"not recorded families: {', '.join(unknown)} (recorded: {', '.join(RECORDED_FAMILIES)})")
    work = [(t, lvl) for t in task_ids for lvl in LEVELS]
    current = {key(t, lvl, facts) for t in RECORDED_FAMILIES for lvl in LEVELS for facts in (False, True)}
    results = {k: v for k, v in (json.loads(RECORD.read_text()) if RECORD.exists() else {}).items() if k in current}
    with ProcessPoolExecutor(jobs) as pool:
        for records in pool.map(_truths, work):
            results.update(records)
    RECORD.write_text(json.dumps(results, sort_keys=True, indent=0) + "\n")
    print(f"wrote {RECORD} ({len(results)} family levels x {SEEDS} seeds; recorded now: {', '.join(task_ids)})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="regenerate every recorded truth and write the file")
    parser.add_argument("--families", nargs="+", default=list(RECORDED_FAMILIES), metavar="TASK_ID",
                        help="record only these families (the others' records are kept)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not args.record:
        parser.print_help()
        sys.exit(2)
    record_all(args.jobs, tuple(args.families))
