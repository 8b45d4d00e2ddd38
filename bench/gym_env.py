"""``MechSandbox/HeadDiscovery-v0`` (issue 23): the exact greedy oracle and a uniformly random masked policy, per
family and level over 20 fresh seeds, and the environment's cost per reset and per step.

    OMP_NUM_THREADS=1 python bench/gym_env.py [--seeds 20]

Precision / recall / Jaccard of the picks against the true heads (budget: the true set's size, as the
environment's default). The random policy picks that many distinct heads uniformly (its expected precision is
|truth| / heads). Times: ``reset`` (it generates an instance) and ``step`` (a pick's ablations), medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mechsandbox.gym import HEAD_SET_FAMILIES, HeadDiscoveryEnv, Probe, greedy_oracle, pick_scores
from mechsandbox.tasks import LEVELS, generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'family':18} {'level':6} {'oracle P/R/J':>16} {'min P':>6} {'random P/R':>11} {'reset ms':>9} "
          f"{'step ms':>8}")  # fmt: skip
    for task in HEAD_SET_FAMILIES:
        for level in LEVELS:
            oracle, random = [], []
            for seed in range(args.seeds):
                instance = generate(task, 9000 + seed, level)
                truth = Probe(instance).truth
                scores = pick_scores(greedy_oracle(instance), truth)
                oracle.append((scores["precision"], scores["recall"], scores["jaccard"]))
                heads = [(a, b) for a in range(instance.model.cfg.n_layers) for b in range(instance.model.cfg.n_heads)]
                picked = [heads[i] for i in rng.choice(len(heads), len(truth), replace=False)]
                chance = pick_scores(picked, truth)
                random.append((chance["precision"], chance["recall"]))
            env = HeadDiscoveryEnv(tasks=[task], level=level, budget=8)
            resets, steps = [], []
            for seed in range(5):
                started = time.perf_counter()
                _, info = env.reset(seed=seed)
                resets.append(time.perf_counter() - started)
                for action in np.flatnonzero(info["action_mask"])[:8]:
                    started = time.perf_counter()
                    env.step(int(action))
                    steps.append(time.perf_counter() - started)
            o, r = np.mean(oracle, axis=0), np.mean(random, axis=0)
            print(f"{task:18} {level:6} {o[0]:5.2f}/{o[1]:4.2f}/{o[2]:4.2f} {min(p for p, _, _ in oracle):6.2f} "
                  f"{r[0]:5.2f}/{r[1]:4.2f} {statistics.median(resets) * 1e3:9.0f} "
                  f"{statistics.median(steps) * 1e3:8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
