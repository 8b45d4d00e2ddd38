"""The shortcut audit, full size: every family and level, the best score of each strategy class.

    python bench/shortcut_audit.py [--seeds 40] [--families a,b] [--levels easy,hard] [--cache DIR]

Classes and exemptions: mechsandbox/evaluation/shortcuts.py. A figure above 0.3 is a shortcut: the family's answer
is reachable without the interpretability it names. ``sweep`` is the generic single-ablation sweep
(every head, or every MLP cell, zero-ablated once; cut at the largest gap): interpretability, so not a shortcut, but
a hard level that falls to it does not need the technique it names. Instances are seeds 0..N-1 (the train split);
``--cache`` keeps them on disk between runs (they are regenerated when a family's version changes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from mechsandbox.evaluation.shortcuts import CLASSES, EXEMPT, LIMIT, audit, sweep_score
from mechsandbox.tasks import LEVELS, families, get_family


def instances(task_id: str, level: str, n: int, cache: Path | None) -> list:
    fam = get_family(task_id)
    out = []
    for seed in range(n):
        path = cache / f"{fam.id}-v{fam.family_version}-{level}-{seed}.pt" if cache else None
        if path is not None and path.exists():
            out.append(torch.load(path, weights_only=False))  # our own files
            continue
        inst = fam.generate(seed, level)
        if path is not None:
            torch.save(inst, path)
        out.append(inst)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--families", default=",".join(f.id for f in families()))
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args()
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    print(f"{args.seeds} seeds per row; strategy classes {', '.join(CLASSES)}; limit {LIMIT}")
    print(f"{'family':22} {'level':6} " + " ".join(f"{c:>10}" for c in CLASSES) + f" {'sweep':>6}  worst strategy")
    for task_id in args.families.split(","):
        fam = get_family(task_id)
        for level in args.levels.split(","):
            t0 = time.perf_counter()
            if set(EXEMPT.get(fam.id, ((), ""))[0]) == set(CLASSES):
                cells = " ".join(f"{'exempt':>10}" for _ in CLASSES) + f" {'-':>6}"
                print(f"{fam.id:22} {level:6} {cells}  {EXEMPT[fam.id][1]}")
                continue
            insts = instances(fam.id, level, args.seeds, args.cache)
            found = {f.cls: f for f in audit(fam.id, insts)}
            cells = " ".join(f"{found[c].score:10.3f}" if c in found else f"{'exempt':>10}" for c in CLASSES)
            sweep = sweep_score(fam.id, insts)
            cells += f" {sweep:6.3f}" if sweep is not None else f" {'-':>6}"
            worst = max(found.values(), key=lambda f: f.score, default=None)
            note = f"{worst.cls}: {worst.strategy}" if worst else EXEMPT[fam.id][1]
            flag = " !" if worst and worst.score > LIMIT else ""
            print(f"{fam.id:22} {level:6} {cells}  {note}{flag} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
