"""Instance generation time per family and level (what a reset will pay before the sandbox).

    python bench/generation.py [--seeds 20] [--first-seed 50000] [--families copy-head,committee-circuit]

Prints mean, p50 and max seconds per instance over fresh seeds (torch threads as configured).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from mechsandbox.tasks import LEVELS, families


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=50_000)
    ap.add_argument("--families", default="", help="comma-separated task ids (default: every family)")
    args = ap.parse_args()
    wanted = {t.strip() for t in args.families.split(",") if t.strip()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.seeds} seeds per row")
    print(f"{'family':24} {'level':7} {'mean s':>7} {'p50 s':>7} {'max s':>7}")
    for fam in families():
        if wanted and fam.id not in wanted:
            continue
        for level in LEVELS:
            times = []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                t0 = time.perf_counter()
                fam.generate(seed, level)
                times.append(time.perf_counter() - t0)
            mean, p50 = statistics.mean(times), statistics.median(times)
            print(f"{fam.id:24} {level:7} {mean:7.3f} {p50:7.3f} {max(times):7.3f}", flush=True)


if __name__ == "__main__":
    main()
