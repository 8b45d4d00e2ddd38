"""Seed-variation sweep (docs/CONTRACT.md, "Sizes and variation") over seeds 0..N-1 for every family and level.

Prints, per family and level: the share of seeds for which the most common answer is correct (rule:
<= max(10%, 2/|answer space|)), the best constant answer's mean score over the first 100 seeds
(rule: <= 0.15; set answers only -- the other answer kinds test their constant answers in
tests/test_<family>.py), and the mean generation time.

    python bench/seed_variation.py [--seeds 1000] [--tasks copy-head,...] [--levels easy,...]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from mechsandbox.answer_kind import AnswerKind
from mechsandbox.tasks import LEVELS, families, get_family
from tqdm import tqdm


def items(truth: dict) -> list | None:
    """The components of a set answer (heads, frequencies, indices); None for other answer kinds."""
    for key in ("heads", "frequencies", "indices"):
        if key in truth:
            return [tuple(x) if isinstance(x, list) else x for x in truth[key]]
    return None


def answer_key(truth: dict) -> str:
    """A canonical string of the answer, to count how often one answer is correct."""
    parts = items(truth)
    if parts is not None:
        return json.dumps(sorted(parts), default=list)
    fields = {
        AnswerKind.CELL: ("layer", "position"),
        AnswerKind.ROLES: ("roles",),
        AnswerKind.FEATURES_GROUPS: ("represented", "groups"),
        AnswerKind.BASIS: ("basis",),
    }[AnswerKind(truth["kind"])]
    return json.dumps([truth[f] for f in fields], sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--tasks", default=",".join(f.id for f in families()))
    ap.add_argument("--levels", default=",".join(LEVELS))
    args = ap.parse_args()
    print(f"{'family':24} {'level':7} {'seeds':>5} {'top answer share':>16} {'best constant (100)':>19} {'gen s':>7}")
    for task_id in args.tasks.split(","):
        fam = get_family(task_id)
        for level in args.levels.split(","):
            truths, t0 = [], time.perf_counter()
            for seed in tqdm(range(args.seeds), desc=f"{task_id}/{level}", leave=False):
                truths.append(fam.generate(seed, level).truth)
            gen = (time.perf_counter() - t0) / args.seeds
            top = Counter(answer_key(t) for t in truths).most_common(1)[0][1]
            first = truths[:100]
            if items(first[0]) is None:  # constant answers of the other kinds: the family's own test file
                print(f"{task_id:24} {level:7} {args.seeds:5d} {top / args.seeds:16.1%} {'(tests)':>19} {gen:7.3f}")
                continue
            comps = Counter(c for t in first for c in items(t))
            cands = [[c] for c in comps] + [[c for c, _ in comps.most_common(k)] for k in range(1, 7)]
            best = 0.0
            for cand in cands:
                answer = [list(c) if isinstance(c, tuple) else c for c in cand]
                best = max(best, sum(fam.grade(answer, t).score for t in first) / len(first))
            print(
                f"{task_id:24} {level:7} {args.seeds:5d} {top / args.seeds:16.1%} {best:19.3f} {gen:7.3f}", flush=True
            )


if __name__ == "__main__":
    main()
