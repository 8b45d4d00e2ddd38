"""The red team's weights-only reading of head-roles (evaluation/redteam_head_roles.py), scored per level.

    OMP_NUM_THREADS=1 python bench/redteam_head_roles.py [--seeds 40-59] [--levels easy,medium,hard]

Prints the mean and the minimum chance-corrected score per level (2026-12-04, head-roles 7: 0.99 / 0.99 / 0.99)."""

from __future__ import annotations

import argparse

from mechsandbox.evaluation.redteam_head_roles import read_roles
from mechsandbox.tasks import LEVELS, get_family, grade


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="40-59", help="a range a-b (inclusive)")
    ap.add_argument("--levels", default=",".join(LEVELS))
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split("-"))
    fam = get_family("head-roles")
    print(f"head-roles v{fam.family_version}, seeds {lo}-{hi}")
    for level in args.levels.split(","):
        scores = []
        for seed in range(lo, hi + 1):
            inst = fam.generate(seed, level)
            scores.append(grade(fam.id, read_roles(inst.model), inst.truth).score)
        print(f"{level:7} mean {sum(scores) / len(scores):.3f}  min {min(scores):.3f}  ({len(scores)} seeds)")


if __name__ == "__main__":
    main()
